"""The streaming model client: request, retries, model fallback, whatever API each model speaks."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import httpx

from gateway.config import LLMConfig
from gateway.config.core import Api, Reasoning
from gateway.llm.discovery import ServerInfo, Tokenizer, Window
from gateway.llm.errors import (
    EmptyAnswer,
    ErrorKind,
    LLMError,
    LLMUnavailable,
    RateLimited,
    Refused,
    StreamInterrupted,
    classify_error,
)
from gateway.llm.events import Completion, ModelInfo, StreamEvent, Usage
from gateway.llm.formats import REPLAY_KEY, Request, StreamParser, WireFormat, format_for
from gateway.llm.gate import CallGate, Ticket
from gateway.llm.health import ServerHealth
from gateway.llm.pool import PER_CLIENT, ClientPool, Lane
from gateway.llm.speech import AudioFormat, Speech, request_speech
from gateway.llm.stream import ReadCadence, SSEDecoder, collect
from gateway.llm.wire import encode_body, json_or_text, tls_for, transport_error
from gateway.serving import metrics

log = logging.getLogger(__name__)

DEFAULT_CADENCE = ReadCadence()  # frozen: one instance serves every client
# A window the server did not say is asked again after this, doubling up to the cap: the
# server may have been down at start, and a fallback must not stick for the process's life.
FALLBACK_RETRY_S = 30.0
FALLBACK_RETRY_MAX_S = 900.0
EMPTY_ANSWERS_MEAN_REFUSED = 2  # the same body answered by an empty stream this often will be again
REFUSED_EMPTY = (
    "the LLM server answered twice with an empty stream for {model} and gave no reason; llama.cpp does "
    "this when the model's chat template refuses the conversation or the prompt is over its context "
    "(its log says which)"
)


@dataclass(frozen=True)
class RetryNotice:
    """Passed to `on_retry` before each new attempt. `next_model` differs from `model` when the
    client falls back; `delay_s` is the wait before the next attempt."""

    attempt: int
    model: str
    next_model: str
    delay_s: float
    error: LLMError
    kind: Literal["retry"] = "retry"


RetryHook = Callable[[RetryNotice], Awaitable[None] | None]


@dataclass
class _Opened:
    """A response that has produced its first events; the rest is still to be read."""

    response: httpx.Response
    lane: Lane  # the client it came on, given back when the stream ends
    pool: ClientPool  # ... to this pool (its server's)
    sse: SSEDecoder
    parser: StreamParser
    first_events: list[StreamEvent]
    info: ModelInfo
    ticket: Ticket | None = None


@dataclass
class _Server:
    """One model server in one API: its URL, its pool of HTTP clients, what it says of its models."""

    base_url: str
    format: WireFormat
    url: str
    endpoint: httpx.URL  # parsed once, not on every request
    clients: ClientPool
    info: ServerInfo
    health: ServerHealth = field(default_factory=ServerHealth)  # its last answer and last error


@dataclass(frozen=True)
class _Target:
    """A model as calls name it (`name`: `llm.model` for the default, else a name of
    `llm.models`), the model name its server is asked for, and that server."""

    name: str
    model: str
    server: _Server
    reasoning: Reasoning = "auto"
    cache_key: bool = False  # the session goes as the API's prompt cache key


def takes_cache_key(setting: bool | None, base_url: str) -> bool:
    """`prompt_cache_key`: as configured, else only OpenAI's own API (another server may refuse
    an unknown field)."""
    if setting is not None:
        return setting
    return httpx.URL(base_url).host == "api.openai.com"


@dataclass(frozen=True)
class Transcript:
    text: str
    seconds: float | None  # the audio's length as the server measured it, else as the platform said


class LLMClient:
    """Streaming calls to `llm.base_url` and the servers of `llm.models`, each in its `api`
    (gateway/llm/formats/), with retries and the fallback through `llm.fallback`.

    `sleep`, `clock` and `rng` are injectable so tests can observe waits without waiting.
    """

    def __init__(
        self,
        config: LLMConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        on_retry: RetryHook | None = None,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        cadence: ReadCadence = DEFAULT_CADENCE,
        streams_per_client: int = PER_CLIENT,
    ) -> None:
        self.config = config
        self.cadence = cadence
        timeout = httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s)
        # No cap on connections: the inbox bounds how many turns (so streams) run at once, and a
        # pool smaller than that would make turns wait for a connection, then time out. Each
        # lane of the pool carries at most `streams_per_client`, so keeps at most that many idle.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        servers: dict[tuple[str, str, str], _Server] = {}

        def server(base_url: str, api_key: str, api: Api) -> _Server:
            key = (base_url.rstrip("/"), api_key, api)
            if key not in servers:
                wire = format_for(api)
                url = key[0] + wire.path
                headers = wire.headers(api_key)
                pool = ClientPool(
                    lambda verify: httpx.AsyncClient(
                        transport=transport, timeout=timeout, headers=headers, limits=limits, verify=verify
                    ),
                    tls_for(url),
                    streams_per_client,
                )
                info = ServerInfo(lambda: pool.first, base_url)
                servers[key] = _Server(base_url, wire, url, httpx.URL(url), pool, info)
            return servers[key]

        default = server(config.base_url, config.api_key, config.api)
        cache_key = takes_cache_key(config.prompt_cache_key, config.base_url)
        self._targets = {config.model: _Target(config.model, config.model, default, config.reasoning, cache_key)}
        for name, named in config.models.items():
            same_server = not named.base_url or named.base_url.rstrip("/") == config.base_url.rstrip("/")
            key = named.api_key or (config.api_key if same_server else "")
            base_url = named.base_url or config.base_url
            self._targets[name] = _Target(
                name,
                named.model,
                server(base_url, key, config.api_of(name)),
                named.reasoning,
                takes_cache_key(named.prompt_cache_key, base_url),
            )
        self._servers = list(servers.values())
        self._default = default
        self.url = default.url
        self._clients = default.clients
        self.server = default.info
        self._on_retry = on_retry
        self._backoff_base = backoff_base_s
        self._backoff_max = backoff_max_s
        self._sleep = sleep
        self._clock = clock
        self._rng = rng or random.Random()
        self._windows: dict[str, Window] = {}
        self._ask_again: dict[str, tuple[float, float]] = {}  # after a fallback: (when to ask, the wait)
        self._tokenizer: Tokenizer | None = None
        self._tokenizer_known = False
        self._discovery = asyncio.Lock()  # one probe per model, however many turns ask at once
        self.gate: CallGate | None = None  # checked before every request (the spend caps)
        self.streams_in_flight = 0
        self.pauses = 0  # waits taken by the read cadence

    async def context_window(self, model: str | None = None) -> Window:
        """The model's context window as its server says it: asked once and cached; the
        fallback only for a while, in case the server was down when asked."""
        target = self._target(model)
        model = target.name
        async with self._discovery:
            cached = self._windows.get(model)
            if cached is None or (not cached.discovered and self._clock() >= self._ask_again[model][0]):
                found = self._windows[model] = await target.server.info.window(target.model)
                if found.discovered:
                    target.server.health.answered()
                self._note_window(model, cached, found)
                cached = found
            return cached

    def _note_window(self, model: str, before: Window | None, found: Window) -> None:
        if before is not None and found.discovered:
            log.info("context window of %s: now %s tokens (was the fallback %s)", model, found.tokens, before.tokens)
        elif not found.discovered:
            wait = FALLBACK_RETRY_S if before is None else min(self._ask_again[model][1] * 2, FALLBACK_RETRY_MAX_S)
            self._ask_again[model] = (self._clock() + wait, wait)

    async def window_tokens(self, model: str) -> int:
        return (await self.context_window(model)).tokens

    def known_window(self, model: str | None = None) -> Window | None:
        """The window found for the model so far, without asking its server (None: not asked yet)."""
        return self._windows.get(self._target(model).name)

    def health_of(self, model: str | None = None) -> ServerHealth:
        """The last answer and last error of the model's server (gateway/llm/health.py)."""
        return self._target(model).server.health

    def base_url_of(self, model: str | None = None) -> str:
        return self._target(model).server.base_url

    async def count_tokens(self, text: str, model: str | None = None) -> int | None:
        """Tokens of `text` by the server's own tokenizer; None when it has none."""
        async with self._discovery:
            if not self._tokenizer_known:
                self._tokenizer = await self.server.tokenizer()
                self._tokenizer_known = True
        if self._tokenizer is None:
            return None
        target = self._target(model)
        if target.server is not self._default:
            return None  # the default server's tokenizer does not count another model's tokens
        try:
            return await self.server.count(self._tokenizer, text, target.model)
        except (httpx.HTTPError, ValueError):
            return None

    @property
    def _http(self) -> httpx.AsyncClient:
        return self._clients.first

    async def aclose(self) -> None:
        for server in self._servers:
            await server.clients.aclose()

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        on_retry: RetryHook | None = None,
        fallback: Sequence[str] | None = None,
        cache_key: str | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """`cache_key`: the session's, sent as the API's prompt cache key to the models that take one."""
        request = Request(messages, tools, max_tokens or self.config.max_tokens, self.config.temperature)
        sent = time.monotonic()
        opened = await self._open(_Bodies(request, cache_key), self._chain(model, fallback), on_retry or self._on_retry)
        metrics.LLM_FIRST_TOKEN.observe(time.monotonic() - sent)
        usage: Usage | None = None
        self.streams_in_flight += 1
        opened.sse.before_read = self._read_cadence
        try:
            yield opened.info
            for event in opened.first_events:
                usage = event if isinstance(event, Usage) else usage
                _count_tokens(event)
                yield event
            while (payload := await self._next_payload(opened.sse)) is not None:
                for event in opened.parser.feed(payload):
                    usage = event if isinstance(event, Usage) else usage
                    _count_tokens(event)
                    yield event
            metrics.LLM_TOTAL.observe(time.monotonic() - sent)
            if not (opened.sse.done or opened.parser.finished):
                raise StreamInterrupted("the LLM stream ended before the answer was complete")
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):  # unlike wait_for, no task per request
                    await opened.sse.drain()
        finally:
            self.streams_in_flight -= 1
            opened.pool.give_back(opened.lane)  # first: a close that fails must not keep its place
            await opened.response.aclose()  # also aborts generation when the consumer stops early
            if opened.ticket is not None:
                await asyncio.shield(opened.ticket.settle(usage, sent=True))

    async def _read_cadence(self) -> None:
        """Before each read of a body after its first events (none with few streams in flight)."""
        if (interval := self.cadence.interval(self.streams_in_flight)) > 0:
            self.pauses += 1
            await asyncio.sleep(interval)

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        on_retry: RetryHook | None = None,
    ) -> Completion:
        return await collect(self.stream(messages, tools, model=model, max_tokens=max_tokens, on_retry=on_retry))

    async def transcribe(
        self, audio: bytes, filename: str, mime: str, *, model: str | None = None, seconds: float | None = None
    ) -> Transcript:
        """Speech to text: POST {base_url}/audio/transcriptions (multipart, OpenAI's shape);
        `LLMError` when the server refuses or cannot be reached. The spend caps are asked first
        (`seconds`: the audio's length as the platform said it, for the reservation)."""
        model = model or self.config.transcription_model
        ticket = await self.gate.open_minutes(model, seconds, len(audio)) if self.gate is not None else None
        try:
            text, measured = await self._transcribe(audio, filename, mime, model)
        except BaseException:
            if ticket is not None:
                await asyncio.shield(ticket.settle_minutes(None, sent=False))
            raise
        heard = measured if measured is not None else seconds
        if ticket is not None:
            await asyncio.shield(ticket.settle_minutes(heard, sent=True))
        return Transcript(text, heard)

    async def speak(self, text: str, *, voice: str, audio_format: AudioFormat, timeout_s: float) -> Speech:
        """Text to speech with `llm.speech_model` (gateway/llm/speech.py): the spend caps are
        asked first, priced by the character; `LLMError` or `BudgetReached` when it is not made."""
        model = self.config.speech_model
        base_url, api_key = self.config.speech_server()
        ticket = await self.gate.open_chars(model, len(text)) if self.gate is not None else None
        try:
            speech = await request_speech(
                self._http,
                base_url,
                api_key,
                model=model,
                text=text,
                voice=voice,
                audio_format=audio_format,
                timeout_s=timeout_s,
            )
        except BaseException:
            if ticket is not None:
                await asyncio.shield(ticket.settle_chars(0, sent=False))
            raise
        if ticket is not None:
            await asyncio.shield(ticket.settle_chars(speech.chars, sent=True))
        return speech

    async def _transcribe(self, audio: bytes, filename: str, mime: str, model: str) -> tuple[str, float | None]:
        url = self.config.base_url.rstrip("/") + "/audio/transcriptions"
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        # Built outside the client: its default JSON content type must not replace the multipart one.
        request = httpx.Request(
            "POST",
            url,
            headers=headers,
            data={"model": model, "response_format": "json"},
            files={"file": (filename, audio, mime or "application/octet-stream")},
        )
        try:
            response = await self._http.send(request)
        except httpx.TransportError as exc:
            raise transport_error(exc, url) from exc
        body = json_or_text(response.content)
        if response.status_code != 200:
            raise classify_error(response.status_code, body, response.headers)
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            raise LLMError(f"the transcription answer has no text: {str(body)[:200]}", kind="server")
        return body["text"], audio_seconds(body)

    def _target(self, model: str | None) -> _Target:
        """A configured name, or another model of the default server (as `gateway doctor` asks)."""
        name = model or self.config.model
        return self._targets.get(name) or _Target(name, name, self._default)

    def _chain(self, model: str | None, fallback: Sequence[str] | None = None) -> list[_Target]:
        """The model asked for, then `fallback` (`llm.fallback` when not given: a turn gives the
        part of it its person's role allows)."""
        first = self._target(model)
        names = self.config.fallback if fallback is None else fallback
        return [first] + [self._targets[name] for name in names if name != first.name]

    async def _open(self, bodies: _Bodies, targets: list[_Target], on_retry: RetryHook | None) -> _Opened:
        """Try each model in turn (the one asked for, then `llm.fallback`), retrying retryable
        failures with backoff, until one starts streaming; raise `LLMUnavailable` once retries
        or the budget are spent. A failure that is not retryable (a prompt over the context, a
        refused key, a bad request) is raised at once: another model would not help."""
        started = self._clock()
        attempts = 0
        last: LLMError | None = None
        for position, target in enumerate(targets):
            empty = 0
            failed = tuple(t.name for t in targets[:position])
            for retry in range(self.config.max_retries + 1):
                attempts += 1
                try:
                    opened = await self._attempt(bodies, target, attempts, failed)
                    target.server.health.answered()
                    return opened
                except LLMError as exc:
                    target.server.health.failed(exc)
                    if not exc.retryable:
                        raise
                    last = exc
                    empty += isinstance(exc, EmptyAnswer)
                    if empty >= EMPTY_ANSWERS_MEAN_REFUSED:
                        raise Refused(REFUSED_EMPTY.format(model=target.model)) from exc
                delay = self._delay(last, retry)
                if retry >= self.config.max_retries or self._spent(started) + delay > self.config.retry_budget_s:
                    break
                await self._notify(on_retry, RetryNotice(attempts, target.name, target.name, delay, last))
                await self._sleep(delay)
            has_next = position + 1 < len(targets)
            if not has_next or self._spent(started) >= self.config.retry_budget_s:
                break
            assert last is not None  # every attempt that did not return failed with a retryable error
            await self._notify(on_retry, RetryNotice(attempts, target.name, targets[position + 1].name, 0.0, last))
        assert last is not None
        tried = tuple(t.name for t in targets[: position + 1])
        raise LLMUnavailable(
            f"LLM unavailable after {attempts} attempt(s) (models tried: {', '.join(tried)}): {last.message}",
            tried=tried,
            last_error=last,
        ) from last

    async def _attempt(self, bodies: _Bodies, target: _Target, attempts: int, failed: tuple[str, ...]) -> _Opened:
        body = bodies.of(target)
        content = encode_body(body)
        gate = self.gate
        limit_key = target.server.format.limit_key
        ticket = await gate.open(target.name, len(content), body.get(limit_key)) if gate is not None else None
        if ticket is not None and ticket.reply_tokens is not None and limit_key not in body:
            content = encode_body(bodies.of(target, ticket.reply_tokens))  # the reply the reservation covers
        try:
            opened = await self._send(content, target, attempts, failed)
        except BaseException:
            if ticket is not None:
                await asyncio.shield(ticket.settle(None, sent=False))
            raise
        opened.ticket = ticket
        return opened

    async def _send(self, content: bytes, target: _Target, attempts: int, failed: tuple[str, ...]) -> _Opened:
        pool = target.server.clients
        lane = pool.take()
        try:
            return await self._send_on(lane, pool, content, target, ModelInfo(target.name, "", attempts, failed))
        except BaseException:
            pool.give_back(lane)
            raise

    async def _send_on(
        self, lane: Lane, pool: ClientPool, content: bytes, target: _Target, info: ModelInfo
    ) -> _Opened:
        server = target.server
        request = lane.client.build_request("POST", server.endpoint, content=content)
        try:
            response = await lane.client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise transport_error(exc, server.url) from exc
        try:
            wire = server.format
            if response.status_code != 200:
                raise wire.classify(response.status_code, json_or_text(await response.aread()), response.headers)
            sse, parser = SSEDecoder(response.aiter_bytes(), wire.classify), wire.parser()
            served, events = await self._first_events(sse, parser)
            return _Opened(response, lane, pool, sse, parser, events, replace(info, served=served))
        except httpx.TransportError as exc:
            await response.aclose()
            raise transport_error(exc, server.url) from exc
        except BaseException:
            await response.aclose()
            raise

    @staticmethod
    async def _first_events(sse: SSEDecoder, parser: StreamParser) -> tuple[str, list[StreamEvent]]:
        """Read until a chunk says something (a role-only chunk does not), so an error sent
        right after the 200 can still be retried or fall back."""
        while (payload := await sse.next()) is not None:
            if events := parser.feed(payload):
                return str(payload.get("model") or getattr(parser, "served", "") or ""), events
        raise EmptyAnswer("the LLM server ended the stream without an answer")

    async def _next_payload(self, sse: SSEDecoder) -> dict[str, Any] | None:
        try:
            return await sse.next()
        except httpx.TransportError as exc:
            kind: ErrorKind = "timeout" if isinstance(exc, httpx.TimeoutException) else "connection"
            raise StreamInterrupted(f"the LLM stream broke off: {exc or type(exc).__name__}", kind=kind) from exc

    def _delay(self, error: LLMError, retry: int) -> float:
        """Retry-After plus up to 10% jitter when the server says; else jittered exponential."""
        if isinstance(error, RateLimited) and error.retry_after is not None:
            return error.retry_after * (1 + self._rng.uniform(0, 0.1))
        backoff = min(self._backoff_max, self._backoff_base * 2**retry)
        return backoff * self._rng.uniform(0.5, 1.0)

    def _spent(self, started: float) -> float:
        return self._clock() - started

    @staticmethod
    async def _notify(hook: RetryHook | None, notice: RetryNotice) -> None:
        metrics.LLM_RETRIES.labels("fallback" if notice.next_model != notice.model else "retry").inc()
        if hook is not None and inspect.isawaitable(result := hook(notice)):
            await result


