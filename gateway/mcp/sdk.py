"""The one module that imports the `mcp` SDK: a connection to one MCP server, in our own
vocabulary (plain dataclasses), so the rest of the gateway never sees an SDK type.

A connection is opened by `connect()` (an async context manager that must be entered and
left in one task: the SDK runs the transport in anyio task groups), lists tools, calls them,
and reports when the server says its tools changed or the connection is gone. Elicitation
and sampling requests arrive inside the call's result (`InputNeeded`, the 2026-07-28
protocol) so the turn can park on them and answer later. On older protocol versions they
arrive as requests in the middle of a call: the call that gave `on_request` answers them
(in its own task's context, with its timeout paused meanwhile). Such a request says nothing
of the call it belongs to, so on those connections calls with `on_request` run one at a time;
a request that arrives outside them is answered by the `on_legacy_request` given to `connect()`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gateway.config import McpServerConfig
from gateway.config.redaction import mcp_secrets, redact_error
from gateway.mcp.stderr import ServerStderr

if TYPE_CHECKING:
    import mcp_types as types
    from mcp import Client, StdioServerParameters
    from mcp.client.sse import sse_client
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.client.subscriptions import ListenNotSupportedError
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.exceptions import MCPError

log = logging.getLogger(__name__)


def _load_sdk() -> None:
    """Import the SDK when a server is first connected: it takes a large part of a second, which
    a gateway without MCP servers (or before it connects them) need not pay at start."""
    global types, Client, StdioServerParameters, sse_client, stdio_client, streamable_http_client  # noqa: PLW0603
    global ListenNotSupportedError, create_mcp_http_client, MCPError  # noqa: PLW0603
    if "MCPError" in globals():
        return
    import mcp_types as types
    from mcp import Client, StdioServerParameters
    from mcp.client.sse import sse_client
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.client.subscriptions import ListenNotSupportedError
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.exceptions import MCPError


class ServerGone(Exception):
    """The connection to the server closed (the process exited, the HTTP session ended)."""


class StartFailed(Exception):
    """The server did not come up; the message is what the process wrote to stderr last (the
    SDK's own error is the cause)."""


class CallFailed(Exception):
    """The server answered the call with a protocol error (not an `isError` result)."""

    def __init__(self, message: str, *, unsupported: bool = False):
        super().__init__(message)
        self.unsupported = unsupported  # the server does not implement the request


class NeedsLogin(Exception):
    """A server behind OAuth wants a person's sign-in (no stored tokens, or the refresh was
    refused): `gateway mcp login <name>`."""


class Busy(Exception):
    """Another call on an older-protocol connection held it past the timeout (it may be waiting
    for a person's answer to the server's question)."""


TOKEN_MARGIN_S = 30  # an access token this close to its expiry is refreshed first
MID_CALL_BEFORE = "2026-07-28"  # protocols older than this send elicitation/sampling mid-call


@dataclass(frozen=True)
class RemoteTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    read_only_hint: bool | None
    annotations: dict[str, Any]


@dataclass(frozen=True)
class PromptArgument:
    name: str
    description: str
    required: bool


@dataclass(frozen=True)
class RemotePrompt:
    """A prompt template a server offers (`prompts/list`): people pick it by name."""

    name: str
    description: str
    arguments: tuple[PromptArgument, ...]


@dataclass(frozen=True)
class PromptMessage:
    role: str  # user | assistant
    content: Content


@dataclass(frozen=True)
class Content:
    kind: Literal["text", "image", "audio", "blob", "link", "resource"]
    text: str = ""  # text (of a text resource too), or the link's uri
    data: bytes = b""
    mime: str = ""
    uri: str = ""  # an embedded resource's (or a link's) uri
    title: str = ""  # a link's name and description


@dataclass(frozen=True)
class CallResult:
    content: tuple[Content, ...]
    is_error: bool
    structured: Any = None


@dataclass(frozen=True)
class Elicitation:
    message: str
    schema: dict[str, Any]
    url: str = ""  # URL mode: the person is sent to this page (no form)


@dataclass(frozen=True)
class SamplingRequest:
    messages: tuple[tuple[str, str], ...]  # (role, text)
    system_prompt: str
    max_tokens: int


@dataclass(frozen=True)
class OtherRequest:
    method: str


InputRequest = Elicitation | SamplingRequest | OtherRequest


@dataclass(frozen=True)
class InputNeeded:
    """The server needs answers before it can finish the call; call again with them."""

    requests: dict[str, InputRequest]
    state: str | None


@dataclass(frozen=True)
class ElicitAnswer:
    action: Literal["accept", "decline", "cancel"]
    content: dict[str, Any] | None = None


@dataclass(frozen=True)
class SamplingAnswer:
    text: str
    model: str


@dataclass(frozen=True)
class Refusal:
    message: str


Answer = ElicitAnswer | SamplingAnswer | Refusal
OnLegacyRequest = Callable[[InputRequest], Awaitable[Answer]]


class Vault(Protocol):
    """Where a server's OAuth tokens and client registration are kept (gateway/mcp/oauth.py)."""

    async def load(self, field: str) -> str | None: ...

    async def save(self, field: str, value: str) -> None: ...


@dataclass
class Login:
    """The interactive sign-in of `gateway mcp login`: `show` is given the authorization link;
    `wait` returns the (code, state) the browser was redirected back with."""

    show: Callable[[str], Awaitable[None]]
    wait: Callable[[], Awaitable[tuple[str, str | None]]]


@dataclass(frozen=True)
class Resource:
    """What `resources/read` returned: text parts and binary parts (as `Content`)."""

    contents: tuple[Content, ...]


OnProgress = Callable[[float, "float | None", "str | None"], Awaitable[None]]


class _Progress:
    """A call's progress notifications (the SDK sends a progress token when it has a callback):
    each one is reported and moves the call's timeout on by `timeout_s`, so a long operation
    that says it is progressing is not abandoned (unless its timeout is paused for a question)."""

    def __init__(self, report: OnProgress, timeout_s: float):
        self.report = report
        self.timeout_s = timeout_s
        self.timer: asyncio.Timeout | None = None

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        timer = self.timer
        if timer is not None and timer.when() is not None and not timer.expired():
            timer.reschedule(max(timer.when() or 0.0, asyncio.get_running_loop().time() + self.timeout_s))
        await self.report(progress, total, message)


class _InCall:
    """The call in flight that answers the server's mid-call requests: its handler, the context
    of its task (the turn's: who pays for sampling, the trace), and its timeout, paused while
    a request is answered (a person may take minutes)."""

    def __init__(self, handler: OnLegacyRequest, timeout_s: float):
        self.handler = handler
        self.context = contextvars.copy_context()
        self.timeout_s = timeout_s
        self.timer: asyncio.Timeout | None = None
        self.remaining: float | None = None
        self.answering: set[asyncio.Task[Answer]] = set()

    async def answer(self, request: InputRequest) -> Answer:
        loop = asyncio.get_running_loop()
        if not self.answering and self.timer is not None and self.timer.when() is not None:
            self.remaining = max(self.timer.when() - loop.time(), 1.0)  # type: ignore[operator]
            self.timer.reschedule(None)
        async def handle() -> Answer:
            return await self.handler(request)

        task = asyncio.create_task(handle(), context=self.context)
        self.answering.add(task)
        try:
            return await task
        finally:
            self.answering.discard(task)
            if not self.answering and self.timer is not None and self.remaining is not None:
                self.timer.reschedule(loop.time() + self.remaining)
                self.remaining = None

    async def end(self) -> None:
        """The call is over (answered, failed, canceled): no handler may go on waiting."""
        for task in list(self.answering):
            task.cancel()
        await asyncio.gather(*self.answering, return_exceptions=True)


@dataclass
class Connection:
    """An open session with one server."""

    client: Client
    timeout_s: float
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    tools_changed: asyncio.Event = field(default_factory=asyncio.Event)
    why: str = ""  # what ended the connection, once `closed` is set
    change_stream: bool = False  # the server keeps a change stream open (else notifications, health checks)
    in_call: _InCall | None = None
    one_call: asyncio.Lock = field(default_factory=asyncio.Lock)

    def close(self, why: str) -> None:
        if not self.closed.is_set():
            self.why = why
            self.closed.set()

    @property
    def asks_mid_call(self) -> bool:
        """Whether the server sends its questions and sampling as requests inside a call."""
        return self.protocol_version < MID_CALL_BEFORE

    @property
    def has_resources(self) -> bool:
        return getattr(self.client.server_capabilities, "resources", None) is not None

    @property
    def server_version(self) -> str:
        info = self.client.server_info
        return f"{info.name} {info.version}".strip() if info is not None else ""

    @property
    def protocol_version(self) -> str:
        return self.client.protocol_version

    async def list_tools(self) -> list[RemoteTool]:
        tools: list[RemoteTool] = []
        cursor: str | None = None
        for _ in range(100):  # a paginator that never ends cannot hang the listing
            try:
                page = await self._guard(self.client.list_tools(cursor=cursor, cache_mode="bypass"), self.timeout_s)
            except CallFailed as exc:
                if exc.unsupported:  # a server without tools (resources or prompts only)
                    return tools
                raise
            tools += [_remote_tool(tool) for tool in page.tools]
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        answers: dict[str, Answer] | None = None,
        state: str | None = None,
        on_request: OnLegacyRequest | None = None,
        on_progress: OnProgress | None = None,
    ) -> CallResult | InputNeeded:
        """One round trip; `on_request` answers what the server asks in the middle of it,
        `on_progress` hears its progress notifications."""
        responses = {key: _response(answer) for key, answer in (answers or {}).items()} or None
        progress = _Progress(on_progress, self.timeout_s) if on_progress is not None else None
        work = self.client.session.call_tool(
            name,
            arguments,
            input_responses=responses,
            request_state=state,
            allow_input_required=True,
            progress_callback=progress,
        )
        if on_request is None or not self.asks_mid_call:
            result = await self._guard(work, self.timeout_s, progress)
        else:
            result = await self._call_answering(work, on_request)
        if isinstance(result, types.InputRequiredResult):
            requests = {key: _input_request(request) for key, request in (result.input_requests or {}).items()}
            return InputNeeded(requests, result.request_state)
        return CallResult(
            tuple(_content(block) for block in result.content), bool(result.is_error), result.structured_content
        )

    async def _call_answering(self, work: Any, on_request: OnLegacyRequest) -> Any:
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.one_call.acquire()
        except TimeoutError:
            work.close()
            raise Busy(f"another call held the server for {self.timeout_s:g}s") from None
        self.in_call = in_call = _InCall(on_request, self.timeout_s)
        try:
            return await self._guard(work, self.timeout_s, in_call)
        finally:
            self.in_call, in_call.timer = None, None  # its timeout is over: nothing to resume
            await in_call.end()
            self.one_call.release()

    async def answer_mid_call(self, request: InputRequest, fallback: OnLegacyRequest) -> Answer:
        """A request the server sent in the middle of a call: answered by that call."""
        in_call = self.in_call
        if in_call is None:
            return await fallback(request)
        try:
            return await in_call.answer(request)
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise  # the SDK's own task is being cancelled (the connection is closing)
            # the call ended while it was being answered
            if isinstance(request, Elicitation):
                return ElicitAnswer("cancel")
            return Refusal("the call was canceled")

    async def list_resources(self) -> list[str]:
        """The uris of the server's resources (`resources/list`), in its order."""
        uris: list[str] = []
        cursor: str | None = None
        for _ in range(100):  # a paginator that never ends cannot hang the listing
            page = await self._guard(self.client.list_resources(cursor=cursor, cache_mode="bypass"), self.timeout_s)
            uris += [str(resource.uri) for resource in page.resources]
            cursor = page.next_cursor
            if cursor is None:
                break
        return uris

    @property
    def has_prompts(self) -> bool:
        return getattr(self.client.server_capabilities, "prompts", None) is not None

    async def list_prompts(self) -> list[RemotePrompt]:
        prompts: list[RemotePrompt] = []
        cursor: str | None = None
        for _ in range(100):  # a paginator that never ends cannot hang the listing
            page = await self._guard(self.client.list_prompts(cursor=cursor, cache_mode="bypass"), self.timeout_s)
            prompts += [_remote_prompt(prompt) for prompt in page.prompts]
            cursor = page.next_cursor
            if cursor is None:
                break
        return prompts

    async def get_prompt(self, name: str, arguments: dict[str, str]) -> tuple[PromptMessage, ...]:
        result = await self._guard(self.client.get_prompt(name, arguments), self.timeout_s)
        return tuple(PromptMessage(str(m.role), _content(m.content)) for m in result.messages)

    async def read_resource(self, uri: str) -> Resource:
        result = await self._guard(self.client.read_resource(uri, cache_mode="bypass"), self.timeout_s)
        return Resource(tuple(_resource_content(item) for item in result.contents))

    async def _guard(self, work: Awaitable[Any], timeout: float, in_call: _InCall | _Progress | None = None) -> Any:
        try:
            async with asyncio.timeout(timeout) as timer:
                if in_call is not None:
                    in_call.timer = timer
                return await work
        except TimeoutError:
            raise  # the call took too long; the connection itself is still good (TimeoutError is an OSError)
        except MCPError as exc:
            if "closed" in str(exc).lower():
                self.close(str(exc))
                raise ServerGone(str(exc)) from exc
            raise CallFailed(str(exc), unsupported=unsupported(exc)) from exc
        except (OSError, EOFError) as exc:
            self.close(str(exc) or type(exc).__name__)
            raise ServerGone(str(exc) or type(exc).__name__) from exc

    async def watch(self) -> None:
        """Until the connection ends: set `tools_changed` when the server announces a change.

        The change stream (`subscriptions/listen`, 2026-07-28) is optional: a server that does
        not implement it (JSON-RPC -32601, "not supported", or an older protocol version) sends
        its changes as notifications (the message handler) or not at all, and the health checks
        find the rest. Only a connection that no longer answers is gone."""
        try:
            async with self.client.listen(tools_list_changed=True) as subscription:
                self.change_stream = True
                async for _event in subscription:
                    self.tools_changed.set()
            ended = "the server closed the change stream"
        except Exception as exc:  # noqa: BLE001 - whatever ended the stream, the server is asked below
            if unsupported(exc):
                log.debug("MCP server has no change stream (%s); relying on notifications", exc)
                await self.closed.wait()
                return
            ended = f"the change stream ended: {exc}"
        self.change_stream = False
        if await self.answers():
            log.info("MCP %s, but the server still answers; its tool changes are found by the health checks", ended)
            await self.closed.wait()
            return
        self.close(self.why or ended)

    async def answers(self) -> bool:
        """Whether the server still answers a request (a tool listing)."""
        try:
            await self.list_tools()
        except (ServerGone, CallFailed, TimeoutError):
            return False
        return True


