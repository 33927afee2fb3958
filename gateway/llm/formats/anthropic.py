"""Anthropic Messages: POST {base_url}/messages, the request built from the turn's Chat
Completions messages, and the stream's events (message_start, content_block_start / delta /
stop, message_delta, message_stop, ping, error) decoded into the loop's stream events.

The conversation is translated, not wrapped: the system messages go to the top-level `system`;
an assistant message's tool calls become `tool_use` blocks and the tool results that follow it
`tool_result` blocks of one user message (the API wants user and assistant to alternate, each
`tool_use` answered in the very next message); image parts become `image` blocks. Thinking
(`reasoning: low | medium | high`) is Anthropic's thinking budget; the `thinking` and
`redacted_thinking` blocks of an answer go back unchanged, signatures and all, on its assistant
message in the turn's next rounds, as the API requires with tools (they travel as the message's
replay; a turn's later turns leave them out, as the API allows).

Prompt caching: `cache_control` breakpoints (the API takes four), each where a later request
repeats the prefix up to it: the system prompt (its prefix holds the tools; the last tool when
there is no system), the end of the history before the newest turn's words, the end of what the
request before this one sent (the message before the newest assistant message), and this
request's last tool result (its end but for the tail, which the next request no longer has). A
request reads the longest of them an earlier one wrote: a turn's next round what the last one
sent, a turn's first request what the last round of the turn before sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from gateway.llm.errors import (
    AuthError,
    ContextTooLong,
    LLMError,
    RateLimited,
    classify_error,
    error_object,
    parse_retry_after,
)
from gateway.llm.events import Finish, ReasoningDelta, Replay, StreamEvent, TextDelta, ToolCallDelta, Usage
from gateway.llm.formats.base import Request, replay_of

VERSION = "2023-06-01"
# The reply's limit when none is configured: the API wants one on every request.
DEFAULT_MAX_TOKENS = 8192
# Thinking budgets by `reasoning` (the API's minimum is 1,024); the reply keeps its own limit
# beside it, so `max_tokens` is the budget plus the reply's.
THINKING_BUDGET = {"low": 2048, "medium": 8192, "high": 24576}
EPHEMERAL = {"type": "ephemeral"}
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
# A mid-stream error has no HTTP status: its type says which it would have been.
STATUS_OF_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}
_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+)", re.I)
_DATA_URL = re.compile(r"^data:([^;,]+);base64,(.*)$", re.S)


class AnthropicFormat:
    """`api: anthropic`: Anthropic's API and the servers that speak it (llama.cpp's
    llama-server, vLLM, LiteLLM's proxy, Ollama, LM Studio)."""

    name: ClassVar[str] = "anthropic"
    path: ClassVar[str] = "/messages"
    limit_key: ClassVar[str] = "max_tokens"

    @staticmethod
    def headers(api_key: str) -> dict[str, str]:
        headers = {
            "Accept": "text/event-stream",
            "Content-Type": "application/json",
            "anthropic-version": VERSION,
        }
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    @staticmethod
    def body(request: Request) -> dict[str, Any]:
        system, messages, marks = _translate(request.messages)
        body: dict[str, Any] = {}
        if request.tools:  # tools first: the prefix the cache keys on starts with them
            tools = [_tool(t) for t in request.tools]
            if not system:  # else the system's breakpoint covers them, and the four go further
                tools[-1] = {**tools[-1], "cache_control": EPHEMERAL}
            body["tools"] = tools
        if system:
            body["system"] = [{"type": "text", "text": system, "cache_control": EPHEMERAL}]
        for position, block in marks:
            messages[position] = _marked(messages[position], block)
        body["messages"] = messages
        reply = request.max_tokens or DEFAULT_MAX_TOKENS
        budget = THINKING_BUDGET.get(request.reasoning)
        if budget is not None and _thinking_allowed(request.messages):
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
            body["max_tokens"] = budget + reply
        else:
            body["max_tokens"] = reply
            if request.temperature is not None:  # with thinking the API takes no temperature
                body["temperature"] = request.temperature
        body["stream"] = True
        return body

    @staticmethod
    def parser() -> MessageParser:
        return MessageParser()

    @staticmethod
    def classify(status: int | None, body: Any, headers: Mapping[str, str] | None = None) -> LLMError:
        return classify(status, body, headers)


# ---- the request -------------------------------------------------------------------------


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function") or tool
    made = {"name": function["name"], "input_schema": function.get("parameters") or {"type": "object"}}
    if description := function.get("description"):
        made["description"] = description
    return made