def audio_seconds(body: dict[str, Any]) -> float | None:
    """The audio's length in a transcription answer: `duration` (verbose_json, whisper.cpp,
    faster-whisper) or OpenAI's `usage: {"type": "duration", "seconds": N}`."""
    usage = body.get("usage")
    for value in (body.get("duration"), usage.get("seconds") if isinstance(usage, dict) else None):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return float(value)
    return None


def _count_tokens(event: StreamEvent) -> None:
    if isinstance(event, Usage):
        metrics.TOKENS.labels("in").inc(event.prompt_tokens)
        metrics.TOKENS.labels("out").inc(event.completion_tokens)


class _Bodies:
    """One call's request bodies, built once per API and model options (a fallback to a model of
    the same kind sends the same bytes but its name), `model` first."""

    def __init__(self, request: Request, cache_key: str | None) -> None:
        self.request = request
        self.cache_key = cache_key
        self._built: dict[tuple[str, Reasoning, bool, int | None, str], dict[str, Any]] = {}

    def of(self, target: _Target, reply_tokens: int | None = None) -> dict[str, Any]:
        cache_key = bool(self.cache_key) and target.cache_key
        key = (target.server.format.name, target.reasoning, cache_key, reply_tokens, target.name)
        body = self._built.get(key)
        if body is None:
            request = replace(
                self.request,
                messages=_replays_for(self.request.messages, target.name),
                reasoning=target.reasoning,
                cache_key=self.cache_key if cache_key else None,
                max_tokens=reply_tokens if reply_tokens is not None else self.request.max_tokens,
            )
            body = self._built[key] = target.server.format.body(request)
        return {"model": target.model, **body}


def _replays_for(messages: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    """The messages as `model` may receive them: what another model produced for its own API
    (Anthropic's signed thinking, OpenAI's encrypted reasoning) stays with that model; another
    server would refuse it or could not read it (a fallback inside one turn)."""
    if not any(_foreign_replay(m, model) for m in messages):
        return messages
    return [{k: v for k, v in m.items() if k != REPLAY_KEY} if _foreign_replay(m, model) else m for m in messages]


def _foreign_replay(message: dict[str, Any], model: str) -> bool:
    carried = message.get(REPLAY_KEY)
    return isinstance(carried, dict) and carried.get("model", model) != model
