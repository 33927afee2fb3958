"""MCP servers: one supervisor task per configured server keeps a session open, offers the
server's tools in the registry, and restarts the server with backoff when it fails to start,
crashes or stops answering. A server that is down is not an error of the gateway: its tools
are simply absent, and a call caught by a crash gets a clear tool error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config import McpConfig, McpServerConfig
from gateway.config.redaction import mcp_secrets, redact_error, shown_target
from gateway.mcp import calls, prompts, resources
from gateway.mcp.naming import PREFIX, grant_key, schema_hash, tool_name
from gateway.mcp.oauth import NoKey
from gateway.mcp.results import READ_TOOL, render_contents, structured_text
from gateway.mcp.sdk import (
    Answer,
    CallFailed,
    CallResult,
    Connection,
    ElicitAnswer,
    Elicitation,
    InputRequest,
    NeedsLogin,
    Refusal,
    RemotePrompt,
    RemoteTool,
    StartFailed,
    Vault,
    connect,
)
from gateway.tools.registry import ToolContext, ToolError, ToolRegistry, ToolSpec, matches_any

log = logging.getLogger(__name__)


@dataclass
class ServerState:
    """What /readyz, /status and `gateway doctor` show for one server."""

    name: str
    target: str  # the command or the url as configured: part of its tools' identity, never shown
    status: str = "starting"  # starting | running | failed | needs_login | disabled
    tools: int = 0
    error: str = ""
    restarts: int = 0
    checks: int = 0  # health checks (tool listings) passed on the current connection
    retry_in_s: float = 0.0
    protocol: str = ""
    server: str = ""  # the server's own name and version
    since: float = field(default_factory=time.time)
    shown_target: str = ""  # the target as everything shows it (gateway/config/redaction.py)

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "tools": self.tools,
            "error": self.error,
            "restarts": self.restarts,
            "checks": self.checks,
            "retry_in_s": self.retry_in_s,
            "protocol": self.protocol,
            "server": self.server,
            "target": self.shown_target,
        }


class McpManager:
    def __init__(self, config: McpConfig, registry: ToolRegistry, vaults: Callable[[str], Vault] | None = None):
        self.config = config
        self.registry = registry
        self.vaults = vaults  # a server behind OAuth: where its tokens are kept (gateway/mcp/oauth.py)
        self.states: dict[str, ServerState] = {}
        self.connections: dict[str, Connection] = {}
        self._offered: dict[str, list[str]] = {}  # server -> names in the registry
        self._readable: set[str] = set()  # running servers with resources (mcp_read_resource)
        self.prompts: dict[str, list[RemotePrompt]] = {}  # running servers' prompts: chat commands (prompts.py)
        self._read_only: dict[str, set[str]] = {}  # server -> its offered tools that declare readOnlyHint
        self._tasks: list[asyncio.Task] = []
        self.changed = asyncio.Condition()  # notified whenever a server's state or tools change
        self._secrets: dict[str, set[str]] = {}  # per server: what its errors must not quote
        for name, server in config.servers.items():
            target = " ".join(server.command) if server.command else server.url
            status = "starting" if server.enabled else "disabled"
            shown = shown_target(server.command, server.url)
            self.states[name] = ServerState(name, target, status=status, shown_target=shown)
            self._secrets[name] = mcp_secrets(server)
        registry.add_source(self)

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        for name, server in self.config.servers.items():
            if server.enabled:
                self._tasks.append(asyncio.create_task(self._supervise(name, server), name=f"mcp-{name}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def summary(self) -> dict[str, dict[str, Any]]:
        return {name: state.as_dict() for name, state in self.states.items()}

    async def wait_for(self, predicate: Any, timeout: float) -> None:
        """Until `predicate(self)` holds (for tests and `gateway doctor`)."""
        async with asyncio.timeout(timeout):
            async with self.changed:
                await self.changed.wait_for(lambda: predicate(self))

    async def first_listing(self) -> None:
        """Until no server is in its first connect (each is bounded by its connect_timeout_s):
        a turn right after a start (a deploy) is offered the tools of every server that comes up."""
        if not self._tasks:
            return  # not started (a one-off command): nothing is connecting
        waiting = [name for name, state in self.states.items() if _first_connect(state)]
        if not waiting:
            return
        bound = max(self.config.servers[name].connect_timeout_s for name in waiting) + 1.0
        with contextlib.suppress(TimeoutError):
            await self.wait_for(lambda m: not any(_first_connect(m.states[name]) for name in waiting), bound)

    def absent(self, name: str) -> str | None:
        """Why the tool `name` of a configured server is not offered: the server is not running."""
        for server, state in self.states.items():
            if name.startswith(f"{PREFIX}{server}__") and state.status != "running":
                return down_text(state)
        return None

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    # ---- supervision ---------------------------------------------------------------------
    async def _supervise(self, name: str, server: McpServerConfig) -> None:
        state = self.states[name]
        delay = self.config.restart_initial_s
        while True:
            if state.status not in ("failed", "needs_login"):  # shown as it is while it is retried
                state.status = "starting"
            state.retry_in_s = 0.0
            await self._notify()
            error, up_since = "the connection closed", None
            try:
                async with contextlib.AsyncExitStack() as stack:
                    async with asyncio.timeout(server.connect_timeout_s):
                        vault = self._vault(name, server)
                        connection = await stack.enter_async_context(
                            connect(server, on_legacy_request=self._legacy_request, name=name, vault=vault)
                        )
                        await self._load(name, server, connection)
                    self.connections[name] = connection
                    state.status, state.error, state.protocol = "running", "", connection.protocol_version
                    state.server, state.since, state.checks = connection.server_version, time.time(), 0
                    up_since = time.monotonic()
                    await self._notify()
                    await self._serve(name, server, connection)
                    error = connection.why or error
            except asyncio.CancelledError:
                self._unload(name)
                raise
            except TimeoutError:
                error = f"no answer within {server.connect_timeout_s:g}s"
            except StartFailed as exc:  # it wrote why to stderr
                error = f"{describe(exc.__cause__ or exc)}; its stderr: {exc}"
            except BaseException as exc:  # noqa: BLE001 - anyio task groups raise exception groups
                if _being_cancelled():  # a stop's cancel, come back wrapped in a group (or a failure)
                    self._unload(name)
                    raise asyncio.CancelledError from exc
                error = describe(exc)
                if needs_login(exc):  # not a crash: it waits for a person, looked at again now and then
                    await self._wait_for_login(name, self._shown_error(name, error))
                    continue
            self.connections.pop(name, None)
            self._unload(name)
            delay, error = self._next_delay(delay, self._shown_error(name, error), up_since)
            state.status, state.error, state.restarts, state.retry_in_s = "failed", error, state.restarts + 1, delay
            log.warning("MCP server %s is down (%s); restarting in %.1fs", name, error, delay)
            await self._notify()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.restart_max_s)

    def _vault(self, name: str, server: McpServerConfig) -> Vault | None:
        if server.auth != "oauth" or self.vaults is None:
            return None
        try:
            return self.vaults(name)
        except NoKey as exc:
            log.error("MCP server %s: %s", name, self._shown_error(name, str(exc)))
            return None

    def _shown_error(self, name: str, error: str) -> str:
        """An error as it is kept, logged and shown: redacted first, then shortened (a secret
        cut in half would no longer be recognised)."""
        return shorten(redact_error(error, self._secrets[name]))

    async def _wait_for_login(self, name: str, error: str) -> None:
        state = self.states[name]
        self.connections.pop(name, None)
        self._unload(name)
        if state.status != "needs_login":
            log.warning("MCP server %s needs a login (%s): run `gateway mcp login %s`", name, error, name)
        state.status, state.error, state.retry_in_s = "needs_login", f"{error}; run `gateway mcp login {name}`", 0.0
        await self._notify()
        await asyncio.sleep(self.config.restart_max_s)

    def _next_delay(self, delay: float, error: str, up_since: float | None) -> tuple[float, str]:
        """The wait before the next start, and the error as shown. Only a connection that stayed
        up `restart_reset_s` starts the backoff afresh: one that connects and then dies at once
        (a crash loop) keeps it growing, and its state says how soon it died."""
        if up_since is None:
            return delay, error
        up = time.monotonic() - up_since
        if up >= self.config.restart_reset_s:
            return self.config.restart_initial_s, error
        return delay, f"{error}, {up:.1f}s after connecting"

    async def _serve(self, name: str, server: McpServerConfig, connection: Connection) -> None:
        """Until the connection is gone: reload the tools when the server says they changed,
        and list them again every `health_interval_s` (which also finds a silent death)."""
        watcher = asyncio.create_task(connection.watch(), name=f"mcp-{name}-watch")
        try:
            while not connection.closed.is_set():
                closed = asyncio.ensure_future(connection.closed.wait())
                changed = asyncio.ensure_future(connection.tools_changed.wait())
                try:
                    await asyncio.wait(
                        {closed, changed}, timeout=self.config.health_interval_s, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    closed.cancel()
                    changed.cancel()
                if connection.closed.is_set():
                    return
                connection.tools_changed.clear()
                async with asyncio.timeout(server.timeout_s):
                    await self._load(name, server, connection)
                self.states[name].checks += 1
                await self._notify()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _load(self, name: str, server: McpServerConfig, connection: Connection) -> None:
        tools = await connection.list_tools()
        listed_prompts = await self._list_prompts(name, connection)  # before _unload: never absent meanwhile
        identity = f"{name}|{self.states[name].target}|{connection.server_version}"
        specs = [self._spec(name, server, identity, tool) for tool in tools if matches_any(tool.name, server.tools)]
        self._unload(name)
        offered = []
        for spec in specs:
            if spec.name in self.registry:
                log.warning("MCP server %s: tool %s clashes with a tool already offered; skipped", name, spec.name)
                continue
            self.registry.register(spec)
            offered.append(spec.name)
        self._offered[name] = offered
        read_only = {t.name for t in tools if t.read_only_hint is True}
        self._read_only[name] = {t for t in read_only if tool_name(name, t) in offered}
        self.states[name].tools = len(offered)
        if connection.has_resources:
            self._readable.add(name)
        self._offer_reader()
        self.prompts[name] = listed_prompts

    def _unload(self, name: str) -> None:
        for tool in self._offered.pop(name, []):
            self.registry.unregister(tool)
        self.prompts.pop(name, None)
        self._read_only.pop(name, None)
        self.states[name].tools = 0
        self._readable.discard(name)
        self._offer_reader()

    async def _list_prompts(self, name: str, connection: Connection) -> list[RemotePrompt]:
        """A server's prompts, or none when it has none or listing them fails (its tools stay)."""
        if not connection.has_prompts:
            return []
        try:
            return await connection.list_prompts()
        except (CallFailed, TimeoutError) as exc:
            log.warning("MCP server %s: its prompts could not be listed: %s", name, self._shown_error(name, str(exc)))
            return []

    def prompt(self, server: str, name: str) -> RemotePrompt | None:
        return next((p for p in self.prompts.get(server, ()) if p.name == name), None)

    def prompt_spec(self) -> ToolSpec:
        return prompts.prompt_spec(self._live, self.prompt)

    def _offer_reader(self) -> None:
        """`mcp_read_resource` is offered while a running server has resources to read."""
        offered = READ_TOOL in self.registry
        if offered:
            self.registry.unregister(READ_TOOL)
        if self._readable:
            self.registry.register(resources.read_spec(self._live, self.config.servers, sorted(self._readable)))
        elif offered:
            log.debug("no MCP server with resources is running: %s withdrawn", READ_TOOL)

    async def call_read_only(self, server: str, tool: str, arguments: dict[str, Any], *, workspace: Path) -> str:
        """A call outside any conversation (a job's check): only a tool that declares itself
        read-only (`readOnlyHint`) of a trusted server, and nothing the server asks is answered.
        Its text, or a ToolError of one line."""
        config = self.config.servers.get(server)
        if config is None:
            raise ToolError(f"there is no MCP server {server!r} in mcp.servers: add it or fix the name")
        if not config.trusted:
            raise ToolError(
                f"MCP server {server!r} is not trusted: a check calls only read-only tools of a trusted server "
                f"(set mcp.servers.{server}.trusted: true if it is yours)"
            )
        connection = self._live(server)
        if tool not in self._read_only.get(server, set()):
            raise ToolError(
                f"tool {tool!r} of MCP server {server!r} is not offered or does not declare readOnlyHint: a check "
                "calls only read-only tools"
            )
        try:
            result = await connection.call(tool, arguments)
        except TimeoutError:
            raise ToolError(f"MCP server {server!r} did not answer within {config.timeout_s:g}s") from None
        except Exception as exc:  # Busy, ServerGone, CallFailed: said in one line, secrets taken out
            raise ToolError(f"MCP server {server!r}: {self._shown_error(server, describe(exc))}") from None
        if not isinstance(result, CallResult):
            raise ToolError(f"tool {tool!r} of MCP server {server!r} asked for input, which a check cannot give")
        text = render_contents(result.content, server=server, workspace=workspace).text
        if not text and result.structured is not None:
            text = structured_text(result.structured)
        if result.is_error:
            said = shorten(" ".join(text.split()))
            raise ToolError(f"tool {tool!r} of MCP server {server!r} returned an error: {said}")
        return text

    def _live(self, name: str) -> Connection:
        connection = self.connections.get(name)
        if connection is None or connection.closed.is_set():
            raise ToolError(down_text(self.states[name]))
        return connection

    def _spec(self, name: str, server: McpServerConfig, identity: str, tool: RemoteTool) -> ToolSpec:
        offered = tool_name(name, tool.name)
        remote = tool.name

        async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
            return await calls.call(self._live(name), name, server, remote, args, ctx)

        return ToolSpec(
            name=offered,
            description=short_description(tool.description, server.description_chars, name),
            parameters=clean_schema(tool.input_schema),
            func=run,
            side_effects=not (server.trusted and tool.read_only_hint is True),
            classes=frozenset({"mcp"}),
            grant=grant_key(
                offered, schema_hash(identity, tool.name, tool.description, tool.input_schema, tool.annotations)
            ),
        )

    async def _legacy_request(self, request: InputRequest) -> Answer:
        """A request a server on an older protocol sent outside any call that answers it (the
        calls of turns answer theirs: gateway/mcp/midcall.py): nobody to ask, so elicitation
        is declined and sampling refused."""
        if isinstance(request, Elicitation):
            log.info("MCP elicitation declined: the server sent it outside a call")
            return ElicitAnswer("decline")
        return Refusal("sampling is answered only inside a call of a turn")


