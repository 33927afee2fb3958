"""Token counts of a round whose server sent no usage (llama-cpp-python, some proxies).

The server's own tokenizer counts when it has one (llama.cpp and llama-cpp-python do); else the
context builder's estimate, corrected per model, which errs high. Either way the usage is
marked estimated, and so are the run and its cost.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gateway.agent.rounds import Round
from gateway.llm import LLMClient, Usage

TEMPLATE_TOKENS_PER_MESSAGE = 8  # role markers and separators a template adds around each message


def prompt_text(messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> str:
    """What a template renders of a request, near enough to count: the messages' text, their
    tool calls and the tools' schemas as JSON."""
    parts: list[str] = [json.dumps(tool, ensure_ascii=False) for tool in tools]
    for message in messages:
        parts.append(str(message.get("content") or ""))
        for call in message.get("tool_calls") or ():
            parts.append(call["function"]["name"] + call["function"]["arguments"])
    return "\n".join(parts)


def output_text(round_: Round) -> str:
    return round_.reasoning + round_.text + "".join(call.name + call.arguments for call in round_.calls)


async def estimated_usage(
    llm: LLMClient,
    context: Any,
    model: str,
    messages: list[dict[str, Any]],
    estimated_prompt: int,
    round_: Round,
    *,
    tools: Sequence[dict[str, Any]] = (),
) -> Usage:
    """Usage for a round without a usage chunk: counted by the server's tokenizer, else estimated."""
    output = output_text(round_)
    prompt = await llm.count_tokens(prompt_text(messages, tools), model)
    completion = await llm.count_tokens(output, model) if output else 0
    if prompt is not None:
        prompt += TEMPLATE_TOKENS_PER_MESSAGE * len(messages)
    else:
        prompt = estimated_prompt
    if completion is None:
        completion = context.estimate(model, len(output)) if context is not None else len(output)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, estimated=True)
