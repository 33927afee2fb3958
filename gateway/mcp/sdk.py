"""The one module that imports the `mcp` SDK: a connection to one MCP server, in our own
vocabulary (plain dataclasses), so the rest of the gateway never sees an SDK type.

A connection is opened by `connect()` (an async context manager that must be entered and
left in one task: the SDK runs the transport in anyio task groups), lists tools, calls them,
and reports when the server says its tools changed or the connection is gone. Elicitation
and sampling requests arrive inside the call's result (`InputNeeded`, the 2026-07-28
protocol) so the turn can park on them and answer later; on older protocol versions, where
they arrive as requests in the middle of a call, the callbacks given to `connect()` answer.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gateway.config import McpServerConfig
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


@dataclass(frozen=True)
class RemoteTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    read_only_hint: bool | None
    annotations: dict[str, Any]


@dataclass(frozen=True)
class Content:
    kind: Literal["text", "image", "audio", "blob", "link"]
    text: str = ""  # text, or the link's uri
    data: bytes = b""
    mime: str = ""


@dataclass(frozen=True)
class CallResult:
    content: tuple[Content, ...]
    is_error: bool
    structured: Any = None


@dataclass(frozen=True)
class Elicitation:
    message: str
    schema: dict[str, Any]


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


@dataclass
class Connection:
    """An open session with one server."""

    client: Client
    timeout_s: float
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    tools_changed: asyncio.Event = field(default_factory=asyncio.Event)
    why: str = ""  # what ended the connection, once `closed` is set
    change_stream: bool = False  # the server keeps a change stream open (else notifications, health checks)

    def close(self, why: str) -> None:
        if not self.closed.is_set():
            self.why = why
            self.closed.set()

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
    ) -> CallResult | InputNeeded:
        responses = {key: _response(answer) for key, answer in (answers or {}).items()} or None
        result = await self._guard(
            self.client.session.call_tool(
                name,
                arguments,
                input_responses=responses,
                request_state=state,
                allow_input_required=True,
            ),
            self.timeout_s,
        )
        if isinstance(result, types.InputRequiredResult):
            requests = {key: _input_request(request) for key, request in (result.input_requests or {}).items()}
            return InputNeeded(requests, result.request_state)
        return CallResult(
            tuple(_content(block) for block in result.content), bool(result.is_error), result.structured_content
        )

    async def _guard(self, work: Awaitable[Any], timeout: float) -> Any:
        try:
            async with asyncio.timeout(timeout):
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
    config: McpServerConfig, *, on_legacy_request: OnLegacyRequest, name: str = ""
) -> AsyncIterator[Connection]:
    """Open a session with the configured server (a subprocess for `command`, HTTP for `url`)."""
    _load_sdk()
    holder: dict[str, Connection] = {}

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            holder["connection"].tools_changed.set()
        elif isinstance(message, Exception):
            log.info("MCP transport error: %s", message)

    async def on_elicit(context: Any, params: Any) -> Any:
        request = Elicitation(params.message, dict(getattr(params, "requested_schema", {}) or {}))
        return _response(await on_legacy_request(request))

    async def on_sample(context: Any, params: Any) -> Any:
        return _response(await on_legacy_request(_sampling_request(params)))

    async with contextlib.AsyncExitStack() as stack:
        stderr = await stack.enter_async_context(ServerStderr(name or "server")) if config.command else None
        client = Client(
            _transport(config, stderr),
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


def _transport(config: McpServerConfig, stderr: ServerStderr | None) -> Any:
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
    http = create_mcp_http_client(headers=dict(config.headers) or None)
    return streamable_http_client(config.url, http_client=http)


def _remote_tool(tool: Any) -> RemoteTool:
    annotations = tool.annotations.model_dump(exclude_none=True, by_alias=True) if tool.annotations else {}
    hint = tool.annotations.read_only_hint if tool.annotations else None
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {"type": "object"}
    return RemoteTool(tool.name, tool.description or tool.title or "", dict(schema), hint, annotations)


def _content(block: Any) -> Content:
    kind = getattr(block, "type", "")
    if kind == "text":
        return Content("text", block.text)
    if kind == "image":
        return Content("image", data=base64.b64decode(block.data), mime=block.mime_type or "")
    if kind == "audio":
        return Content("audio", data=base64.b64decode(block.data), mime=block.mime_type or "")
    if kind == "resource_link":
        return Content("link", text=str(block.uri), mime=block.mime_type or "")
    if kind == "resource":
        resource = block.resource
        if getattr(resource, "text", None) is not None:
            return Content("text", resource.text, mime=resource.mime_type or "")
        return Content(
            "blob", data=base64.b64decode(resource.blob), mime=resource.mime_type or "", text=str(resource.uri)
        )
    return Content("text", f"[unsupported content {kind!r}]")


def _input_request(request: Any) -> InputRequest:
    _load_sdk()
    if isinstance(request, types.ElicitRequest):
        params = request.params
        return Elicitation(params.message, dict(getattr(params, "requested_schema", {}) or {}))
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
