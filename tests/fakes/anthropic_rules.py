"""What the Anthropic Messages API refuses, as the fake of it checks a request (fakes/anthropic.py).

Each check returns the API's own kind of message for the first problem found, or None. The
rules are the documented ones the real API enforces with a 400: the parameters it knows,
`max_tokens` always, roles that alternate starting with the user, content blocks each in their
place (`tool_use` only from the assistant, `tool_result` only from the user and before anything
else in it), every `tool_use` answered in the next message and every `tool_result` answering one
of the message before, at most four `cache_control` breakpoints, no empty text, and with thinking
on: a budget of at least 1,024 below `max_tokens`, no temperature, and the assistant message of
the tool rounds starting with its thinking blocks exactly as they were sent (signatures checked).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

PARAMETERS = {
    "model",
    "messages",
    "max_tokens",
    "system",
    "tools",
    "tool_choice",
    "stream",
    "temperature",
    "thinking",
    "metadata",
    "stop_sequences",
    "top_p",
    "top_k",
    "service_tier",
}
USER_BLOCKS = {"text", "image", "tool_result", "document"}
ASSISTANT_BLOCKS = {"text", "tool_use", "thinking", "redacted_thinking"}
THINKING = {"thinking", "redacted_thinking"}
MAX_BREAKPOINTS = 4


def signature(thinking: str) -> str:
    """The fake's seal on a thinking block's text (the real API's is opaque too)."""
    return "sig-" + hashlib.sha256(thinking.encode()).hexdigest()[:32]


def request_problem(body: dict[str, Any], issued: dict[str, list[dict[str, Any]]]) -> str | None:
    """`issued`: tool_use id -> the thinking blocks sent before it (what must come back)."""
    unknown = sorted(set(body) - PARAMETERS)
    if unknown:
        return f"{unknown[0]}: Extra inputs are not permitted"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        return "max_tokens: Field required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    return (
        _system_problem(body.get("system"))
        or _tools_problem(body.get("tools"))
        or _messages_problem(messages)
        or _cache_problem(body)
        or _thinking_problem(body, issued)
    )


def _system_problem(system: Any) -> str | None:
    if system is None or (isinstance(system, str) and system):
        return None
    if not isinstance(system, list) or not all(isinstance(b, dict) and b.get("type") == "text" for b in system):
        return "system: Input should be a valid string or a list of text blocks"
    if any(not b.get("text") for b in system):
        return "system: text content blocks must be non-empty"
    return None


def _tools_problem(tools: Any) -> str | None:
    if tools is None:
        return None
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or "function" in tool or "type" in tool and tool["type"] != "custom":
            return f"tools.{i}: Input tag does not match any of the expected tags (an OpenAI-shaped tool?)"
        if not tool.get("name") or not isinstance(tool.get("input_schema"), dict):
            return f"tools.{i}.input_schema: Field required"
    return None


def _messages_problem(messages: list[Any]) -> str | None:
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if i == 0 and role != "user":
            return "messages: first message must use the \"user\" role"
        if i and messages[i - 1]["role"] == role:
            return "messages: roles must alternate between \"user\" and \"assistant\""
        if problem := _content_problem(i, role, message.get("content")):
            return problem
    return _pairing_problem(messages)


def _content_problem(i: int, role: str, content: Any) -> str | None:
    if isinstance(content, str):
        return None if content else f"messages.{i}: text content blocks must be non-empty"
    if not isinstance(content, list) or not content:
        return f"messages.{i}: all messages must have non-empty content"
    allowed = USER_BLOCKS if role == "user" else ASSISTANT_BLOCKS
    seen_other = False
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in allowed:
            return f"messages.{i}.content.{j}.type: {kind!r} is not allowed in a {role} message"
        if kind == "text" and not block.get("text"):
            return f"messages.{i}.content.{j}: text content blocks must be non-empty"
        if kind == "tool_result" and seen_other:
            return f"messages.{i}.content.{j}: tool_result blocks must come first in a user message"
        if kind == "tool_use" and not isinstance(block.get("input"), dict):
            return f"messages.{i}.content.{j}.input: Input should be a valid dictionary"
        if kind in THINKING and any(b.get("type") not in THINKING for b in content[:j]):
            return f"messages.{i}.content.{j}: thinking blocks must come first in an assistant message"
        seen_other = seen_other or kind != "tool_result"
    return None


