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
"""

from __future__ import annotations

import sys

import numpy as np
from gguf import GGUFWriter, TokenType

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


def vocabulary() -> tuple[list[str], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256 + [TokenType.NORMAL]
    return tokens, [int(t) for t in types]


def bigram_output(n_vocab: int) -> np.ndarray:
    """output.weight (n_vocab rows of n_embd): from every token the next is REPLY's first
    character, except inside REPLY, which continues it and ends with EOS."""
    chain = [byte_token(b) for b in REPLY.encode()]
    successor = {token: chain[0] for token in range(n_vocab)}
    successor.update(zip(chain, chain[1:] + [EOS], strict=True))
    output = np.zeros((n_vocab, N_EMBD), dtype=np.float32)
    for token, following in successor.items():
        output[following, token] = LOGIT
    return output


def write(path: str) -> None:
    tokens, types = vocabulary()
    n_vocab = len(tokens)
    writer = GGUFWriter(path, "llama")
    writer.add_name("gateway-tests-tiny")
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(TEMPLATE)

    embedding = np.zeros((n_vocab, N_EMBD), dtype=np.float32)
    embedding[np.arange(n_vocab), np.arange(n_vocab)] = 1.0  # one-hot
    writer.add_tensor("token_embd.weight", embedding)
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", bigram_output(n_vocab))
    square = np.zeros((N_EMBD, N_EMBD), dtype=np.float32)
    for layer in range(N_LAYERS):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", square)
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", np.zeros((N_FF, N_EMBD), dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_up.weight", np.zeros((N_FF, N_EMBD), dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_down.weight", np.zeros((N_EMBD, N_FF), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    write(sys.argv[1])
