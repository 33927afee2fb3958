"""`gateway mcp login NAME`: sign in to a remote MCP server behind OAuth (`auth: oauth`). Prints
the authorization link; the browser comes back to the loopback address of `oauth_redirect`,
where a one-request listener takes the code; the SDK's OAuth client exchanges it, and the tokens
are stored in the database encrypted with GATEWAY_SECRET_KEY (refreshed by the gateway from then
on). `gateway mcp key` prints a new key for GATEWAY_SECRET_KEY.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gateway.config import Config
from gateway.mcp.oauth import NoKey, TokenVault, new_key
from gateway.mcp.sdk import ElicitAnswer, Login, Refusal, connect

PAGE = b"Signed in. You can close this page and go back to the terminal."


def add_parser(sub: Any, *, parents: list[argparse.ArgumentParser], handler: Callable[..., Any]) -> None:
    mcp = sub.add_parser("mcp", parents=parents, help="remote MCP servers: sign in (OAuth)")
    actions = mcp.add_subparsers(dest="action", required=True)
    login = actions.add_parser("login", parents=parents, help="sign in to a server behind OAuth")
    login.add_argument("name")
    login.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the browser")
    actions.add_parser("key", parents=parents, help="print a new GATEWAY_SECRET_KEY")
    mcp.set_defaults(handler=handler)


async def run(args: argparse.Namespace, config: Config, store: Any, *, say: Callable[[str], None] = print) -> int:
    if args.action == "key":
        say(new_key())
        return 0
    return await login(config, args.name, store, say=say, timeout=args.timeout)


async def login(config: Config, name: str, store: Any, *, say: Callable[[str], None], timeout: float) -> int:
    server = config.mcp.servers.get(name)
    if server is None or server.auth != "oauth":
        say(f"mcp.servers.{name} is not a server with auth: oauth")
        return 2
    try:
        vault = TokenVault.from_env(store, name)
    except NoKey as exc:
        say(str(exc))
        return 2
    redirect = urlsplit(server.oauth_redirect)
    arrived: asyncio.Future[tuple[str, str | None]] = asyncio.get_running_loop().create_future()
    listener = await asyncio.start_server(
        lambda r, w: _callback(r, w, redirect.path or "/", arrived), redirect.hostname or "127.0.0.1", redirect.port
    )

    async def show(url: str) -> None:
        say(f"Open this link to sign in to {name}:\n{url}")

    async def wait() -> tuple[str, str | None]:
        return await asyncio.wait_for(arrived, timeout)

    async def nobody(request: Any) -> Any:
        return ElicitAnswer("decline") if hasattr(request, "schema") else Refusal("not during a login")

    try:
        async with listener, connect(server, on_legacy_request=nobody, vault=vault, login=Login(show, wait)) as c:
            tools = await c.list_tools()
    except TimeoutError:
        say(f"no sign-in within {timeout:g}s; run it again")
        return 1
    say(f"signed in to {name}: {len(tools)} tools; the tokens are stored encrypted and refreshed by the gateway")
    return 0


async def _callback(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, arrived: asyncio.Future[Any]
) -> None:
    """One request of the browser's redirect: `GET <path>?code=...&state=...`."""
    try:
        line = (await reader.readline()).decode("latin-1").split()
        while (await reader.readline()).strip():
            pass  # the headers
        target = urlsplit(line[1]) if len(line) > 1 else None
        query = parse_qs(target.query) if target is not None else {}
        if target is None or target.path != path or "code" not in query:
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        if not arrived.done():
            state = query.get("state")
            arrived.set_result((query["code"][0], state[0] if state else None))
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (len(PAGE), PAGE)
        )
    finally:
        with contextlib.suppress(Exception):
            await writer.drain()
            writer.close()