def _pairing_problem(messages: list[dict[str, Any]]) -> str | None:
    for i, message in enumerate(messages):
        blocks = message["content"] if isinstance(message["content"], list) else []
        if message["role"] == "assistant":
            uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
            answered = set()
            if i + 1 < len(messages) and isinstance(messages[i + 1]["content"], list):
                answered = {b.get("tool_use_id") for b in messages[i + 1]["content"] if b.get("type") == "tool_result"}
            if missing := [u for u in uses if u not in answered]:
                return (
                    f"messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{missing[0]}. Each `tool_use` block must have a corresponding `tool_result` block "
                    "in the next message."
                )
        else:
            before = messages[i - 1]["content"] if i and isinstance(messages[i - 1]["content"], list) else []
            uses = {b.get("id") for b in before if b.get("type") == "tool_use"}
            for j, block in enumerate(blocks):
                if block.get("type") == "tool_result" and block.get("tool_use_id") not in uses:
                    return (
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding `tool_use` "
                        "block in the previous message."
                    )
    return None


def _breakpoints(body: dict[str, Any]) -> list[Any]:
    marks = [t.get("cache_control") for t in body.get("tools") or []]
    system = body.get("system")
    marks += [b.get("cache_control") for b in system] if isinstance(system, list) else []
    for message in body["messages"]:
        if isinstance(message["content"], list):
            marks += [b.get("cache_control") for b in message["content"]]
    return [m for m in marks if m is not None]


def _cache_problem(body: dict[str, Any]) -> str | None:
    marks = _breakpoints(body)
    if len(marks) > MAX_BREAKPOINTS:
        return f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(marks)}."
    if any(not isinstance(m, dict) or m.get("type") != "ephemeral" for m in marks):
        return "cache_control.type: Input should be 'ephemeral'"
    return None


def _thinking_problem(body: dict[str, Any], issued: dict[str, list[dict[str, Any]]]) -> str | None:
    messages = body["messages"]
    for i, message in enumerate(messages):  # a thinking block anywhere must be one the API sent, unchanged
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("type") == "thinking" and block.get("signature") != signature(block.get("thinking", "")):
                return f"messages.{i}.content: Invalid `signature` in `thinking` block"
    thinking = body.get("thinking")
    if thinking is None or thinking.get("type") == "disabled":
        return None
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or budget < 1024:
        return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
    if budget >= body["max_tokens"]:
        return "`max_tokens` must be greater than `thinking.budget_tokens`"
    if "temperature" in body and body["temperature"] != 1:
        return "`temperature` may only be set to 1 when thinking is enabled"
    return _tool_loop_thinking(messages, issued)


def _tool_loop_thinking(messages: list[dict[str, Any]], issued: dict[str, list[dict[str, Any]]]) -> str | None:
    """The last assistant message, when the request continues its tool rounds, starts with the
    thinking that came with it, exactly."""
    last = messages[-1]
    if last["role"] != "user" or not isinstance(last["content"], list) or len(messages) < 2:
        return None
    if not any(b.get("type") == "tool_result" for b in last["content"]):
        return None
    assistant = messages[-2]["content"]
    blocks = assistant if isinstance(assistant, list) else []
    if not blocks or blocks[0].get("type") not in THINKING:
        return (
            f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
            f"`{blocks[0].get('type') if blocks else 'text'}`. When `thinking` is enabled, a final `assistant` message "
            "must start with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks)."
        )
    sent = [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks if b.get("type") in THINKING]
    for use in (b["id"] for b in blocks if b.get("type") == "tool_use"):
        if use in issued and json.dumps(issued[use], sort_keys=True) != json.dumps(sent, sort_keys=True):
            return (
                f"messages.{len(messages) - 2}.content: the thinking blocks of the tool rounds were changed or dropped"
            )
    return None