def _first_connect(state: ServerState) -> bool:
    return state.status == "starting" and state.restarts == 0


def down_text(state: ServerState) -> str:
    """The tool result of a call to a server that is not running: its name and state. Not the
    error's text, which may quote a URL, a path or a credential (readyz and doctor show it)."""
    name = state.name
    if state.status == "disabled":
        why = f"it is disabled (mcp.servers.{name}.enabled)"
    elif state.status == "starting" and not state.restarts:
        why = "it is still starting"
    elif state.status == "starting":
        why = f"it is restarting (restart {state.restarts})"
    elif state.status == "failed" and state.retry_in_s:
        why = f"it is down; restart {state.restarts} in {state.retry_in_s:g}s"
    elif state.status == "failed":
        why = f"it is down; restart {state.restarts} under way"
    else:
        why = "its connection just closed"
    return (
        f"The MCP server {name!r} is not running ({why}); its tools are unavailable until it is back. "
        "Try again later or do without it."
    )


def needs_login(exc: BaseException) -> bool:
    """Whether the (possibly grouped) error is a server behind OAuth asking for a sign-in."""
    if isinstance(exc, NeedsLogin):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(needs_login(inner) for inner in exc.exceptions)
    return exc.__cause__ is not None and needs_login(exc.__cause__)


