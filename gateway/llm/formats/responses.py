"""OpenAI Responses API (`api: responses`): POST {base_url}/responses, the turn's messages as
input items, and its typed event stream decoded into the stream events the turn loop reads.

The turn's messages are OpenAI-chat shaped (gateway/context/render.py); here they become
`instructions` (the system message), `message` items with `input_text` / `input_image` parts,
`function_call` items (one per tool call, after their round's reasoning items) and
`function_call_output` items. Nothing is stored on the provider (`store: false`): a reasoning
model's reasoning items come back encrypted (`include: ["reasoning.encrypted_content"]`), are
kept with the round that produced them (the parser's `Replay`), and are sent back unchanged
in the next rounds of the turn, where the API wants them beside their function calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gateway.llm.errors import LLMError, as_int, classify_error
from gateway.llm.events import Finish, ReasoningDelta, Replay, StreamEvent, TextDelta, ToolCallDelta, Usage
from gateway.llm.formats.base import Request, replay_of

API = "responses"
ENCRYPTED_REASONING = "reasoning.encrypted_content"
MIN_OUTPUT_TOKENS = 16  # the least max_output_tokens OpenAI accepts

# `response.failed` and `error` events carry a string code, not a status: the status it stands
# for, so the classifier treats it like the HTTP error it names (a rate limit waits and retries).
STATUS_OF_CODE = {
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "server_error": 500,
    "server_is_overloaded": 503,
    "context_length_exceeded": 400,
    "invalid_prompt": 400,
    "invalid_request_error": 400,
    "invalid_api_key": 401,
}
# `reasoning:` -> `reasoning.effort`; "off" asks for the least the API knows ("none" is not
# accepted by every model).
EFFORT = {"off": "minimal", "low": "low", "medium": "medium", "high": "high"}


class ResponsesFormat:
    """`api: responses`: OpenAI, vLLM, Ollama, LM Studio and LiteLLM's proxy serve it."""

    name: ClassVar[str] = API
    path: ClassVar[str] = "/responses"
    limit_key: ClassVar[str] = "max_output_tokens"

    @staticmethod
    def headers(api_key: str) -> dict[str, str]:
        headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        return headers

    @staticmethod
    def body(request: Request) -> dict[str, Any]:
        return request_body(
            request.messages,
            request.tools,
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            reasoning=request.reasoning,
            cache_key=request.cache_key,
        )

    @staticmethod
    def parser() -> ResponsesParser:
        return ResponsesParser()

    @staticmethod
    def classify(status: int | None, body: Any, headers: Mapping[str, str] | None = None) -> LLMError:
        """An HTTP error body is OpenAI's shape; a mid-stream `error` event has its code (a
        string) at the top level, or in an `error` object, read as the status it stands for."""
        if status is None and isinstance(body, Mapping) and body.get("type") == "error":
            return stream_error(_mapping(body.get("error")) or body)
        return classify_error(status, body, headers)


# ---- the request --------------------------------------------------------------------------


def request_body(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    reasoning: str = "auto",
    cache_key: str | None = None,
) -> dict[str, Any]:
    """The body of one streamed `/responses` request (without `model`). The stable parts come
    first (instructions, then tools) and the input after, so a provider's prefix cache holds."""
    instructions, items = input_items(messages)
    body: dict[str, Any] = {}
    if instructions:
        body["instructions"] = instructions
    if tools:
        body["tools"] = [function_tool(tool) for tool in tools]
    body["input"] = items
    body["stream"] = True
    body["store"] = False
    if reasoning != "auto":
        # Only a reasoning model takes these (OpenAI refuses the include for gpt-4o and the
        # like), so "auto" sends neither. No `summary`: OpenAI refuses it to an unverified
        # organisation; servers that reason in the open stream it anyway.
        body["reasoning"] = {"effort": EFFORT.get(reasoning, reasoning)}
        body["include"] = [ENCRYPTED_REASONING]
    if max_tokens is not None:
        # OpenAI refuses fewer than 16 (a spend cap's last few tokens): the least it takes.
        body["max_output_tokens"] = max(MIN_OUTPUT_TOKENS, max_tokens)
    if temperature is not None:
        body["temperature"] = temperature
    if cache_key:
        body["prompt_cache_key"] = cache_key
    return body


