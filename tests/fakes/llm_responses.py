"""A scripted OpenAI Responses API server (`POST /v1/responses`), strict and hostile.

    async with FakeResponses() as llm:
        llm.tool_call("clock", {}, id="call_1", reasoning="The clock tool knows.")
        llm.reply("It is noon.")
        client = LLMClient(LLMConfig(base_url=llm.base_url, api="responses", reasoning="low"))

It is scripted like the Chat Completions fake (`fakes/llm.py`: `reply`, `tool_call`, `error`,
`stall`, `truncate`, `mid_stream_error`, `raw`, a `responder`) and plays each item as the
Responses API streams it: `event:` and `data:` lines in the documented order only
(`response.created`, `response.in_progress`, then per output item `output_item.added`, its
parts and deltas, `output_item.done`; then `response.completed`, or `response.incomplete` when
`max_output_tokens` cut the reply), usage only in the final response. A reply with `reasoning`
starts with a reasoning item whose `encrypted_content` (only when the request includes
`reasoning.encrypted_content`) is sealed: the next rounds of the turn must send it back as it
was, before its function call, or the request is refused (`fakes/responses_rules.py`), as
OpenAI refuses it. The cached tokens are the prefix shared with the previous request of the
same `prompt_cache_key` (at least 1,024 tokens, in steps of 128, 4 characters a token).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from dataclasses import replace
from typing import Any

from aiohttp import web

from fakes.llm import FakeLLM, FakeToolCall, Hold, HttpError, MidStreamError, Raw, Reply, ScriptItem, Stall, Truncate
from fakes.responses_rules import request_problem, sealed

CACHE_MIN_TOKENS = 1024
CACHE_STEP_TOKENS = 128
ERROR_CODES = {429: "rate_limit_exceeded", 500: "server_error", 503: "server_is_overloaded", 400: "invalid_prompt"}


class FakeResponses(FakeLLM):
    """The Chat Completions fake's scripting and discovery, speaking the Responses API."""

    settings: dict[str, Any] = {"api": "responses"}  # noqa: RUF012

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.issued: dict[str, dict[str, Any]] = {}  # reasoning item id -> the item as sent
        self.reasoned: dict[str, list[str]] = {}  # call_id -> the reasoning items before it
        self.accepted = 0  # requests that passed every check
        self._cache_prefix: dict[str, str] = {}  # prompt_cache_key -> the last prompt's text

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self._handle)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        try:
            body = await request.json()
        except ValueError:
            return self._reject("We could not parse the JSON body of your request.", param="body")
        self.requests.append(body)
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            error = {
                "message": "Incorrect API key provided.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
            return web.json_response({"error": error}, status=401)
        if problem := request_problem(body, self.issued, self.reasoned):
            return self._reject(problem, param="input")
        self.accepted += 1
        item = self._script.popleft() if self._script else self.responder(body)
        if inspect.isawaitable(item):
            item = await item
        return await self._play(request, body, item)

    async def _play(self, request: web.Request, body: dict[str, Any], item: ScriptItem) -> web.StreamResponse:
        if isinstance(item, HttpError):
            payload = item.body if isinstance(item.body, dict) else {"error": item.body}
            return web.json_response(payload, status=item.status, headers=item.headers)
        stream = _ResponseStream(self, await self._open(request), body, getattr(item, "model", None))
        if isinstance(item, Raw):
            for line in item.lines:
                await stream.response.write(line.encode() + b"\n")
            return stream.response
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
            await stream.error(item.error)
        elif isinstance(item, Truncate):
            await stream.partial_text(item.text)
        return stream.response

    def _pieces_of(self, text: str) -> list[str]:
        size = max(1, self.chunk_chars)
        return [text[i : i + size] for i in range(0, len(text), size)]

    def cache_tokens(self, body: dict[str, Any], prompt: str) -> tuple[int, int]:
        """(read, written): the prefix this prompt shares with the last one of its cache key, and
        what it adds to the cache, as a provider bills them (in steps of 128 tokens from 1,024)."""
        key = body.get("prompt_cache_key")
        if not isinstance(key, str):
            return 0, 0
        before, self._cache_prefix[key] = self._cache_prefix.get(key, ""), prompt
        shared = 0
        for a, b in zip(before, prompt, strict=False):
            if a != b:
                break
            shared += 1
        read, whole = _cacheable(shared // 4), _cacheable(len(prompt) // 4)
        return read, max(0, whole - read)


class _ResponseStream:
    """Writes the typed events of one response."""

    def __init__(self, fake: FakeResponses, response: web.StreamResponse, body: dict[str, Any], model: str | None):
        self.fake = fake
        self.response = response
        self.body = body
        self.model = model or str(body.get("model", ""))
        self.id = f"resp_fake{fake.next_id()}"
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self._open_message: dict[str, Any] | None = None  # a partial text being streamed (Stall, Truncate)

    async def send(self, kind: str, **fields: Any) -> None:
        if self.fake.delay:
            await asyncio.sleep(self.fake.delay)
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        await self.response.write(f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode())

    def snapshot(self, status: str, **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": 0,
            "status": status,
            "model": self.model,
            "instructions": self.body.get("instructions"),
            "tools": self.body.get("tools") or [],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "output": list(self.output),
            "usage": None,
            "error": None,
            "incomplete_details": None,
            **extra,
        }

    async def start(self) -> None:
        await self.send("response.created", response=self.snapshot("in_progress"))
        await self.send("response.in_progress", response=self.snapshot("in_progress"))

    async def partial_text(self, text: str) -> None:
        """The start of a message whose stream is then cut, stalled or failed."""
        if text:
            await self._message_start()
            for piece in self.fake._pieces_of(text):
                await self.send(
                    "response.output_text.delta", **self._where(), content_index=0, delta=piece, logprobs=[]
                )

    async def error(self, error: dict[str, Any]) -> None:
        code = error.get("code")
        code = ERROR_CODES.get(code, "server_error") if isinstance(code, int) else code
        await self.send("error", code=code, message=error.get("message", "error"), param=None)

    async def reply(self, reply: Reply) -> None:
        limit = self.body.get("max_output_tokens")
        cut = isinstance(limit, int) and not reply.tool_calls and len(reply.text) > limit * 4
        if cut:
            reply = replace(reply, text=reply.text[: limit * 4], finish_reason="length")
        reasoning_ids = [await self._reasoning(reply.reasoning)] if reply.reasoning else []
        if reply.text:
            await self._message(reply.text)
        for call in reply.tool_calls:
            call_id = await self._function_call(call)
            self.fake.reasoned[call_id] = reasoning_ids
        usage = reply.usage or self._usage(reply)
        if cut or reply.finish_reason == "length":
            details = {"reason": "max_output_tokens"}
            response = self.snapshot("incomplete", usage=usage, incomplete_details=details)
            await self.send("response.incomplete", response=response)
        else:
            await self.send("response.completed", response=self.snapshot("completed", usage=usage))

    # -- items --

    def _where(self) -> dict[str, Any]:
        item = self.output[-1]
        return {"item_id": item["id"], "output_index": len(self.output) - 1}

    async def _added(self, item: dict[str, Any]) -> None:
        self.output.append(item)
        await self.send("response.output_item.added", output_index=len(self.output) - 1, item=item)

    async def _done(self, item: dict[str, Any]) -> None:
        self.output[-1] = item
        await self.send("response.output_item.done", output_index=len(self.output) - 1, item=item)

    async def _reasoning(self, summary: str) -> str:
        item_id = f"rs_fake{self.fake.next_id()}"
        await self._added({"id": item_id, "type": "reasoning", "summary": []})
        await self.send(
            "response.reasoning_summary_part.added",
            **self._where(),
            summary_index=0,
            part={"type": "summary_text", "text": ""},
        )
        for piece in self.fake._pieces_of(summary):
            await self.send("response.reasoning_summary_text.delta", **self._where(), summary_index=0, delta=piece)
        await self.send("response.reasoning_summary_text.done", **self._where(), summary_index=0, text=summary)
        part = {"type": "summary_text", "text": summary}
        await self.send("response.reasoning_summary_part.done", **self._where(), summary_index=0, part=part)
        item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": [part]}
        if "reasoning.encrypted_content" in (self.body.get("include") or ()):
            item["encrypted_content"] = sealed(item_id, summary)
            self.fake.issued[item_id] = item
        await self._done(item)
        return item_id

    async def _message_start(self) -> None:
        item = {
            "id": f"msg_fake{self.fake.next_id()}",
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        await self._added(item)
        part = {"type": "output_text", "text": "", "annotations": []}
        await self.send("response.content_part.added", **self._where(), content_index=0, part=part)

    async def _message(self, text: str) -> None:
        await self._message_start()
        for piece in self.fake._pieces_of(text):
            await self.send("response.output_text.delta", **self._where(), content_index=0, delta=piece, logprobs=[])
        await self.send("response.output_text.done", **self._where(), content_index=0, text=text, logprobs=[])
        part = {"type": "output_text", "text": text, "annotations": []}
        await self.send("response.content_part.done", **self._where(), content_index=0, part=part)
        await self._done({**self.output[-1], "status": "completed", "content": [part]})

    async def _function_call(self, call: FakeToolCall) -> str:
        call_id = call.id or f"call_{self.fake.next_id()}"
        arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
        item = {
            "id": f"fc_fake{self.fake.next_id()}",
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id,
            "name": call.name,
            "arguments": "",
        }
        await self._added(item)
        for piece in self.fake._pieces_of(arguments):
            await self.send("response.function_call_arguments.delta", **self._where(), delta=piece)
        await self.send("response.function_call_arguments.done", **self._where(), arguments=arguments)
        await self._done({**item, "status": "completed", "arguments": arguments})
        return call_id

    def _usage(self, reply: Reply) -> dict[str, Any]:
        """4 characters a token; the cached part as the provider would bill it."""
        prompt_text = json.dumps([self.body.get("instructions"), self.body.get("tools"), self.body.get("input")])
        prompt = len(prompt_text) // 4 + 1
        read, written = self.fake.cache_tokens(self.body, prompt_text)
        reasoning = len(reply.reasoning) // 4
        arguments = sum(len(json.dumps(c.arguments)) for c in reply.tool_calls)
        output = (len(reply.text) + arguments) // 4 + reasoning + 1
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": read, "cache_write_tokens": written},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + output,
        }


def _cacheable(tokens: int) -> int:
    return tokens - tokens % CACHE_STEP_TOKENS if tokens >= CACHE_MIN_TOKENS else 0