def _translate(chat: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]], list[tuple[int, int]]]:
    """(system text, messages with block contents, the blocks to mark for the cache: (message, block))."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    newest_words = -1  # the message holding the newest turn's words (a user message without results)
    for message in chat:
        role = message.get("role")
        if role == "system":
            if text := _text_of(message.get("content")):
                system.append(text)
            continue
        blocks = _blocks(message)
        if not blocks:
            continue
        side = "assistant" if role == "assistant" else "user"
        if messages and messages[-1]["role"] == side:
            _join(messages[-1]["content"], blocks)
        else:
            messages.append({"role": side, "content": blocks})
        if side == "user" and role != "tool" and not _has_results(messages[-1]):
            newest_words = len(messages) - 1
    return "\n\n".join(system), messages, _breakpoints(messages, newest_words)


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    role = message.get("role")
    if role == "assistant":
        return _assistant_blocks(message)
    if role == "tool":
        return [_tool_result(message)]
    return _user_blocks(message.get("content"))


def _breakpoints(messages: list[dict[str, Any]], newest_words: int) -> list[tuple[int, int]]:
    """(message, block) of the prefixes a request repeats from an earlier one, three at most: the
    history before the newest turn's words (what a turn's first request wrote, read by its
    rounds), the end of what the request before this one wrote (the message before the newest
    assistant message, the reply to it; the one before that when it is words, which that
    request sent with the tail joined to them), and the last tool result of the last message
    (the end of this request but for the tail, which the next request no longer has)."""
    marks: set[tuple[int, int]] = set()
    if newest_words > 0:
        marks.add((newest_words - 1, -1))
    last_assistant = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    sent_before = last_assistant - 1
    if sent_before >= 0 and not _has_results(messages[sent_before]):
        sent_before -= 1
    if sent_before >= 0:
        marks.add((sent_before, -1))
    if messages and messages[-1]["role"] == "user":
        blocks = messages[-1]["content"]
        results = [i for i, b in enumerate(blocks) if b["type"] == "tool_result"]
        if results:
            marks.add((len(messages) - 1, results[-1]))
    return sorted(marks)


def _join(blocks: list[dict[str, Any]], more: list[dict[str, Any]]) -> None:
    """Another message of the same side joins the last one: tool results before its words, as
    the API wants them first in a user message."""
    results = [b for b in more if b["type"] == "tool_result"]
    if results and any(b["type"] != "tool_result" for b in blocks):
        first_other = next(i for i, b in enumerate(blocks) if b["type"] != "tool_result")
        blocks[first_other:first_other] = results
        blocks.extend(b for b in more if b["type"] != "tool_result")
    else:
        blocks.extend(more)


def _has_results(message: dict[str, Any]) -> bool:
    return any(b["type"] == "tool_result" for b in message["content"])


def _marked(message: dict[str, Any], block: int) -> dict[str, Any]:
    """The message with a cache breakpoint on one of its blocks (a copy: the blocks may be shared)."""
    blocks = list(message["content"])
    blocks[block] = {**blocks[block], "cache_control": EPHEMERAL}
    return {**message, "content": blocks}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content or []:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text" and part.get("text"):
            blocks.append({"type": "text", "text": part["text"]})
        elif part.get("type") == "image_url" and (image := _image(part)) is not None:
            blocks.append(image)
    return blocks


def _image(part: dict[str, Any]) -> dict[str, Any] | None:
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    if not isinstance(url, str) or not url:
        return None
    if match := _DATA_URL.match(url):
        return {"type": "image", "source": {"type": "base64", "media_type": match[1], "data": match[2]}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _assistant_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = list(replay_of(message, AnthropicFormat.name) or ())  # thinking comes first
    if text := _text_of(message.get("content")):
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        blocks.append(
            {"type": "tool_use", "id": call["id"], "name": function.get("name", ""), "input": _input(function)}
        )
    return blocks


def _input(function: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments as the object the API wants (a call cut off mid-arguments: {})."""
    arguments = function.get("arguments")
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _tool_result(message: dict[str, Any]) -> dict[str, Any]:
    text = _text_of(message.get("content"))
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id", "")}
    if text:  # an empty text block is refused; an empty result is not
        result["content"] = text
    return result


def _thinking_allowed(chat: list[dict[str, Any]]) -> bool:
    """With thinking on, the API wants the assistant message of the turn's tool rounds to start
    with its thinking; one that has none (answered by a model without thinking, before a
    fallback) cannot get it, so that request goes without thinking."""
    for message in reversed(chat):
        if message.get("role") == "assistant" and message.get("tool_calls"):
            return bool(replay_of(message, AnthropicFormat.name))
        if message.get("role") == "user":
            return True
    return True


# ---- the stream --------------------------------------------------------------------------


