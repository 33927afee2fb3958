"""Writes a tiny llama-architecture GGUF model whose answer is always the same sentence.

Run with the Python of the llama-cpp-python environment (it has `gguf` and `numpy`):

    python tests/llamacpp/tiny_model.py out.gguf

The vocabulary is byte-level (one token per byte, and `▁` for a space), so a prompt costs about
one token per character. Every block's weights are zero, so the residual stream is the embedding
of the last token alone: a one-hot vector. The output matrix then makes the model a bigram table
that, from any token, spells REPLY and then stops; greedy or not, the answer is deterministic.
The chat template is strict the way Llama-2, Mistral and Gemma templates are: it raises on the
role orders they refuse (see TEMPLATE); and it renders the request's tools as JSON after the system
message, the way Qwen's and Llama-3's templates do, so they cost their tokens in the window.

`--chatml` writes the variant llama.cpp's own server runs (tests/llamacpp/llama_server.py): a
ChatML template in Qwen3-Coder's tool-call format with `<think>` reasoning (CHATML_TEMPLATE), which
llama-server recognises and parses. When tools are offered and the user spoke last, its
generation prompt ends in `<think>`, and from that token the model thinks and calls `get_time`
(THINK_AND_CALL, a few whole-string tokens); after the tool's result, or without tools, it says
REPLY. So a tool round trip, with its reasoning, is the server's own parsing of a real generation.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy and gguf are the tier's: the tests import this module's constants only
    import numpy as np

REPLY = "Sure thing."  # no character twice: each has exactly one successor
N_EMBD = 264  # at least the vocabulary size, for one-hot embeddings; 4 heads of 66
N_HEAD = 4
N_FF = 32
N_LAYERS = 2
CONTEXT_LENGTH = 4096
LOGIT = 8.0  # times sqrt(N_EMBD) after the RMS norm: a margin no sampler crosses

UNK, BOS, EOS = 0, 1, 2
FIRST_BYTE = 3
SPACE = FIRST_BYTE + 256  # the "▁" piece SentencePiece turns spaces into

TOOL = "get_time"  # the tool the --chatml model calls (gateway doctor's probe tool), with ARGUMENTS
ARGUMENTS = {"timezone": "Europe/Oslo"}
THOUGHT = "Checking the clock."
# What the --chatml model says after its generation prompt's `<think>`: each piece one token, so
# the chain has no token twice. Qwen3-Coder's format, exactly as llama-server's grammar takes it.
THINK_AND_CALL = [
    THOUGHT,
    "\n</think>\n\n",
    f"<tool_call>\n<function={TOOL}>\n",
    "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in ARGUMENTS.items()),
    "</function>\n</tool_call>",
]
CHATML_SPECIAL = ["<|im_start|>", "<|im_end|>", "<think>"]  # matched whole in a prompt

TEMPLATE = """\
{%- if messages[0]['role'] == 'system' -%}
  {%- set system = messages[0]['content'] -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set system = none -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- set ns = namespace(previous='', had_calls=false, open=[]) -%}
{{- bos_token -}}
{%- if system is not none -%}[system]
{{ system }}
{% endif -%}
{%- if tools -%}[tools]
{% for tool in tools -%}
{{ tool | tojson }}
{% endfor -%}
{%- endif -%}
{%- for message in turns -%}
  {%- if message['content'] is none -%}
    {{- raise_exception('messages: content must be a string, got null (' ~ message['role'] ~ ')') -}}
  {%- endif -%}
  {%- if message['role'] == 'system' -%}
    {{- raise_exception('System message is only supported as the first message') -}}
  {%- elif message['role'] == 'tool' -%}
    {%- if not ns.open or ns.open[0] != message['tool_call_id'] -%}
      {{- raise_exception('A tool message must follow the assistant message with its tool call, in call order') -}}
    {%- endif -%}
    {%- set ns.open = ns.open[1:] -%}
