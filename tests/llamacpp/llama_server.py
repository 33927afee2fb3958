"""llama.cpp's own `llama-server` for the tests: Chat Completions, the Anthropic Messages API and
the OpenAI Responses API from one process, built by tests/llamacpp/server_tier.py.

It runs the --chatml variant of the tiny model (tests/llamacpp/tiny_model.py): its template is one
llama-server parses tool calls and `<think>` reasoning from, so when tools are offered the model
thinks and calls `get_time` for real, and says REPLY after the tool's result or without tools.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from llamacpp import server_tier
from llamacpp.server import N_CTX, LlamaServer, free_port
from llamacpp.tiny_model import ARGUMENTS, REPLY, THOUGHT, TOOL

MODEL_ALIAS = "tiny-chatml"
START_TIMEOUT_S = 60.0
__all__ = ["ARGUMENTS", "MODEL_ALIAS", "N_CTX", "REPLY", "THOUGHT", "TOOL", "start_llama_server", "unavailable_reason"]


def unavailable_reason() -> str | None:
    return server_tier.unavailable_reason()


def make_model(directory: Path) -> Path:
    path = directory / "tiny-chatml.gguf"
    script = Path(__file__).resolve().parent / "tiny_model.py"
    subprocess.run([str(server_tier.python()), str(script), "--chatml", str(path)], check=True, timeout=120)
    return path


def start_llama_server(directory: Path) -> LlamaServer:
    model = make_model(directory)
    port = free_port()
    log = directory / "llama-server.log"
    command = [
        str(server_tier.server_binary()),
        "--model", str(model),
        "--alias", MODEL_ALIAS,
        "--ctx-size", str(N_CTX),
        "--parallel", "1",  # one slot: the whole window for each request
        "--threads", "1",
        "--jinja",
        "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=directory)
    server = LlamaServer(process, f"http://127.0.0.1:{port}/v1", log)
    try:
        _wait_until_serving(server)
    except BaseException:  # a failed start, and also pytest-timeout's exception: never leave it running
        server.stop()
        raise
    return server


def _wait_until_serving(server: LlamaServer) -> None:
    """llama-server answers /health with 503 while it loads the model, 200 once it serves."""
    deadline = time.monotonic() + START_TIMEOUT_S
    root = server.base_url.removesuffix("/v1")
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"llama-server exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(f"{root}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"llama-server did not start in {START_TIMEOUT_S:.0f}s:\n{server.log_tail()}")
