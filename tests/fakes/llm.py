"""A scripted OpenAI-compatible Chat Completions server (aiohttp, 127.0.0.1, random port).

    async with FakeLLM() as llm:
        llm.tool_call("clock", {}, id="call_1")
        llm.reply("It is noon.")
        client = LLMClient(LLMConfig(base_url=llm.base_url))

Each POST to `/v1/chat/completions` plays the next scripted item; with an empty script the
`responder(request_json)` decides (default: reply "ok"), so long tests and benchmarks can run
forever. Streams look like real servers: a `: ping` comment, content in small pieces, tool-call
deltas split across chunks (id and name first, then argument fragments), a finish chunk, a usage
chunk with `choices: []` when `stream_options.include_usage` is set, then `data: [DONE]`.
Malformed requests are rejected with 400 like strict providers, and so are the role orders a
strict chat template raises on (see `fakes/llm_rules.py`); `template_errors="empty_stream"`
answers those the way llama.cpp does: a 200 with no chunk, then a closed connection.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from aiohttp import web

from fakes.llm_discovery import DiscoveryEndpoints, ServerKind
from fakes.llm_rules import NullContent, null_content_problem, request_problem, template_problem
from fakes.llm_speech import SpeechServer

TemplateErrors = Literal["400", "empty_stream"]


@dataclass(frozen=True)
class FakeToolCall:
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str = ""


@dataclass(frozen=True)
class Reply:
    """A streamed answer: reasoning first, then text, then tool calls."""

    text: str = ""
    reasoning: str = ""
    reasoning_field: str = "reasoning_content"  # llama.cpp; vLLM uses "reasoning"
    tool_calls: tuple[FakeToolCall, ...] = ()
    finish_reason: str | None = None  # default: tool_calls when there are calls, else stop
    usage: dict[str, Any] | None = None  # replaces the computed usage object
    model: str | None = None  # the model name reported in chunks (default: the requested one)
    # A recorded final chunk (a server's own body, its `usage` and whatever else it sends beside
    # it, such as llama.cpp's `timings`), sent as it is in place of the computed usage chunk.
    final_chunk: dict[str, Any] | None = None


@dataclass(frozen=True)
class HttpError:
    status: int
    body: dict[str, Any] | str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Stall:
    """Start streaming `text`, then send nothing until the client disconnects."""

    text: str = ""


@dataclass(frozen=True)
class Hold:
    """Stream `text`, wait until `released` is set, then finish with `rest` (a stream held up
    server-side: the client is left waiting mid-reply, as for a stalled process)."""

    text: str
    rest: Reply
    released: asyncio.Event = field(compare=False, default_factory=asyncio.Event)


@dataclass(frozen=True)
class MidStreamError:
    """Stream `text`, then `data: {"error": ...}` and end (llama.cpp and vLLM style)."""

    error: dict[str, Any]
    text: str = ""


@dataclass(frozen=True)
class Truncate:
    """Stream `text` and end cleanly without a finish reason or [DONE]."""

    text: str = ""


@dataclass(frozen=True)
class Raw:
    """Send these SSE lines verbatim (each followed by a newline)."""

    lines: tuple[str, ...]


ScriptItem = Reply | HttpError | Stall | Hold | MidStreamError | Truncate | Raw
# A responder may be async: it can hold its answer until something else happened.
Responder = Callable[[dict[str, Any]], ScriptItem | Awaitable[ScriptItem]]


def default_responder(request: dict[str, Any]) -> ScriptItem:
    return Reply("ok")


class FakeLLM(DiscoveryEndpoints):
    settings: dict[str, Any] = {}  # the `llm` settings that speak this fake's API (beside base_url)
    def __init__(
        self, *, responder: Responder = default_responder, delay: float = 0.0, api_key: str | None = None,
        chunk_chars: int = 8, pings: bool = True, template_errors: TemplateErrors = "400",
        null_content: NullContent = "reject", usage_chunks: bool = True,
        server_kind: ServerKind = "vllm", context_window: int = 131_072, ollama_num_ctx: int | None = None,
    ) -> None:
        self.responder = responder
        self.delay = delay  # seconds before each chunk; 0 for benchmarks
        self.api_key = api_key  # when set, requests need `Authorization: Bearer <api_key>`
        self.chunk_chars = chunk_chars
        self.pings = pings
        self.template_errors = template_errors  # how a template refusal is answered
        self.null_content = null_content  # "reject": content null beside tool_calls is a 500
        self.usage_chunks = usage_chunks  # False: ignore stream_options.include_usage
        self.server_kind = server_kind  # which server's discovery endpoints answer (see `_discovery`)
        self.context_window = context_window
        self.ollama_num_ctx = ollama_num_ctx
        self.probes: list[str] = []  # paths of the discovery requests, in arrival order
        self.requests: list[dict[str, Any]] = []  # parsed JSON bodies, in arrival order
        self.headers: list[dict[str, str]] = []  # request headers, in arrival order
        self.rejections: list[str] = []  # why malformed requests were refused, in order
        self.disconnects = 0  # stalled streams the client walked away from
        self.disconnected = asyncio.Event()
        self.stalled = asyncio.Event()  # a Stall item has sent its text and is waiting
        self._script: deque[ScriptItem] = deque()
        self.transcripts: dict[bytes, str] = {}  # audio bytes -> the text /audio/transcriptions answers
        self.transcriptions: list[dict[str, Any]] = []  # model, filename, content type, bytes of each request
        self.transcription_failures = 0  # the next N transcription requests answer 500
        self.transcription_extra: dict[str, Any] = {}  # more of the answer: OpenAI's `usage`, verbose `duration`
        self.speech = SpeechServer(api_key=api_key)  # /audio/speech: its requests, failures, delay
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._closing = False
        self.base_url = ""

    # --- lifecycle ---

    async def __aenter__(self) -> FakeLLM:
        app = web.Application()
        self._routes(app)
        app.router.add_post("/v1/audio/transcriptions", self._transcribe)
        app.router.add_post("/v1/audio/speech", self.speech.handle)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/props", self._props)
        app.router.add_post("/api/show", self._ollama_show)
        app.router.add_get("/api/v0/models/{model:.+}", self._lmstudio_model)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}/v1"
        return self

    def _routes(self, app: web.Application) -> None:
        """The API the fake speaks (a fake of another API answers its own path instead)."""
        app.router.add_post("/v1/chat/completions", self._handle)

    async def __aexit__(self, *exc: object) -> None:
        self._closing = True
        if self._runner is not None:
            await self._runner.cleanup()

    # --- scripting ---

    @property
    def pending(self) -> int:
        return len(self._script)

    def push(self, *items: ScriptItem) -> None:
        self._script.extend(items)

    def reply(self, text: str = "ok", **options: Any) -> None:
        """Options: reasoning, reasoning_field, finish_reason, usage, model (see `Reply`)."""
        self.push(Reply(text, **options))

    def reasoning(self, thought: str, text: str = "", *, field: str = "reasoning_content") -> None:
        self.push(Reply(text, reasoning=thought, reasoning_field=field))

    def tool_call(
        self, name: str, arguments: dict[str, Any] | str, *, id: str = "", text: str = "", **options: Any
    ) -> None:
        self.push(Reply(text, tool_calls=(FakeToolCall(name, arguments, id),), **options))

    def tool_calls(self, *calls: FakeToolCall | tuple[Any, ...], text: str = "", **options: Any) -> None:
        """Several calls in one answer: `FakeToolCall`s or `(name, arguments[, id])` tuples."""
        specs = tuple(c if isinstance(c, FakeToolCall) else FakeToolCall(*c) for c in calls)
        self.push(Reply(text, tool_calls=specs, **options))

    def error(
        self,
        status: int,
        *,
        message: str | None = None,
        retry_after: float | None = None,
        retry_after_in: str = "header",
        code: str | int | None = None,
    ) -> None:
        """An HTTP error in OpenAI's shape. `retry_after_in`: header | body | error."""
        error: dict[str, Any] = {
            "message": message or f"fake error {status}",
            "type": _error_type(status),
            "code": code,
        }
        body: dict[str, Any] = {"error": error}
        headers: dict[str, str] = {}
        if retry_after is not None:
            if retry_after_in == "header":
                headers["Retry-After"] = _number(retry_after)
            elif retry_after_in == "body":
                body["retry_after"] = retry_after
            else:
                error["retry_after"] = retry_after
        self.push(HttpError(status, body, headers))

    def context_too_long(
        self,
        dialect: str = "openai",
        *,
        prompt_tokens: int = 9000,
        n_ctx: int = 8192,
        mid_stream: bool = False,
    ) -> None:
        """The context-overflow error of `dialect` (openai | llamacpp | vllm); `mid_stream`
        sends it as `data: {"error": ...}` after a 200, as llama.cpp can."""
        body = context_error_body(dialect, prompt_tokens, n_ctx)
        self.push(MidStreamError(body["error"]) if mid_stream else HttpError(400, body))

    def stall(self, text: str = "") -> None:
        self.push(Stall(text))

    def mid_stream_error(self, text: str = "partial ", *, message: str = "model crashed", code: int = 500) -> None:
        self.push(MidStreamError({"code": code, "message": message, "type": "server_error"}, text))

    def truncate(self, text: str = "partial ") -> None:
        self.push(Truncate(text))

    def raw(self, *lines: str) -> None:
        self.push(Raw(lines))

    async def wait_disconnect(self, timeout: float = 5.0) -> None:
        await asyncio.wait_for(self.disconnected.wait(), timeout)

    # --- serving ---

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        try:
            body = await request.json()
        except ValueError:
            return self._reject("the request body is not valid JSON")
        self.requests.append(body)
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            error = {
                "message": "Incorrect API key provided.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
            return web.json_response({"error": error}, status=401)
        if problem := request_problem(body):
            return self._reject(problem)
        if self.null_content == "reject" and (dump := null_content_problem(body["messages"])):
            self.rejections.append(dump)  # llama-cpp-python's shape: a 500 carrying pydantic's dump
            error = {"message": dump, "type": "internal_server_error", "param": None, "code": None}
            return web.json_response({"error": error}, status=500)
        if problem := template_problem(body):
            if self.template_errors == "empty_stream":
                return await self._empty_stream(request, problem)
            return self._reject(problem)
        item = self._script.popleft() if self._script else self.responder(body)
        if inspect.isawaitable(item):
            item = await item
        return await self._play(request, body, item)

    async def _transcribe(self, request: web.Request) -> web.Response:
        """OpenAI's /audio/transcriptions: multipart with `file` and `model`, answers {"text"}."""
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response(
                {"error": {"message": "Incorrect API key provided.", "code": "invalid_api_key"}}, status=401
            )
        if not request.content_type.startswith("multipart/form-data"):
            return self._reject("audio/transcriptions: the body must be multipart/form-data", param="file")
        form = await request.post()
        upload, model = form.get("file"), form.get("model")
        if not isinstance(upload, web.FileField):
            return self._reject("audio/transcriptions: file is required", param="file")
        if not isinstance(model, str) or not model:
            return self._reject("audio/transcriptions: model is required", param="model")
        audio = upload.file.read()
        self.transcriptions.append(
            {"model": model, "filename": upload.filename, "content_type": upload.content_type, "bytes": len(audio)}
        )
        if self.transcription_failures > 0:
            self.transcription_failures -= 1
            return web.json_response(
                {"error": {"message": "The server had an error", "type": "server_error"}}, status=500
            )
        if audio not in self.transcripts:
            return self._reject("audio/transcriptions: the audio could not be decoded", param="file")
        return web.json_response({"text": self.transcripts[audio], **self.transcription_extra})

    def _reject(self, problem: str, param: str = "messages") -> web.Response:
        self.rejections.append(problem)
        error = {"message": problem, "type": "invalid_request_error", "param": param, "code": None}
        return web.json_response({"error": error}, status=400)

    async def _play(self, request: web.Request, body: dict[str, Any], item: ScriptItem) -> web.StreamResponse:
        if isinstance(item, HttpError):
            payload = item.body if isinstance(item.body, dict) else {"error": item.body}
            return web.json_response(payload, status=item.status, headers=item.headers)
        stream = _Stream(self, await self._open(request), body, getattr(item, "model", None))
        if isinstance(item, Raw):
            for line in item.lines:
                await stream.write_line(line)
            return stream.response
        await stream.role()
        if isinstance(item, Reply):
            await stream.reply(item)
        elif isinstance(item, Stall):
            await stream.text(item.text)
            await self._stall(request)
        elif isinstance(item, Hold):
            await stream.text(item.text)
            self.stalled.set()
            await item.released.wait()
            await stream.reply(item.rest)
        elif isinstance(item, MidStreamError):
            await stream.text(item.text)
            await stream.send({"error": item.error})
        elif isinstance(item, Truncate):
            await stream.text(item.text)
        return stream.response

    async def _empty_stream(self, request: web.Request, problem: str) -> web.StreamResponse:
        """llama.cpp's answer to a template error or an over-long prompt: 200, then nothing."""
        self.rejections.append(problem)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        return response

    def empty_stream(self) -> None:
        """Answer the next request with llama.cpp's empty stream (a 200, then the end)."""
        self.push(Raw(()))

    async def _open(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        if self.pings:
            await response.write(b": ping\n\n")
        return response

    async def _stall(self, request: web.Request) -> None:
        """Wait for the client to go away, polling the connection (no bytes are sent)."""
        self.stalled.set()
        while not self._closing:
            transport = request.transport
            if transport is None or transport.is_closing():
                self.disconnects += 1
                self.disconnected.set()
                return
            await asyncio.sleep(0.005)

    def next_id(self) -> int:
        return next(self._ids)


class _Stream:
    """Writes chat.completion.chunk frames for one response."""

    def __init__(self, fake: FakeLLM, response: web.StreamResponse, body: dict[str, Any], model: str | None) -> None:
        self.fake = fake
        self.response = response
        self.body = body
        self.model = model or str(body.get("model", ""))
        self.id = f"chatcmpl-fake-{fake.next_id()}"
        self.with_usage = fake.usage_chunks and bool((body.get("stream_options") or {}).get("include_usage"))

    async def write_line(self, line: str) -> None:
        await self.response.write(line.encode() + b"\n")

    async def send(self, payload: dict[str, Any]) -> None:
        if self.fake.delay:
            await asyncio.sleep(self.fake.delay)
        await self.response.write(b"data: " + json.dumps(payload).encode() + b"\n\n")

    async def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> None:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        await self.send(self._frame([choice]))

    def _frame(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        frame: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
        }
        if self.with_usage:
            frame["usage"] = usage  # null on every chunk but the last, as OpenAI does
        return frame

    async def role(self) -> None:
        await self.chunk({"role": "assistant", "content": ""})

    async def text(self, text: str, key: str = "content") -> None:
        for piece in self._pieces(text):
            await self.chunk({key: piece})

    async def reply(self, reply: Reply) -> None:
        limit = self.body.get("max_tokens")
        if isinstance(limit, int) and not reply.tool_calls and len(reply.text) > limit * 4:
            # Like real servers: the reply stops at max_tokens (4 characters a token here).
            cut = reply.text[: limit * 4]
            reply = replace(reply, text=cut, tool_calls=(), finish_reason="length")
        await self.text(reply.reasoning, key=reply.reasoning_field)
        await self.text(reply.text)
        for index, call in enumerate(reply.tool_calls):
            await self._tool_call(index, call)
        reason = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        await self.chunk({}, reason)
        if reply.final_chunk is not None:
            await self.send(reply.final_chunk)
        elif self.with_usage:
            await self.send(self._frame([], reply.usage or self._usage(reply)))
        await self.write_line("data: [DONE]\n")

    async def _tool_call(self, index: int, call: FakeToolCall) -> None:
        call_id = call.id or f"call_{self.fake.next_id()}"
        head = {"index": index, "id": call_id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        await self.chunk({"tool_calls": [head]})
        arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
        for piece in self._pieces(arguments):
            await self.chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})

    def _pieces(self, text: str) -> list[str]:
        size = max(1, self.fake.chunk_chars)
        return [text[i : i + size] for i in range(0, len(text), size)]

    def _usage(self, reply: Reply) -> dict[str, Any]:
        """Rough token counts (4 characters a token) shaped like OpenAI's usage object."""
        prompt = len(json.dumps(self.body.get("messages", []))) // 4 + 1
        arguments = sum(len(json.dumps(c.arguments)) for c in reply.tool_calls)
        reasoning = len(reply.reasoning) // 4
        completion = (len(reply.text) + arguments) // 4 + reasoning + 1
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        }