def unsupported(exc: BaseException | None) -> bool:
    """The answer means the server does not implement the request: the feature is off for it,
    the server is not gone. The SDK raises `MCPError` (code -32601, "Method not found", or a
    "not supported" message), and `ListenNotSupportedError` before asking on older versions."""
    seen = 0
    while exc is not None and seen < 5:  # the error behind a lost subscription is its cause
        if isinstance(exc, ListenNotSupportedError):
            return True
        if isinstance(exc, MCPError):
            text = str(exc).lower()
            return exc.code == types.METHOD_NOT_FOUND or "not supported" in text or "method not found" in text
        exc, seen = exc.__cause__, seen + 1
    return False


@contextlib.asynccontextmanager
async def connect(
    config: McpServerConfig,
    *,
    on_legacy_request: OnLegacyRequest,
    name: str = "",
    vault: Vault | None = None,
    login: Login | None = None,
) -> AsyncIterator[Connection]:
    """Open a session with the configured server (a subprocess for `command`, HTTP for `url`;
    with `auth: oauth`, signed in by the tokens in `vault`, or through `login`)."""
    _load_sdk()
    if config.auth == "oauth" and login is None and (vault is None or not await vault.load("tokens")):
        raise NeedsLogin("no stored tokens" if vault is not None else "GATEWAY_SECRET_KEY is not set")
    holder: dict[str, Connection] = {}
    secrets = mcp_secrets(config)  # scrubbed from its stderr and transport errors

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            holder["connection"].tools_changed.set()
        elif isinstance(message, Exception):
            log.info("MCP transport error: %s", redact_error(str(message), secrets))

    async def on_elicit(context: Any, params: Any) -> Any:
        return _response(await holder["connection"].answer_mid_call(_elicitation(params), on_legacy_request))

    async def on_sample(context: Any, params: Any) -> Any:
        return _response(await holder["connection"].answer_mid_call(_sampling_request(params), on_legacy_request))

    async with contextlib.AsyncExitStack() as stack:
        stderr = await stack.enter_async_context(ServerStderr(name or "server", secrets)) if config.command else None
        client = Client(
            _transport(config, stderr, _oauth(config, vault, login) if config.auth == "oauth" else None),
            cache=None,  # tools are listed afresh on every reload; calls are timed out by Connection
            mode=config.protocol,
            message_handler=on_message,
            elicitation_callback=on_elicit,
            sampling_callback=on_sample,
            client_info=types.Implementation(name="chat-gateway", version="0.1"),
        )
        try:
            await stack.enter_async_context(client)
        except Exception as exc:
            words = await stderr.last_words() if stderr is not None else ""
            if words:
                raise StartFailed(words) from exc
            raise
        if stderr is not None:
            stderr.spawned()
        connection = Connection(client, config.timeout_s)
        holder["connection"] = connection
        yield connection


