"""`gateway serve` as a process: health and readiness, then a clean exit on SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import sys

import aiohttp
from test_chat_cli import REPO, child_env, write_config

from gateway.cli.toplevel import EXIT_CODES
from gateway.serving.logs import OURS


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_for_http(url: str, timeout: float = 30.0) -> aiohttp.ClientResponse:
    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(url) as response:
                    await response.read()
                    return response
            except aiohttp.ClientConnectionError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def test_serve_reports_health_and_exits_cleanly_on_sigterm(tmp_path, llm):
    port = free_port()
    config = write_config(tmp_path, llm.base_url)  # ready means the model server answers too
    config.write_text(config.read_text() + f"http:\n  port: {port}\nserve:\n  shutdown_grace: 2s\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config),
        cwd=str(REPO), env=child_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        health = await wait_for_http(f"http://127.0.0.1:{port}/healthz")
        assert health.status == 200
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/readyz") as ready:
                body = await ready.json()
        assert ready.status == 200 and body["database"] and body["migrations_current"]
        assert body["model_server"]["reachable"] is True
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as metrics:
                text = await metrics.text()
        assert metrics.status == 200 and 'gateway_event_loop_lag_seconds{quantile="0.99"}' in text
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 30)
        output = (await process.stdout.read()).decode()
        assert code == 0, output
        assert "no chat channel is configured" in output  # says how to enable one, once
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_serve_refuses_an_old_schema_without_auto_migrate(tmp_path):
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    config.write_text(config.read_text().replace("database:\n", "database:\n  auto_migrate: false\n", 1))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config),
        cwd=str(REPO), env=child_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    code = await asyncio.wait_for(process.wait(), 30)
    output = (await process.stdout.read()).decode()
    assert code == EXIT_CODES["database_schema"] and "gateway migrate" in output


LOG_LINE = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ([\w.]+): (.*)$")


async def start_log(tmp_path, extra: str, llm) -> list[tuple[str, str, str]]:  # noqa: ANN001
    """(level, logger, message) of each line a `gateway serve` writes from start to stop, on a
    new database (so its migrations run), with `llm` the model server (ready only when it answers)."""
    port = free_port()
    config = write_config(tmp_path, llm.base_url)
    config.write_text(config.read_text() + f"http:\n  port: {port}\nserve:\n  shutdown_grace: 2s\n{extra}")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config),
        cwd=str(REPO), env=child_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert (await wait_for_http(f"http://127.0.0.1:{port}/readyz")).status == 200
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        output = (await process.stdout.read()).decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    lines = [LOG_LINE.match(line) for line in output.splitlines() if line.strip()]
    assert all(lines), output  # every line is a log line
    return [match.groups() for match in lines if match]


async def test_the_start_log_says_what_an_operator_needs_and_no_library_chatter(tmp_path, otlp, llm):
    lines = await start_log(tmp_path, f"telemetry:\n  otlp_endpoint: {otlp.url}\n", llm)
    chatter = [line for line in lines if line[0] in ("DEBUG", "INFO") and not line[1].startswith(OURS)]
    assert chatter == []
    messages = [message for _, _, message in lines]
    assert any(m.startswith("HTTP server on http://127.0.0.1:") for m in messages)
    assert any(m.startswith(f"telemetry: traces to {otlp.url}/v1/traces (OTLP/HTTP") for m in messages)
    assert any(m.startswith("this instance is the leader") for m in messages)


async def test_logging_level_debug_shows_the_libraries_too(tmp_path, llm):
    lines = await start_log(tmp_path, "logging:\n  level: debug\n", llm)
    assert any(logger.startswith("alembic") for _, logger, _ in lines)  # what the default leaves out
    assert any(level == "DEBUG" for level, _, _ in lines)
