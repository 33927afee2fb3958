"""Shared pieces of the benchmarks: the fake LLM in its own process, stores, percentiles.

The fake LLM server runs in a child process so its work never competes with the gateway's
event loop (or its GIL), and it times every request from arrival to the last byte written.
`GET /stats` hands those server-side durations to the benchmark, which subtracts them from
the gateway's wall time. Run this module directly to serve (the benchmarks do that).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import httpx  # noqa: E402

from gateway.store import Store  # noqa: E402

POSTGRES_ENV = "GATEWAY_TEST_POSTGRES_URL"
TOOL_TRIGGER = "please use the clock"
MAX_REQUEST_BYTES = 256 * 1024 * 1024
REPLY_TEXT = "Here is a short answer from the fake model, long enough to stream in a few pieces."


# ---- the fake LLM process ---------------------------------------------------------------------


def bench_responder(request: dict[str, Any]) -> Any:
    """A tool call to `clock` when the latest real user message asks for it, else a text reply.
    Pure function of the request, so it can live in the child process."""
    from fakes.llm import FakeToolCall, Reply

    reply_text = os.environ.get("BENCH_REPLY_TEXT") or REPLY_TEXT
    tool = os.environ.get("BENCH_TOOL_NAME") or "clock"
    arguments = json.loads(os.environ.get("BENCH_TOOL_ARGUMENTS") or "{}")

    for message in reversed(request.get("messages", [])):
        role, content = message.get("role"), str(message.get("content") or "")
        if role == "tool" or role == "assistant":
            break
        if role == "user" and TOOL_TRIGGER in content:
            return Reply(tool_calls=(FakeToolCall(tool, arguments),))
    return Reply(reply_text)


async def serve(chunk_chars: int, delay: float = 0.0) -> None:
    from aiohttp import web
    from fakes.llm import FakeLLM

    durations: list[float] = []
    sizes: list[int] = []  # bytes of each request body, for the benchmarks of request size

    class TimedLLM(FakeLLM):
        async def __aenter__(self) -> TimedLLM:
            # As FakeLLM's, with room for the request bodies of 10,000-message sessions.
            app = web.Application(client_max_size=MAX_REQUEST_BYTES)
            app.router.add_post("/v1/chat/completions", self._handle)
            self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", 0).start()
            host, port = self._runner.addresses[0][:2]
            self.base_url = f"http://{host}:{port}/v1"
            return self

        async def _handle(self, request: web.Request) -> web.StreamResponse:
            started = time.perf_counter()
            sizes.append(request.content_length or 0)
            try:
                return await super()._handle(request)
            finally:
                durations.append(time.perf_counter() - started)

    async def stats(request: web.Request) -> web.Response:
        taken = list(durations)
        durations.clear()
        return web.json_response(taken)

    async def request_sizes(request: web.Request) -> web.Response:
        taken = list(sizes)
        sizes.clear()
        return web.json_response(taken)

    llm = TimedLLM(responder=bench_responder, delay=delay, chunk_chars=chunk_chars, pings=False)
    async with llm:
        stats_app = web.Application()
        stats_app.router.add_get("/stats", stats)
        stats_app.router.add_get("/sizes", request_sizes)
        runner = web.AppRunner(stats_app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        print(json.dumps({"base_url": llm.base_url, "stats_url": f"http://{host}:{port}/stats"}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent goes
        await runner.cleanup()


class LLMProcess:
    """The fake LLM in a child process. `server_seconds()` returns (and resets) the time the
    server spent on each request since the last call."""

    def __init__(
        self, chunk_chars: int = 16, *, delay: float = 0.0, reply: str = "",
        tool: tuple[str, dict[str, Any]] = ("clock", {}),
    ):
        self.chunk_chars = chunk_chars
        self.delay = delay  # seconds before each chunk
        self.reply = reply  # the text reply (default REPLY_TEXT)
        self.tool = tool  # the call made when a message asks for it (TOOL_TRIGGER): name, arguments
        self.base_url = ""
        self._stats_url = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._http = httpx.AsyncClient(timeout=10)

    async def __aenter__(self) -> LLMProcess:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).resolve()), "--serve", "--chunk-chars", str(self.chunk_chars),
            "--delay", str(self.delay),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "BENCH_REPLY_TEXT": self.reply, "BENCH_TOOL_NAME": self.tool[0],
                 "BENCH_TOOL_ARGUMENTS": json.dumps(self.tool[1])},
        )
        assert self._proc.stdout is not None
        ready = json.loads(await asyncio.wait_for(self._proc.stdout.readline(), 30))
        self.base_url, self._stats_url = ready["base_url"], ready["stats_url"]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()
            try:
                await asyncio.wait_for(self._proc.wait(), 5)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()

    async def server_seconds(self) -> list[float]:
        response = await self._http.get(self._stats_url)
        response.raise_for_status()
        return list(response.json())

    async def request_sizes(self) -> list[int]:
        """(And resets) the bytes of each request body since the last call."""
        response = await self._http.get(self._stats_url.removesuffix("/stats") + "/sizes")
        response.raise_for_status()
        return list(response.json())


# ---- stores --------------------------------------------------------------------------------


def postgres_url() -> str:
    return os.environ.get(POSTGRES_ENV, "")


@contextlib.asynccontextmanager
async def bench_database(kind: str, directory: Path) -> AsyncIterator[Callable[[], Store]]:
    """A fresh migrated database (a SQLite file in `directory`, or a throwaway PostgreSQL
    schema); yields a factory of `Store`s on it, one per simulated process."""
    if kind == "sqlite":
        url = f"sqlite+aiosqlite:///{directory / f'bench-{uuid.uuid4().hex[:8]}.db'}"
        await _migrate(Store(url))
        yield lambda: Store(url)
        return
    import asyncpg

    dsn = postgres_url().replace("postgresql+asyncpg://", "postgresql://")
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(dsn)
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    await conn.close()
    try:
        await _migrate(Store(postgres_url(), pg_schema=schema))
        yield lambda: Store(postgres_url(), pg_schema=schema)
    finally:
        conn = await asyncpg.connect(dsn)
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()


async def _migrate(store: Store) -> None:
    try:
        await store.migrate()
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def bench_store(kind: str, directory: Path) -> AsyncIterator[Store]:
    """One store on a fresh migrated database."""
    async with bench_database(kind, directory) as make_store:
        store = make_store()
        try:
            yield store
        finally:
            await store.close()


def database_kinds(wanted: list[str]) -> list[str]:
    """The requested databases; PostgreSQL only when its URL is set (a note is printed)."""
    kinds = [k for k in wanted if k == "sqlite" or postgres_url()]
    if "postgres" in wanted and not postgres_url():
        print(f"note: PostgreSQL skipped: {POSTGRES_ENV} is not set (e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/test)")
    return kinds


# ---- figures ---------------------------------------------------------------------------------


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(pct) - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:9.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", action="store_true", help="serve the fake LLM and print its URLs")
    parser.add_argument("--chunk-chars", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each chunk")
    args = parser.parse_args()
    if not args.serve:
        parser.error("run bench/turn_overhead.py or bench/inbox.py; this module only serves the fake LLM (--serve)")
    asyncio.run(serve(args.chunk_chars, args.delay))


if __name__ == "__main__":
    main()