def state_line(name: str, server: dict[str, Any]) -> str:
    """One server's state in a line, as /status and `gateway doctor` show it."""
    if server["status"] == "needs_login":
        return f"MCP {name}: 🔑 needs login (gateway mcp login {name})"
    if server["status"] == "running":
        return f"MCP {name}: 🟢 running, {server['tools']} tools"
    if server["status"] == "failed":
        return f"MCP {name}: 🔴 down ({server['error']}), restart {server['restarts']} in {server['retry_in_s']:g}s"
    return f"MCP {name}: {server['status']}"


async def check_servers(
    config: McpConfig, timeout: float = 30.0, vaults: Callable[[str], Vault] | None = None
) -> dict[str, dict[str, Any]]:
    """Start every enabled server once and report how each came up (running with its tool
    count, or failed with the error): what `gateway doctor` shows, without a running gateway."""
    manager = McpManager(config.model_copy(update={"restart_initial_s": 3600.0}), ToolRegistry(), vaults)
    await manager.start()
    try:
        settled = lambda m: all(s.status != "starting" for s in m.states.values())  # noqa: E731
        with contextlib.suppress(TimeoutError):
            await manager.wait_for(settled, timeout)
        return manager.summary()  # before stopping, which takes the tools away
    finally:
        await manager.stop()