def function_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A Chat Completions tool (`{"type": "function", "function": {...}}`) as a Responses one:
    flat, and `strict: false`, since the API's default (strict) refuses the JSON schemas that
    do not list every property as required (most MCP tools')."""
    function = tool.get("function") or tool
    flat: dict[str, Any] = {"type": "function", "name": function["name"]}
    if function.get("description"):
        flat["description"] = function["description"]
    flat["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
    flat["strict"] = False
    return flat


def input_items(messages: Iterable[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The system message(s) as `instructions`, everything else as input items in order."""
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            if items:  # a system note after the start reads as the developer's
                items.append({"type": "message", "role": "developer", "content": _input_parts(message)})
            else:
                instructions.append(_text_of(message.get("content")))
        elif role == "user":
            items.append({"type": "message", "role": "user", "content": _input_parts(message)})
        elif role == "assistant":
            items.extend(_assistant_items(message))
        elif role == "tool":
            output = _text_of(message.get("content"))
            items.append({"type": "function_call_output", "call_id": str(message["tool_call_id"]), "output": output})
    return "\n\n".join(part for part in instructions if part), items


def replayed_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The reasoning items an assistant message carries from a Responses round (another API's
    replay is left out: it means nothing here)."""
    data = replay_of(message, API)
    return [dict(item) for item in data if isinstance(item, dict)] if isinstance(data, list) else []


def _assistant_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The round's reasoning items first (unchanged), then its text, then its calls: the order
    the model produced them in. Reasoning with nothing after it is left out: OpenAI refuses a
    reasoning item without the item that followed it."""
    items: list[dict[str, Any]] = []
    if text := _text_of(message.get("content")):
        items.append({"type": "message", "role": "assistant", "content": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "call_id": str(call["id"]),
                "name": str(function.get("name") or ""),
                "arguments": str(function.get("arguments") or "{}"),
            }
        )
    return replayed_items(message) + items if items else []


def _input_parts(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str) or content is None:
        return [{"type": "input_text", "text": content or ""}]
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") == "text":
            parts.append({"type": "input_text", "text": part.get("text") or ""})
        elif part.get("type") == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, Mapping) else url
            parts.append({"type": "input_image", "image_url": str(url), "detail": "auto"})
    return parts


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(str(p.get("text") or "") for p in content if isinstance(p, Mapping) and "text" in p)
    return ""


# ---- the stream ---------------------------------------------------------------------------


@dataclass
class _Item:
    """What has been passed on of one output item, so a `.done` adds only what is missing."""

    type: str
    index: int = -1  # the tool call's index among the response's calls
    emitted: list[str] = field(default_factory=list)
    closed: bool = False  # its output_item.done came: the final response's copy adds nothing
    named: bool = False  # an event gave its id

    @property
    def text(self) -> str:
        return "".join(self.emitted)


class ResponsesParser:
    """Turns Responses stream events (the JSON payloads of the SSE body) into stream events.

    Deltas are passed on as they come; a `.done` event or the item's `output_item.done` adds
    only what its deltas did not already bring (some servers send whole items). Usage is read
    from the final response (`response.completed` or `response.incomplete`), the only place
    the API puts it; the reasoning items come out once, as a `Replay` before the `Finish`."""

    def __init__(self) -> None:
        self.finished = False
        self.served = ""
        self._items: dict[str, _Item] = {}  # by item id (llama.cpp sends no output_index), else index
        self._calls = 0
        self._reasoning: list[dict[str, Any]] = []  # the output's reasoning items, as they came

    def feed(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        kind = payload.get("type")
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        return handler(self, payload) if handler is not None else []

    # -- lifecycle --

    def _created(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        response = payload.get("response")
        if isinstance(response, Mapping) and response.get("model"):
            self.served = str(response["model"])
        return []

    def _completed(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        response = _mapping(payload.get("response"))
        events: list[StreamEvent] = []
        for position, item in enumerate(response.get("output") or ()):
            if isinstance(item, Mapping):  # items no output_item.done announced (a terse server)
                events.extend(self._whole_item(_key({"output_index": position}, item), item))
        self.finished = True
        if self._reasoning:
            events.append(Replay(API, self._reasoning))
        if payload.get("type") == "response.incomplete":
            reason = str(_mapping(response.get("incomplete_details")).get("reason") or "")
            events.append(Finish("content_filter" if reason == "content_filter" else "length"))
        else:
            events.append(Finish("tool_calls" if self._calls else "stop"))
        if isinstance(usage := response.get("usage"), Mapping):
            events.append(usage_of(usage))
        return events

    def _failed(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        raise stream_error(_mapping(_mapping(payload.get("response")).get("error")) or payload)

    def _error(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        raise stream_error(payload)

    # -- items --

    def _item_added(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        item = _mapping(payload.get("item"))
        return self._announce(self._slot(_key(payload, item), str(item.get("type") or "")), item)

    def _announce(self, slot: _Item, item: Mapping[str, Any]) -> list[StreamEvent]:
        """A function call's first event: its index, call id and name (once)."""
        if slot.type != "function_call" or slot.index >= 0:
            return []
        slot.index = self._calls
        self._calls += 1
        arguments = str(item.get("arguments") or "")
        slot.emitted.append(arguments)
        return [ToolCallDelta(slot.index, id=_call_id(item), name=str(item.get("name") or ""), arguments=arguments)]

    def _item_done(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        item = _mapping(payload.get("item"))
        return self._whole_item(_key(payload, item), item)

    def _whole_item(self, key: tuple[str, ...], item: Mapping[str, Any]) -> list[StreamEvent]:
        kind = str(item.get("type") or "")
        slot = self._slot(key, kind)
        if slot.closed:
            return []
        events: list[StreamEvent] = []
        if kind == "function_call":
            events.extend(self._announce(slot, item))
            events.extend(self._rest(slot, str(item.get("arguments") or ""), "arguments"))
        elif kind == "message":
            events.extend(self._rest(slot, _message_text(item), "text"))
        elif kind == "reasoning":
            if not slot.emitted:  # a server that streamed no summary: show the one it sends whole
                summary = "".join(str(s.get("text") or "") for s in item.get("summary") or () if isinstance(s, Mapping))
                if summary:
                    slot.emitted.append(summary)
                    events.append(ReasoningDelta(summary))
            if item.get("encrypted_content"):  # without it the item cannot be sent back (store: false)
                self._reasoning.append(dict(item))
        slot.closed = True
        return events

    # -- deltas --

    def _text_delta(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        delta = str(payload.get("delta") or "")
        if not delta:
            return []
        self._slot(_key(payload), "message").emitted.append(delta)
        return [TextDelta(delta)]

    def _text_done(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        whole = payload.get("text", payload.get("refusal"))
        return self._rest(self._slot(_key(payload), "message"), str(whole or ""), "text")

    def _reasoning_delta(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        delta = str(payload.get("delta") or "")
        if not delta:
            return []
        self._slot(_key(payload), "reasoning").emitted.append(delta)
        return [ReasoningDelta(delta)]

    def _reasoning_part_done(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        slot = self._slot(_key(payload), "reasoning")
        if not slot.emitted:
            return []
        slot.emitted.append("\n\n")  # summary parts are paragraphs; the next one starts apart
        return [ReasoningDelta("\n\n")]

    def _arguments_delta(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        slot = self._slot(_key(payload), "function_call")
        delta = str(payload.get("delta") or "")
        events = self._announce(slot, {})  # arguments before their item (a lax server): announced now
        if delta:
            slot.emitted.append(delta)
            events.append(ToolCallDelta(slot.index, arguments=delta))
        return events

    def _arguments_done(self, payload: Mapping[str, Any]) -> list[StreamEvent]:
        slot = self._slot(_key(payload), "function_call")
        return self._announce(slot, {}) + self._rest(slot, str(payload.get("arguments") or ""), "arguments")

    def _rest(self, slot: _Item, whole: str, what: str) -> list[StreamEvent]:
        """What `whole` has beyond what was already passed on (nothing when it differs)."""
        sent = slot.text
        if not whole or len(whole) <= len(sent) or not whole.startswith(sent):
            return []
        rest = whole[len(sent) :]
        slot.emitted.append(rest)
        if what == "arguments":
            return [ToolCallDelta(slot.index, arguments=rest)]
        return [TextDelta(rest)]

    def _slot(self, keys: tuple[str, ...], kind: str) -> _Item:
        """The item an event names: by its id when it gives one (LiteLLM puts two items at one
        position), else by position; an item first seen by position only takes its id later."""
        slot = self._items.get(keys[0])
        if slot is None and keys[0].startswith("id:") and len(keys) > 1:
            unnamed = self._items.get(keys[1])
            slot = unnamed if unnamed is not None and not unnamed.named else None
        slot = slot or _Item(kind)
        slot.named = slot.named or keys[0].startswith("id:")
        for key in keys:
            self._items.setdefault(key, slot)
        return slot


def _key(payload: Mapping[str, Any], item: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """How an event names its output item: by id (OpenAI sends it with the position; llama.cpp
    sends only the id), by its position in the output, or both."""
    found = (item or {}).get("id") or payload.get("item_id")
    index = as_int(payload.get("output_index"))
    keys = ([f"id:{found}"] if found else []) + ([f"#{index}"] if index is not None else [])
    return tuple(keys) or ("#?",)


_HANDLERS = {
    "response.created": ResponsesParser._created,
    "response.completed": ResponsesParser._completed,
    "response.incomplete": ResponsesParser._completed,
    "response.failed": ResponsesParser._failed,
    "error": ResponsesParser._error,
    "response.output_item.added": ResponsesParser._item_added,
    "response.output_item.done": ResponsesParser._item_done,
    "response.output_text.delta": ResponsesParser._text_delta,
    "response.output_text.done": ResponsesParser._text_done,
    "response.refusal.delta": ResponsesParser._text_delta,
    "response.refusal.done": ResponsesParser._text_done,
    "response.reasoning_summary_text.delta": ResponsesParser._reasoning_delta,
    "response.reasoning_summary_part.done": ResponsesParser._reasoning_part_done,
    "response.reasoning_text.delta": ResponsesParser._reasoning_delta,  # vLLM, Ollama: raw reasoning
    "response.function_call_arguments.delta": ResponsesParser._arguments_delta,
    "response.function_call_arguments.done": ResponsesParser._arguments_done,
}


def usage_of(usage: Mapping[str, Any]) -> Usage:
    """The Responses usage object: `input_tokens` is the whole prompt, cache reads and writes
    included (`input_tokens_details.cached_tokens`, `.cache_write_tokens`); `output_tokens` the
    whole reply, reasoning included."""
    inputs = _mapping(usage.get("input_tokens_details"))
    outputs = _mapping(usage.get("output_tokens_details"))
    return Usage(
        prompt_tokens=as_int(usage.get("input_tokens")) or 0,
        completion_tokens=as_int(usage.get("output_tokens")) or 0,
        cached_tokens=as_int(inputs.get("cached_tokens")) or 0,
        reasoning_tokens=as_int(outputs.get("reasoning_tokens")) or 0,
        cache_write_tokens=as_int(inputs.get("cache_write_tokens")) or 0,
    )


def stream_error(error: Mapping[str, Any]) -> LLMError:
    """An `error` event or a failed response's error, classified like the HTTP error it names."""
    code = error.get("code")
    status = as_int(code) if not isinstance(code, str) else STATUS_OF_CODE.get(code, as_int(code))
    if status is None and isinstance(error.get("type"), str):
        status = STATUS_OF_CODE.get(error["type"])
    return classify_error(status if status and status >= 400 else None, {"error": dict(error)})


def _message_text(item: Mapping[str, Any]) -> str:
    parts = item.get("content") or ()
    return "".join(
        str(part.get("text") or part.get("refusal") or "")
        for part in parts
        if isinstance(part, Mapping) and part.get("type") in ("output_text", "refusal")
    )


def _call_id(item: Mapping[str, Any]) -> str:
    return str(item.get("call_id") or item.get("id") or "")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