[tool {{ message['tool_call_id'] }}]
{{ message['content'] }}
{% else -%}
    {%- if ns.open -%}
      {{- raise_exception('Tool calls must be answered by tool messages before the next message') -}}
    {%- endif -%}
    {%- if loop.first and message['role'] != 'user' -%}
      {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
    {%- endif -%}
    {%- if message['role'] == ns.previous and not (message['role'] == 'assistant' and ns.had_calls) -%}
      {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
    {%- endif -%}
[{{ message['role'] }}]
{{ message['content'] }}
{% for call in message['tool_calls'] or [] -%}
[call {{ call['id'] }}] {{ call['function']['name'] }}({{ call['function']['arguments'] }})
{% set ns.open = ns.open + [call['id']] -%}
{% endfor -%}
    {%- set ns.previous = message['role'] -%}
    {%- set ns.had_calls = (message['tool_calls'] or []) | length > 0 -%}
  {%- endif -%}
{%- endfor -%}
{%- if ns.open -%}
  {{- raise_exception('Tool calls must be answered by tool messages') -}}
{%- endif -%}
{%- if add_generation_prompt -%}
  {%- if ns.previous == 'assistant' and not ns.had_calls and turns[-1]['role'] != 'tool' -%}
    {{- raise_exception('The last message must not be the assistant\\'s when a reply is asked for') -}}
  {%- endif -%}
[assistant]
{% endif -%}
"""


def byte_token(byte: int) -> int:
    return FIRST_BYTE + byte


# The --chatml variant's template: ChatML with Qwen3-Coder's tool calls and tool responses and
# `<think>` reasoning, which llama-server recognises by these markers and parses. Strict like
# Qwen's: a tool message must answer an open call, and calls must be answered before anything else.
# The generation prompt ends in `<think>` when tools are offered and the user spoke last.
CHATML_TEMPLATE = """\
{%- if messages[0].role == 'system' -%}
  {%- set system = messages[0].content -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set system = '' -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- if system or tools -%}
<|im_start|>system
{{ system }}
{%- if tools %}

# Tools
<tools>
{% for tool in tools -%}
{{ tool.function.name if tool.function is defined else tool.name }}: {{ tool | tojson }}
{% endfor -%}
</tools>
Call a tool like this:
<tool_call>
<function=NAME>
<parameter=KEY>
VALUE
</parameter>
</function>
</tool_call>
{%- endif %}<|im_end|>
{% endif -%}
{%- set ns = namespace(previous='', open=0) -%}
{%- for message in turns -%}
  {%- if message.role == 'system' -%}
    {{- raise_exception('System message is only supported as the first message') -}}
  {%- elif message.role == 'tool' -%}
    {%- if ns.open == 0 -%}
      {{- raise_exception('A tool message must follow the assistant message with its tool call') -}}
    {%- endif -%}
    {%- set ns.open = ns.open - 1 -%}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else -%}
    {%- if ns.open > 0 -%}
      {{- raise_exception('Tool calls must be answered by tool messages before the next message') -}}
    {%- endif -%}
    {%- if message.role == 'assistant' -%}
<|im_start|>assistant
{% if message.reasoning_content is string and message.reasoning_content -%}
<think>
{{ message.reasoning_content }}
</think>

{% endif -%}
{%- if message.content is string %}{{ message.content }}{% endif -%}
{%- for call in message.tool_calls or [] -%}
{%- set function = call.function if call.function is defined else call %}
<tool_call>
<function={{ function.name }}>
{% if function.arguments is mapping -%}
{%- for key, value in function.arguments | items -%}
<parameter={{ key }}>
{{ value if value is string else value | tojson }}
</parameter>
{% endfor -%}
{%- else -%}
{{ function.arguments }}
{% endif -%}
</function>
</tool_call>
{%- set ns.open = ns.open + 1 -%}
{%- endfor -%}
<|im_end|>
{% else -%}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif -%}
  {%- endif -%}
  {%- set ns.previous = message.role -%}
{%- endfor -%}
{%- if ns.open > 0 -%}
  {{- raise_exception('Tool calls must be answered by tool messages') -}}
{%- endif -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if tools and ns.previous == 'user' %}<think>{% endif -%}
{%- endif -%}
"""


def vocabulary(chatml: bool = False) -> tuple[list[str], list[int]]:
    from gguf import TokenType

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256 + [TokenType.NORMAL]
    if chatml:  # the prompt's markers whole, and the pieces the model answers with (text when shown)
        tokens += CHATML_SPECIAL + THINK_AND_CALL
        types += [TokenType.CONTROL] * len(CHATML_SPECIAL) + [TokenType.NORMAL] * len(THINK_AND_CALL)
    return tokens, [int(t) for t in types]


def bigram_output(tokens: list[str], n_embd: int) -> np.ndarray:
    """output.weight (n_vocab rows of n_embd): from every token the next is REPLY's first
    character, except inside REPLY, which continues it and ends with EOS; and, in the --chatml
    vocabulary, from `<think>` the chain THINK_AND_CALL, which ends with EOS."""
    import numpy as np

    n_vocab = len(tokens)
    chain = [byte_token(b) for b in REPLY.encode()]
    successor = {token: chain[0] for token in range(n_vocab)}
    successor.update(zip(chain, chain[1:] + [EOS], strict=True))
    if "<think>" in tokens:
        calls = [tokens.index("<think>")] + [tokens.index(piece) for piece in THINK_AND_CALL]
        successor.update(zip(calls, calls[1:] + [EOS], strict=True))
    output = np.zeros((n_vocab, n_embd), dtype=np.float32)
    for token, following in successor.items():
        output[following, token] = LOGIT
    return output


def write(path: str, chatml: bool = False) -> None:
    import numpy as np
    from gguf import GGUFWriter

    tokens, types = vocabulary(chatml)
    n_vocab = len(tokens)
    n_embd = max(N_EMBD, -(-n_vocab // (2 * N_HEAD)) * 2 * N_HEAD)  # one-hot fits; even head size
    writer = GGUFWriter(path, "llama")
    writer.add_name("gateway-tests-tiny-chatml" if chatml else "gateway-tests-tiny")
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(n_embd // N_HEAD)
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHATML_TEMPLATE if chatml else TEMPLATE)

    embedding = np.zeros((n_vocab, n_embd), dtype=np.float32)
    embedding[np.arange(n_vocab), np.arange(n_vocab)] = 1.0  # one-hot
    writer.add_tensor("token_embd.weight", embedding)
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", bigram_output(tokens, n_embd))
    square = np.zeros((n_embd, n_embd), dtype=np.float32)
    for layer in range(N_LAYERS):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", square)
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", np.zeros((N_FF, n_embd), dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_up.weight", np.zeros((N_FF, n_embd), dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_down.weight", np.zeros((n_embd, N_FF), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    arguments = sys.argv[1:]
    write(arguments[-1], chatml="--chatml" in arguments)
