"""The gateway's model client in each API against real servers written by others.

- llama.cpp's own `llama-server` (tests/llamacpp/server_tier.py), which serves Chat Completions,
  the Anthropic Messages API and the OpenAI Responses API itself, with the tiny --chatml model:
  when tools are offered it thinks and calls `get_time` (llama-server parses both from the
  generation), after the tool's result it answers REPLY;
- LiteLLM's proxy (tests/llamacpp/litellm_tier.py) in front of that llama-server's Chat
  Completions, serving Responses and Anthropic Messages by its own translation to and from
  Chat Completions.

For each: a streamed answer, and a tool round trip (the call decoded from the server's stream,
its result sent back in the API's shape with what the answer asked to have carried, and the
server accepting it); `gateway doctor` in each API; and what the probe of `gateway setup` and
`gateway doctor` finds each server speaks. docs/model-servers.md has the table of what each
test proves. Each tier skips, saying why, when it is not built (`.ci/run` builds them).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from llamacpp import litellm_tier
from llamacpp.llama_server import (
    ARGUMENTS,
    MODEL_ALIAS,
    N_CTX,
    REPLY,
    THOUGHT,
    TOOL,
    start_llama_server,
    unavailable_reason,
)
from llamacpp.server import LlamaServer, free_port

from gateway.cli.doctor import PROBE_TOOL, diagnose
from gateway.config import LLMConfig
from gateway.llm import LLMClient, Replay, TextDelta, collect
from gateway.llm.api_probe import probe_apis, spoken
from gateway.llm.events import Completion, Finish, StreamEvent
from gateway.llm.formats import REPLAY_KEY

pytestmark = pytest.mark.timeout(300)
LITELLM_START_S = 180.0  # its first start imports a great deal


@pytest.fixture(scope="module")
def llama_cpp(tmp_path_factory) -> Iterator[LlamaServer]:  # noqa: ANN001
    if reason := unavailable_reason():
        pytest.skip(f"llama-server tier skipped: {reason}")
    server = start_llama_server(tmp_path_factory.mktemp("llama-server"))
    yield server
    server.stop()


@dataclass
class Proxy:
    process: subprocess.Popen[bytes]
    base_url: str
    log: Path
    key: str  # its master key: it refuses to start without one

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture(scope="module")
def litellm(llama_cpp: LlamaServer, tmp_path_factory) -> Iterator[Proxy]:  # noqa: ANN001
    if reason := litellm_tier.unavailable_reason():
        pytest.skip(f"LiteLLM tier skipped: {reason}")
    directory = tmp_path_factory.mktemp("litellm")
    config = directory / "litellm.yaml"
    # `llamafile/`: an OpenAI-compatible Chat Completions server to LiteLLM, one it knows no
    # Responses API of, so both APIs are translated to Chat Completions (`openai/` would pass
    # Responses through).
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL_ALIAS}\n"
        "    litellm_params:\n"
        f"      model: llamafile/{MODEL_ALIAS}\n"
        f"      api_base: {llama_cpp.base_url}\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
    )
    port = free_port()
    log = directory / "litellm.log"
    key = "sk-" + secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env |= {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": key}  # nothing fetched at start
    command = [str(litellm_tier.litellm_binary()), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=directory, env=env)
    proxy = Proxy(process, f"http://127.0.0.1:{port}/v1", log, key)
    try:
        _wait_for(proxy)
    except BaseException:
        proxy.stop()
        raise
    yield proxy
    proxy.stop()


def _wait_for(proxy: Proxy) -> None:
    deadline = time.monotonic() + LITELLM_START_S
    while time.monotonic() < deadline:
        if proxy.process.poll() is not None:
            raise RuntimeError(f"LiteLLM exited with {proxy.process.returncode}:\n{proxy.log.read_text()[-4000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(proxy.base_url.removesuffix("/v1") + "/health/liveliness", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"LiteLLM did not start in {LITELLM_START_S:.0f}s:\n{proxy.log.read_text()[-4000:]}")


def config_for(base_url: str, api: str, key: str = "none", **more: Any) -> LLMConfig:
    return LLMConfig(base_url=base_url, model=MODEL_ALIAS, api=api, api_key=key, temperature=0, max_retries=1, **more)


async def answer(
    client: LLMClient, messages: list[dict[str, Any]], **options: Any
) -> tuple[Completion, list[StreamEvent]]:
    """The collected answer and every event of its stream, in order."""
    events: list[StreamEvent] = []

    async def tapped() -> Any:
        async with contextlib.aclosing(client.stream(messages, **options)) as stream:  # type: ignore[type-var]
            async for event in stream:
                events.append(event)
                yield event

    return await collect(tapped()), events


def next_round(messages: list[dict[str, Any]], first: Completion, events: list[StreamEvent]) -> list[dict[str, Any]]:
    """The turn loop's next round: the assistant's calls, with the replay its answer emitted, and a result each."""
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in first.tool_calls
    ]
    assistant: dict[str, Any] = {"role": "assistant", "content": first.text, "tool_calls": calls}
    replays = [e for e in events if isinstance(e, Replay)]
    if replays:
        assistant[REPLAY_KEY] = {"api": replays[-1].api, "data": json.loads(json.dumps(replays[-1].data))}
    results = [{"role": "tool", "tool_call_id": c.id, "content": "12:00"} for c in first.tool_calls]
    return [*messages, assistant, *results]


HELLO = [{"role": "system", "content": "You are a test agent."}, {"role": "user", "content": "hello there"}]
ASK_TIME = [{"role": "user", "content": "What time is it in Europe/Oslo?"}]


# ---- llama.cpp's llama-server: each API from the server itself ---------------------------------
@pytest.mark.parametrize("api", ["chat", "anthropic", "responses"])
async def test_llama_server_streams_an_answer(llama_cpp, api):
    async with LLMClient(config_for(llama_cpp.base_url, api)) as client:
        done, events = await answer(client, HELLO)
    assert done.text == REPLY and done.finish_reason == "stop" and not done.tool_calls
    assert len([e for e in events if isinstance(e, TextDelta)]) > 1, "streamed in pieces, not in one"
    assert isinstance(events[-1], Finish) or any(isinstance(e, Finish) for e in events)


@pytest.mark.parametrize("api", ["chat", "anthropic", "responses"])
async def test_llama_server_tool_round_trip_with_reasoning(llama_cpp, api):
    async with LLMClient(config_for(llama_cpp.base_url, api)) as client:
        first, events = await answer(client, ASK_TIME, tools=[PROBE_TOOL])
        assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [(TOOL, ARGUMENTS)], first
        assert first.finish_reason == "tool_calls"
        assert first.reasoning.strip() == THOUGHT  # llama-server parsed the model's <think> for each API
        second, _ = await answer(client, next_round(ASK_TIME, first, events), tools=[PROBE_TOOL])
    assert second.text == REPLY and not second.tool_calls


async def test_llama_server_sends_anthropic_thinking_back_as_it_came(llama_cpp):
    """The thinking block (llama-server signs it with an empty signature) goes back unchanged
    before the tool_use it came with, and the server renders it into the next prompt."""
    async with LLMClient(config_for(llama_cpp.base_url, "anthropic", reasoning="low")) as client:
        first, events = await answer(client, ASK_TIME, tools=[PROBE_TOOL])
        (replay,) = [e for e in events if isinstance(e, Replay)]
        assert replay.api == "anthropic"
        assert [(b["type"], b["thinking"].strip(), b["signature"]) for b in replay.data] == [("thinking", THOUGHT, "")]
        second, _ = await answer(client, next_round(ASK_TIME, first, events), tools=[PROBE_TOOL])
    assert second.text == REPLY


@pytest.mark.parametrize("api", ["chat", "anthropic", "responses"])
async def test_doctor_checks_each_api_of_llama_server(llama_cpp, api):
    report = await diagnose(config_for(llama_cpp.base_url, api))
    checks = {c.name: c for c in report.checks}
    assert not report.failed, report.checks
    assert {name: c.status for name, c in checks.items()} == {
        "reachable": "ok", "auth": "ok", "model listed": "ok", "api": "ok", "context window": "ok",
        "completion": "ok", "tools": "ok", **({"thinking": "ok"} if api == "anthropic" else {}),
    }  # fmt: skip
    assert checks["api"].found.startswith(f"llm.api: {api}; {llama_cpp.base_url} speaks it (it also speaks ")
    assert f"{N_CTX:,} tokens" in checks["context window"].found
    assert checks["tools"].found == f"the model called {TOOL} and the server accepted its result"
    if api == "anthropic":
        assert checks["thinking"].found.startswith("1 thinking block(s), 0 signed, went back unchanged")


async def test_the_probe_finds_every_api_llama_server_speaks(llama_cpp):
    answers = await probe_apis(llama_cpp.base_url, "none")
    assert spoken(answers) == ["chat", "responses", "anthropic"], answers


# ---- LiteLLM's proxy in front of llama-server's Chat Completions --------------------------------
@pytest.mark.parametrize("api", ["responses", "anthropic"])
async def test_litellm_streams_an_answer(litellm, api):
    async with LLMClient(config_for(litellm.base_url, api, litellm.key)) as client:
        done, events = await answer(client, HELLO)
    assert done.text == REPLY and done.finish_reason == "stop" and not done.tool_calls
    assert len([e for e in events if isinstance(e, TextDelta)]) > 1, "streamed in pieces, not in one"


@pytest.mark.parametrize("api", ["responses", "anthropic"])
async def test_litellm_tool_round_trip(litellm, api):
    """The call llama-server parsed, through LiteLLM's translation into the API's stream, and
    its result back through the translation into a Chat Completions history the template
    accepts only with the result right after its call."""
    async with LLMClient(config_for(litellm.base_url, api, litellm.key)) as client:
        first, events = await answer(client, ASK_TIME, tools=[PROBE_TOOL])
        assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [(TOOL, ARGUMENTS)], first
        assert first.finish_reason == "tool_calls"
        second, _ = await answer(client, next_round(ASK_TIME, first, events), tools=[PROBE_TOOL])
    assert second.text == REPLY and not second.tool_calls


@pytest.mark.parametrize("api", ["responses", "anthropic"])
async def test_doctor_checks_each_api_of_litellm(litellm, api):
    report = await diagnose(config_for(litellm.base_url, api, litellm.key))
    checks = {c.name: c.status for c in report.checks}
    assert not report.failed, report.checks
    assert checks["api"] == "ok" and checks["completion"] == "ok" and checks["tools"] == "ok", report.checks


async def test_the_probe_finds_every_api_litellm_speaks(litellm):
    answers = await probe_apis(litellm.base_url, litellm.key)
    assert spoken(answers) == ["chat", "responses", "anthropic"], answers
