"""What strict OpenAI-compatible servers refuse, as the fake LLM checks it.

Two layers, as on a real server:
- the request schema (the 400s of OpenAI and vLLM): model, stream, tools, tool-call pairing,
  reasoning fields sent back, arguments that are not JSON;
- the chat template (what vLLM, TGI and llama.cpp apply; Llama-2, Mistral and Gemma style
  templates `raise_exception` on it): at most one system message, first; then user first and
  user/assistant strictly alternating, a tool exchange (the assistant message with its
  `tool_calls` and one result per call, in call order) standing on the assistant's side; no
  assistant message last unless the request asks to continue it; string content everywhere a
  template reads it.

`content: null` beside `tool_calls` is accepted by OpenAI but refused by some servers (a 500
with a pydantic dump); `NullContent` says which the fake plays.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from typing import Any, Literal

REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
ROLES = ("system", "developer", "user", "assistant", "tool")
ALTERNATE = "Conversation roles must alternate user/assistant/user/assistant/..."
NullContent = Literal["accept", "reject"]


def request_problem(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    if not body.get("model"):
        return "model: required"
    if body.get("stream") is not True:
        return "stream: this server only streams; set stream: true"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: must be a non-empty array"
    return tools_problem(body.get("tools")) or conversation_problem(messages)


def tools_problem(tools: Any) -> str | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        return "tools: must be an array"
    names = [(t.get("function") or {}).get("name") if isinstance(t, dict) else None for t in tools]
    if None in names:
        return "tools: every tool needs function.name"
    duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
    if duplicates:
        return f"tools: duplicate function name(s): {', '.join(duplicates)}"
    return None


def conversation_problem(messages: list[Any]) -> str | None:
    """Every assistant tool call answered by exactly one tool message, in call order, before
    the next user/assistant/system message; no tool message without its call; no reasoning
    sent back."""
    open_calls: list[str] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            return f"{where}: unknown role {role!r}"
        if problem := content_problem(where, role, message.get("content")):
            return problem
        if role == "tool":
            if problem := _tool_problem(where, message.get("tool_call_id"), open_calls):
                return problem
            open_calls.pop(0)
            continue
        if open_calls:
            pending = ", ".join(open_calls)
            return f"{where}: assistant tool call(s) {pending} have no tool result before this {role} message"
        if role == "assistant":
            problem = _assistant_problem(where, message)
            if problem:
                return problem
            open_calls = [call["id"] for call in message.get("tool_calls") or []]
    if open_calls:
        return f"messages: assistant tool call(s) {', '.join(open_calls)} have no tool result"
    return None


def _tool_problem(where: str, call_id: Any, open_calls: list[str]) -> str | None:
    if call_id not in open_calls:
        return f"{where}: tool message with tool_call_id {call_id!r} has no preceding assistant tool call"
    if call_id != open_calls[0]:
        return f"{where}: tool result {call_id!r} is out of order: the result of {open_calls[0]!r} comes first"
    return None


def null_content_problem(messages: list[Any]) -> str | None:
    """The pydantic dump some servers answer with a 500 for `content: null` beside tool calls."""
    for i, message in enumerate(messages):
        if message.get("role") == "assistant" and message.get("tool_calls") and message.get("content") is None:
            return (
                "1 validation error for ChatCompletionRequest\n"
                f"messages.{i}.content\n  Input should be a valid string "
                "[type=string_type, input_value=None, input_type=NoneType]"
            )
    return None


def template_problem(body: dict[str, Any]) -> str | None:
    """What a strict chat template raises on (the message is the template's own)."""
    messages: list[dict[str, Any]] = body["messages"]
    for i, message in enumerate(messages):
        if message["role"] in ("system", "developer") and i > 0:
            return f"messages[{i}]: a system message is only accepted first"
        if message["role"] != "assistant" and not isinstance(message.get("content"), (str, list)):
            return f"messages[{i}]: {message['role']} content must be a string"
    turns = messages[1:] if messages[0]["role"] in ("system", "developer") else messages
    if not turns or turns[0]["role"] != "user":
        return f"{ALTERNATE} (the first message after the system message must be from the user)"
    previous: dict[str, Any] | None = None
    for i, message in enumerate(turns, start=len(messages) - len(turns)):
        role = message["role"]
        if role == "tool":
            continue
        if (
            previous is not None
            and role == previous["role"]
            and not (role == "assistant" and previous.get("tool_calls"))
        ):
            return f"{ALTERNATE} (messages[{i}] is a second {role} message in a row)"
        if role == "assistant" and not message.get("tool_calls") and not isinstance(message.get("content"), str):
            return f"messages[{i}]: an assistant message without tool calls needs string content"
        previous = message
    if messages[-1]["role"] == "assistant" and not (
        body.get("continue_final_message") or body.get("add_generation_prompt") is False
    ):
        return "the last message is the assistant's: nothing to answer (continue_final_message is not set)"
    return None


def content_problem(where: str, role: str, content: Any) -> str | None:
    """Content is a string (null only beside tool calls); a user message may instead be a list
    of parts in OpenAI's shape: {"type": "text", "text"} and {"type": "image_url", "image_url": {"url"}}
    with a data: URL (base64) or http(s) URL."""
    if content is None or isinstance(content, str):
        return None
    if role != "user" or not isinstance(content, list) or not content:
        return f"{where}.content: must be a string" + (" or a non-empty list of parts" if role == "user" else "")
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str) or set(part) != {"type", "text"}:
                return f"{at}: a text part is {{type, text}} with a string text"
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else None
            if not isinstance(url, str) or set(part) != {"type", "image_url"}:
                return f"{at}: an image part is {{type, image_url: {{url}}}}"
            if not (url.startswith(("http://", "https://")) or _valid_data_url(url)):
                return f"{at}: image_url.url must be http(s) or data:image/<type>;base64,<data>"
        else:
            return f"{at}: unknown content part type {kind!r}"
    return None


def _valid_data_url(url: str) -> bool:
    head, _, data = url.partition(",")
    if not (head.startswith("data:image/") and head.endswith(";base64") and data):
        return False
    try:
        base64.b64decode(data, validate=True)
    except ValueError:
        return False
    return True


def _assistant_problem(where: str, message: dict[str, Any]) -> str | None:
    for key in REASONING_FIELDS:
        if key in message:
            return f"{where}: assistant field {key!r} must not be sent back"
    for j, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not call.get("id") or not function.get("name"):
            return f"{where}.tool_calls[{j}]: id and function.name are required"
        if not isinstance(arguments := function.get("arguments"), str):
            return f"{where}.tool_calls[{j}]: function.arguments must be a JSON string"
        try:
            json.loads(arguments)
        except ValueError:
            return f"{where}.tool_calls[{j}]: function.arguments is not valid JSON"
    return None