def _oauth(config: McpServerConfig, vault: Vault | None, login: Login | None) -> Any:
    """The SDK's OAuth client for the server: tokens from the vault, refreshed by the SDK; a
    sign-in only through `login` (otherwise NeedsLogin)."""
    from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
    from mcp.shared.auth import OAuthClientMetadata

    if vault is None:
        raise NeedsLogin("no token store: GATEWAY_SECRET_KEY is needed for a server behind OAuth")

    async def redirect(url: str) -> None:
        if login is None:
            raise NeedsLogin("the server asks for a sign-in")
        await login.show(url)

    async def callback() -> AuthorizationCodeResult:
        assert login is not None
        code, state = await login.wait()
        return AuthorizationCodeResult(code=code, state=state)

    metadata = OAuthClientMetadata(
        redirect_uris=[config.oauth_redirect],
        client_name="chat-gateway",
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        scope=config.oauth_scope or None,
    )
    storage = _token_storage(vault)
    return OAuthClientProvider(config.url, metadata, storage, redirect_handler=redirect, callback_handler=callback)


def _token_storage(kept: Vault) -> Any:
    from mcp.client.auth import TokenStorage
    from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

    class Storage(TokenStorage):
        """Tokens are kept with their absolute expiry: the SDK reads a stored token as valid
        (its `expires_in` is relative) and, on the 401, signs in anew instead of refreshing.
        An expired one is handed over without its access token, which makes the SDK refresh."""

        async def get_tokens(self) -> OAuthToken | None:
            text = await kept.load("tokens")
            if not text:
                return None
            kept_tokens = json.loads(text)
            tokens = OAuthToken.model_validate(kept_tokens["token"])
            expires_at = kept_tokens.get("expires_at")
            if expires_at is not None and time.time() >= expires_at - TOKEN_MARGIN_S and tokens.refresh_token:
                tokens = tokens.model_copy(update={"access_token": ""})
            return tokens

        async def set_tokens(self, tokens: OAuthToken) -> None:
            expires_at = time.time() + tokens.expires_in if tokens.expires_in else None
            kept_tokens = {"token": tokens.model_dump(mode="json"), "expires_at": expires_at}
            await kept.save("tokens", json.dumps(kept_tokens))

        async def get_client_info(self) -> OAuthClientInformationFull | None:
            text = await kept.load("client")
            return OAuthClientInformationFull.model_validate_json(text) if text else None

        async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
            await kept.save("client", client_info.model_dump_json())

    return Storage()