# --- error bodies ---


def context_error_body(dialect: str, prompt_tokens: int, n_ctx: int) -> dict[str, Any]:
    if dialect == "openai":
        message = (
            f"This model's maximum context length is {n_ctx} tokens. However, your messages resulted in "
            f"{prompt_tokens} tokens. Please reduce the length of the messages."
        )
        return {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    if dialect == "llamacpp":
        message = (
            f"request ({prompt_tokens} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it"
        )
        return {
            "error": {
                "code": 400,
                "message": message,
                "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt_tokens,
                "n_ctx": n_ctx,
            }
        }
    if dialect == "vllm":
        message = (
            f"This model's maximum context length is {n_ctx} tokens. However, you requested "
            f"{prompt_tokens + 1000} tokens ({prompt_tokens} in the messages, 1000 in the completion). "
            "Please reduce the length of the messages or completion."
        )
        return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    raise ValueError(f"unknown context dialect {dialect!r}: expected openai, llamacpp or vllm")


def _error_type(status: int) -> str:
    if status in (401, 403):
        return "invalid_request_error"
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# --- reading requests ---

CONTEXT_TAIL = "[context] "  # how the gateway's per-round context note starts


def without_context(text: str) -> str:
    """A user message without the gateway's context note, which is joined to the last user
    message after a blank line (or stands alone after tool results)."""
    if text.startswith(CONTEXT_TAIL):
        return ""
    head, _, _ = text.partition("\n\n" + CONTEXT_TAIL)
    return head


def _text(content: str | list[dict[str, Any]]) -> str:
    """A message's text: a list of parts (images beside text) reads as its text parts joined."""
    if isinstance(content, str):
        return content
    return "\n\n".join(part["text"] for part in content if part.get("type") == "text")


def user_texts(request: dict[str, Any]) -> list[str]:
    """What people said in a request to the model (not the gateway's own context notes)."""
    if "input" in request:  # a Responses request
        from fakes.responses_rules import user_texts as responses_user_texts

        return responses_user_texts(request)
    said = (without_context(_text(m["content"])) for m in request["messages"] if m["role"] == "user")
    return [text for text in said if text]