class MessageParser:
    """One streamed Message into stream events. Usage comes at the end (message_delta's counts
    are the totals; message_start's fill what it leaves out); the thinking blocks are handed back
    as one `Replay` before the `Finish`."""

    def __init__(self) -> None:
        self.finished = False
        self.served = ""
        self._usage: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}  # index -> thinking or redacted_thinking block
        self._kinds: dict[int, str] = {}

    def feed(self, payload: dict[str, Any]) -> list[StreamEvent]:
        kind = payload.get("type")
        if kind == "content_block_delta":
            return self._delta(payload)
        if kind == "content_block_start":
            return self._start(payload)
        if kind == "message_start":
            message = payload.get("message") or {}
            self.served = str(message.get("model") or "")
            self._usage.update(_counts(message.get("usage")))
        elif kind == "message_delta":
            return self._end(payload)
        elif kind == "message_stop":
            self.finished = True
        return []  # ping, content_block_stop, and what later versions add

    def _start(self, payload: dict[str, Any]) -> list[StreamEvent]:
        index = _index(payload)
        block = payload.get("content_block") or {}
        kind = self._kinds[index] = str(block.get("type") or "")
        if kind == "tool_use":
            initial = block.get("input")
            arguments = json.dumps(initial) if isinstance(initial, dict) and initial else ""
            return [ToolCallDelta(index, str(block.get("id") or ""), str(block.get("name") or ""), arguments)]
        if kind == "text" and (text := block.get("text")):
            return [TextDelta(str(text))]
        if kind == "thinking":
            self._blocks[index] = {"type": "thinking", "thinking": "", "signature": ""}
            return self._thought(index, block.get("thinking"), block.get("signature"))
        if kind == "redacted_thinking":
            self._blocks[index] = dict(block)  # its `data` goes back as it came
        return []

    def _delta(self, payload: dict[str, Any]) -> list[StreamEvent]:
        index = _index(payload)
        delta = payload.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta":
            return [TextDelta(text)] if (text := delta.get("text")) else []
        if kind == "input_json_delta":
            return [ToolCallDelta(index, arguments=part)] if (part := delta.get("partial_json")) else []
        if kind in ("thinking_delta", "signature_delta"):
            return self._thought(index, delta.get("thinking"), delta.get("signature"))
        return []

    def _thought(self, index: int, thinking: Any, signature: Any) -> list[StreamEvent]:
        block = self._blocks.setdefault(index, {"type": "thinking", "thinking": "", "signature": ""})
        if isinstance(signature, str):
            block["signature"] += signature
        if isinstance(thinking, str) and thinking:
            block["thinking"] += thinking
            return [ReasoningDelta(thinking)]
        return []

    def _end(self, payload: dict[str, Any]) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if self._blocks:
            events.append(Replay(AnthropicFormat.name, [self._blocks[i] for i in sorted(self._blocks)]))
        reason = (payload.get("delta") or {}).get("stop_reason")
        if reason:
            self.finished = True
            events.append(Finish(STOP_REASONS.get(str(reason), str(reason))))
        self._usage.update(_counts(payload.get("usage")))
        events.append(self.usage())
        return events

    def usage(self) -> Usage:
        read = self._usage.get("cache_read_input_tokens", 0)
        written = self._usage.get("cache_creation_input_tokens", 0)
        return Usage(
            prompt_tokens=self._usage.get("input_tokens", 0) + read + written,  # input_tokens leaves the cache out
            completion_tokens=self._usage.get("output_tokens", 0),
            cached_tokens=read,
            cache_write_tokens=written,
        )


def _index(payload: dict[str, Any]) -> int:
    index = payload.get("index")
    return index if isinstance(index, int) and not isinstance(index, bool) else 0


def _counts(usage: Any) -> dict[str, int]:
    """The counts a usage object gives (null ones left out, so they do not replace earlier ones)."""
    if not isinstance(usage, dict):
        return {}
    return {k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}


# ---- errors ------------------------------------------------------------------------------


def classify(status: int | None, body: Any, headers: Mapping[str, str] | None = None) -> LLMError:
    """Anthropic's `{"type": "error", "error": {"type", "message"}}`, by HTTP status or, mid-stream,
    by its type: overloaded (529) and api_error retried, rate_limit_error after its retry-after,
    an over-long prompt as such, the rest as the shared classifier says."""
    err = error_object(body)
    kind = str(err.get("type") or "")
    status = status or STATUS_OF_TYPE.get(kind)
    message = str(err.get("message") or "no message")[:500]
    where = f"HTTP {status}" if status else "stream error"
    if kind == "rate_limit_error" or status == 429:
        return RateLimited(
            f"rate limited by the LLM server ({where}: {message})", retry_after=parse_retry_after(headers, body)
        )
    if kind == "overloaded_error":
        return LLMError(
            f"the LLM server is overloaded ({where}: {message})", kind="server", status=status, retryable=True
        )
    if kind == "authentication_error":
        return AuthError(
            f"the LLM server refused the key ({where}: {message}); check llm.api_key (x-api-key)",
            kind="auth",
            status=status,
        )
    if match := _TOO_LONG.search(message):
        return ContextTooLong(
            f"the prompt does not fit the model's context: {message}",
            status=status,
            prompt_tokens=int(match[1]),
            context_window=int(match[2]),
        )
    return classify_error(status, body, headers)