async def doctor_checks(
    config: McpConfig, timeout: float = 30.0, vaults: Callable[[str], Vault] | None = None
) -> list[tuple[str, str, str, str]]:
    """`gateway doctor`'s MCP section: (name, ok | warn | fail, what was found, what to change)
    for each configured server, after starting it once."""
    report = await check_servers(config, timeout, vaults)
    checks = []
    for name, settings in config.servers.items():
        state, where = report[name], f"mcp.servers.{name}"
        if state["status"] == "disabled":
            checks.append((f"MCP {name}", "warn", "disabled", f"set {where}.enabled: true to use it"))
        elif state["status"] == "needs_login":
            checks.append((f"MCP {name}", "fail", "needs login", f"run `gateway mcp login {name}`"))
        elif state["status"] != "running":
            fix = f"check {where}.{'command' if settings.command else 'url'}"
            checks.append((f"MCP {name}", "fail", f"{state['status']}: {state['error'] or 'no answer'}", fix))
        elif not state["tools"]:
            checks.append((f"MCP {name}", "warn", "running, but no tool is offered", f"no tool matches {where}.tools"))
        else:
            found = f"running, {state['tools']} tools ({state['server'] or 'unnamed'}, protocol {state['protocol']})"
            checks.append((f"MCP {name}", "ok", found, ""))
    return checks


def short_description(text: str, limit: int, server: str) -> str:
    text = " ".join((text or "").split())
    if limit and len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return f"[{server}] {text}" if text else f"A tool of the {server} MCP server."


def clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The server's JSON Schema without its titles (they cost prompt and say nothing)."""
    cleaned = _strip_titles(schema)
    if not isinstance(cleaned, dict) or cleaned.get("type") != "object":
        return {"type": "object", "properties": {}}
    cleaned.setdefault("properties", {})
    return cleaned


def _strip_titles(node: Any, in_properties: bool = False) -> Any:
    if isinstance(node, dict):
        return {
            key: _strip_titles(value, key in ("properties", "$defs", "definitions"))
            for key, value in node.items()
            if in_properties or key != "title"
        }
    if isinstance(node, list):
        return [_strip_titles(item) for item in node]
    return node


def describe(exc: BaseException) -> str:
    """The first real error inside (possibly nested) exception groups (not shortened: it is
    redacted before it is cut)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


def shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _being_cancelled() -> bool:
    """Whether this task was asked to stop: anyio's task groups (the SDK's stdio and HTTP
    clients) may hand a cancel that lands while a server is starting back as an exception
    group, which swallowed here kept the supervisor restarting forever and `stop` waiting."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
