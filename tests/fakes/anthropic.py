"""A scripted Anthropic Messages API server (`POST /v1/messages`), strict and hostile.

    async with FakeAnthropic() as llm:
        llm.tool_call("clock", {}, id="toolu_1", reasoning="The clock tool knows.")
        llm.reply("It is noon.")
        client = LLMClient(LLMConfig(base_url=llm.base_url, api="anthropic", api_key="k", reasoning="low"))

Scripted like the Chat Completions fake (`fakes/llm.py`: `reply`, `tool_call`, `error`, `stall`,
`truncate`, `mid_stream_error`, `raw`, a `responder`); each item is played as the API streams it:
`event:` and `data:` lines in the documented order (message_start, a `ping`, per content block
content_block_start, its deltas, content_block_stop; message_delta with the stop reason and the
output tokens; message_stop). A reply's `reasoning` is a `thinking` block (only when the request
turns thinking on) signed by the fake; the next rounds of the turn must send it back unchanged
before the calls it came with, or the request is refused as the API refuses it
(`fakes/anthropic_rules.py`). Requests need `anthropic-version` and `x-api-key` (the key itself
when `api_key` is set). Errors come in Anthropic's shape: 529 `overloaded_error`, 429
`rate_limit_error` with `retry-after`, mid-stream `event: error`. `usage_at_start=False` sends
every count only in message_delta, as some proxies do. Cache reads and writes are billed like the
API: the longest earlier breakpoint prefix this request repeats is read, the rest up to its last
breakpoint written (4 characters a token, at least 1,024 tokens to be cached).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

from aiohttp import web

from fakes.anthropic_rules import THINKING, request_problem, signature
from fakes.llm import FakeLLM, FakeToolCall, Hold, HttpError, MidStreamError, Raw, Reply, ScriptItem, Stall, Truncate

VERSION = "2023-06-01"
CACHE_MIN_TOKENS = 1024
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


class FakeAnthropic(FakeLLM):
    """The Chat Completions fake's scripting and discovery, speaking the Messages API."""

    api = "anthropic"
    settings: dict[str, Any] = {"api": "anthropic", "api_key": "sk-fake"}  # noqa: RUF012

    def __init__(self, *, usage_at_start: bool = True, **options: Any) -> None:
        super().__init__(**options)
        self.usage_at_start = usage_at_start
        self.issued: dict[str, list[dict[str, Any]]] = {}  # tool_use id -> the thinking blocks before it
        self.accepted = 0  # requests that passed every check
        self.cache_reads: list[int] = []  # cache_read_input_tokens of each accepted request
        self._cached: set[str] = set()  # the breakpoint prefixes written so far

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self._handle)

    def error(  # type: ignore[override]
        self, status: int, *, message: str | None = None, retry_after: float | None = None, **_: Any
    ) -> None:
        """An error answer in Anthropic's shape (529: overloaded_error, 429: rate_limit_error)."""
        kind = ERROR_TYPES.get(status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": message or f"fake {kind}"}}
        headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
        self.push(HttpError(status, body, headers))

    def _pieces_of(self, text: str) -> list[str]:
        size = max(1, self.chunk_chars)
        return [text[i : i + size] for i in range(0, len(text), size)]

    def overloaded(self) -> None:
        self.error(529, message="Overloaded")

    def mid_stream_error(self, text: str = "partial ", *, message: str = "Overloaded", code: int = 529) -> None:
        self.push(MidStreamError({"type": ERROR_TYPES.get(code, "api_error"), "message": message}, text))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        try:
            body = await request.json()
        except ValueError:
            return self._refuse(400, "invalid_request_error", "The request body is not valid JSON")
        self.requests.append(body)
        if request.headers.get("anthropic-version") != VERSION:
            return self._refuse(400, "invalid_request_error", "anthropic-version: header is required")
        key = request.headers.get("x-api-key")
        if not key or (self.api_key is not None and key != self.api_key):
            return self._refuse(401, "authentication_error", "invalid x-api-key")
        if problem := request_problem(body, self.issued):
            return self._refuse(400, "invalid_request_error", problem)
        self.accepted += 1
        item = self._script.popleft() if self._script else self.responder(body)
        if inspect.isawaitable(item):
            item = await item
        return await self._play(request, body, item)

    def _refuse(self, status: int, kind: str, message: str) -> web.Response:
        self.rejections.append(message)
        return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)

    async def _play(self, request: web.Request, body: dict[str, Any], item: ScriptItem) -> web.StreamResponse:
        if isinstance(item, HttpError):
            payload = item.body if isinstance(item.body, dict) else {"type": "error", "error": {"message": item.body}}
            return web.json_response(payload, status=item.status, headers=item.headers)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        stream = _MessageStream(self, response, body, getattr(item, "model", None))
        if isinstance(item, Raw):
            for line in item.lines:
                await response.write(line.encode() + b"\n")
            return response
        await stream.start()
        if isinstance(item, Reply):
            await stream.reply(item)
        elif isinstance(item, Stall):
            await stream.partial_text(item.text)
            await self._stall(request)
        elif isinstance(item, Hold):
            await stream.partial_text(item.text)
            self.stalled.set()
            await item.released.wait()
            await stream.reply(item.rest)
        elif isinstance(item, MidStreamError):
            await stream.partial_text(item.text)
            await stream.send("error", error=item.error)
        elif isinstance(item, Truncate):
            await stream.partial_text(item.text)  # cut mid-block: no content_block_stop, no message_stop
        return response

    def cache(self, body: dict[str, Any]) -> tuple[int, int]:
        """(tokens read, tokens written): the longest breakpoint prefix written before is read; the
        request's last breakpoint prefix is written beyond it."""
        prefixes = _breakpoint_prefixes(body)
        read = max((len(p) // 4 for p in prefixes if p in self._cached and len(p) // 4 >= CACHE_MIN_TOKENS), default=0)
        written = 0
        if prefixes and len(prefixes[-1]) // 4 >= CACHE_MIN_TOKENS:
            written = len(prefixes[-1]) // 4 - read
            self._cached.update(p for p in prefixes if len(p) // 4 >= CACHE_MIN_TOKENS)
        return read, written


def _breakpoint_prefixes(body: dict[str, Any]) -> list[str]:
    """The request's text up to each cache breakpoint, in the API's order: tools, system, messages."""
    parts: list[str] = []
    prefixes: list[str] = []

    def add(block: Any) -> None:
        parts.append(json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True))
        if block.get("cache_control"):
            prefixes.append("".join(parts))

    for tool in body.get("tools") or []:
        add(tool)
    system = body.get("system")
    for block in system if isinstance(system, list) else ([{"type": "text", "text": system}] if system else []):
        add(block)
    for message in body["messages"]:
        parts.append(message["role"])
        content = message["content"]
        for block in content if isinstance(content, list) else [{"type": "text", "text": content}]:
            add(block)
    return prefixes


class _MessageStream:
    """Writes the events of one streamed Message."""

    def __init__(self, fake: FakeAnthropic, response: web.StreamResponse, body: dict[str, Any], model: str | None):
        self.fake = fake
        self.response = response
        self.body = body
        self.model = model or str(body.get("model", ""))
        self.index = 0

    async def send(self, kind: str, **fields: Any) -> None:
        if self.fake.delay:
            await asyncio.sleep(self.fake.delay)
        payload = {"type": kind, **fields}
        await self.response.write(f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode())

    async def start(self) -> None:
        self.read, self.written = self.fake.cache(self.body)
        fresh = max(1, len(json.dumps(self.body)) // 4 - self.read - self.written)
        usage = {
            "input_tokens": fresh,
            "cache_creation_input_tokens": self.written,
            "cache_read_input_tokens": self.read,
            "output_tokens": 1,
        }
        self.fake.cache_reads.append(self.read)
        if not self.fake.usage_at_start:
            usage = {"input_tokens": 0, "output_tokens": 0}
        self.usage = {
            "input_tokens": fresh,
            "cache_creation_input_tokens": self.written,
            "cache_read_input_tokens": self.read,
        }
        message = {
            "id": f"msg_fake{self.fake.next_id()}",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        await self.send("message_start", message=message)
        if self.fake.pings:
            await self.send("ping")

    async def partial_text(self, text: str) -> None:
        if text:
            await self.send("content_block_start", index=self.index, content_block={"type": "text", "text": ""})
            for piece in self.fake._pieces_of(text):
                await self.send("content_block_delta", index=self.index, delta={"type": "text_delta", "text": piece})

    async def _block(self, start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        await self.send("content_block_start", index=self.index, content_block=start)
        for delta in deltas:
            await self.send("content_block_delta", index=self.index, delta=delta)
        await self.send("content_block_stop", index=self.index)
        self.index += 1

    async def reply(self, reply: Reply) -> None:
        pieces = self.fake._pieces_of
        thinking: list[dict[str, Any]] = []
        if reply.reasoning and (self.body.get("thinking") or {}).get("type") == "enabled":
            thought = reply.reasoning
            deltas = [{"type": "thinking_delta", "thinking": p} for p in pieces(thought)]
            sealed = signature(thought)
            await self._block(
                {"type": "thinking", "thinking": "", "signature": ""},
                [*deltas, {"type": "signature_delta", "signature": sealed}],
            )
            thinking.append({"type": "thinking", "thinking": thought, "signature": sealed})
            if reply.reasoning_field == "redacted":  # and a redacted block beside it, as the API may add
                block = {"type": "redacted_thinking", "data": "EncryptedFakeData" + sealed}
                await self._block(block, [])
                thinking.append(block)
        if reply.text:
            await self._block(
                {"type": "text", "text": ""}, [{"type": "text_delta", "text": p} for p in pieces(reply.text)]
            )
        for call in reply.tool_calls:
            call_id = await self._tool_use(call)
            self.fake.issued[call_id] = thinking
        reason = reply.finish_reason or ("tool_use" if reply.tool_calls else "end_turn")
        reason = {
            "stop": "end_turn",
            "length": "max_tokens",
            "tool_calls": "tool_use",
            "content_filter": "refusal",
        }.get(reason, reason)
        output = (len(reply.text) + len(reply.reasoning)) // 4 + 1
        usage = {"output_tokens": output} if self.fake.usage_at_start else {**self.usage, "output_tokens": output}
        if reply.usage is not None:
            usage = reply.usage
        await self.send("message_delta", delta={"stop_reason": reason, "stop_sequence": None}, usage=usage)
        await self.send("message_stop")

    async def _tool_use(self, call: FakeToolCall) -> str:
        call_id = call.id or f"toolu_fake{self.fake.next_id()}"
        arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
        start = {"type": "tool_use", "id": call_id, "name": call.name, "input": {}}
        await self._block(
            start, [{"type": "input_json_delta", "partial_json": p} for p in self.fake._pieces_of(arguments)]
        )
        return call_id


def thinking_blocks(request: dict[str, Any]) -> list[dict[str, Any]]:
    """Every thinking block a request sent back, in order."""
    return [
        b
        for m in request["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") in THINKING
    ]


def user_texts(request: dict[str, Any]) -> list[str]:
    """The user's words of a request (text blocks of user messages, tool results left out)."""
    found = []
    for message in request["messages"]:
        if message["role"] != "user":
            continue
        content = message["content"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        found += [b["text"] for b in blocks if b.get("type") == "text"]
    return found