def _transport(config: McpServerConfig, stderr: ServerStderr | None, auth: Any = None) -> Any:
    _load_sdk()
    if config.command:
        params = StdioServerParameters(
            command=config.command[0],
            args=list(config.command[1:]),
            env=dict(config.env) or None,
            cwd=config.cwd or None,
        )
        return stdio_client(params, errlog=stderr.file) if stderr is not None else params
    if config.transport == "sse":
        return sse_client(config.url, headers=dict(config.headers) or None, timeout=config.connect_timeout_s)
    http = create_mcp_http_client(headers=dict(config.headers) or None, auth=auth)
    return streamable_http_client(config.url, http_client=http)


def _remote_tool(tool: Any) -> RemoteTool:
    annotations = tool.annotations.model_dump(exclude_none=True, by_alias=True) if tool.annotations else {}
    hint = tool.annotations.read_only_hint if tool.annotations else None
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {"type": "object"}
    return RemoteTool(tool.name, tool.description or tool.title or "", dict(schema), hint, annotations)


def _remote_prompt(prompt: Any) -> RemotePrompt:
    arguments = tuple(
        PromptArgument(arg.name, arg.description or arg.title or "", bool(arg.required))
        for arg in prompt.arguments or ()
    )
    return RemotePrompt(prompt.name, prompt.description or prompt.title or "", arguments)


def _content(block: Any) -> Content:
    kind = getattr(block, "type", "")
    if kind == "text":
        return Content("text", block.text)
    if kind == "image":
        return Content("image", data=base64.b64decode(block.data), mime=block.mime_type or "")
    if kind == "audio":
        return Content("audio", data=base64.b64decode(block.data), mime=block.mime_type or "")
    if kind == "resource_link":
        title = " - ".join(part for part in (block.title or block.name, block.description) if part)
        return Content("link", text=str(block.uri), mime=block.mime_type or "", uri=str(block.uri), title=title)
    if kind == "resource":
        return _resource_content(block.resource)
    return Content("text", f"[unsupported content {kind!r}]")


def _resource_content(resource: Any) -> Content:
    """An embedded resource or a part of what `resources/read` returned."""
    mime, uri = resource.mime_type or "", str(resource.uri)
    if getattr(resource, "text", None) is not None:
        return Content("resource", resource.text, mime=mime, uri=uri)
    data = base64.b64decode(resource.blob)
    kind: Literal["image", "audio", "blob"] = "image" if mime.startswith("image/") else "blob"
    return Content("audio" if mime.startswith("audio/") else kind, data=data, mime=mime, uri=uri)


def _elicitation(params: Any) -> Elicitation:
    if getattr(params, "mode", "form") == "url":
        return Elicitation(params.message, {}, url=str(params.url))
    return Elicitation(params.message, dict(getattr(params, "requested_schema", {}) or {}))


def _input_request(request: Any) -> InputRequest:
    _load_sdk()
    if isinstance(request, types.ElicitRequest):
        return _elicitation(request.params)
    if isinstance(request, types.CreateMessageRequest):
        return _sampling_request(request.params)
    return OtherRequest(getattr(request, "method", type(request).__name__))


def _sampling_request(params: Any) -> SamplingRequest:
    messages = []
    for message in params.messages:
        blocks = message.content if isinstance(message.content, list) else [message.content]
        text = "\n".join(getattr(block, "text", "") for block in blocks if getattr(block, "type", "") == "text")
        messages.append((str(message.role), text))
    return SamplingRequest(tuple(messages), params.system_prompt or "", int(params.max_tokens))


def _response(answer: Answer) -> Any:
    _load_sdk()
    if isinstance(answer, ElicitAnswer):
        return types.ElicitResult(action=answer.action, content=answer.content)
    if isinstance(answer, SamplingAnswer):
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=answer.text),
            model=answer.model,
            stop_reason="endTurn",
        )
    return types.ErrorData(code=types.INVALID_REQUEST, message=answer.message)
