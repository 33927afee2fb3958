"""A small model answers its first message, and readiness means ready.

The scripted server plays a llama.cpp server with a 2,048-token window that counts a request the
way a chat template renders it (every message's text, every tool's schema as JSON) and refuses
one over its window, as llama.cpp does. Against it the default tools alone were ~3,000 tokens:
every message was refused. Now the tools, the system prompt and the memory are fitted to the
window (shorter descriptions, tools left out by priority), said once at start and by `gateway
doctor`; the start checks the model server and says what it found; /readyz reports it; and a
person in a chat never reads the model server's address in an error.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
from fakes.llm import FakeLLM, HttpError, Reply, ScriptItem, context_error_body, user_texts
from test_chat_cli import REPO, ChatProcess, child_env, write_config
from test_metrics import StoreOnly
from test_serve import LOG_LINE, free_port, wait_for_http

from gateway.config import HttpConfig, LLMConfig
from gateway.context.budget import make_budget
from gateway.context.fitting import fit_request
from gateway.llm import LLMClient
from gateway.llm.checkup import ModelServerCheck
from gateway.serving.proxies import Origin
from gateway.serving.status import StatusPages

WINDOW = 2_048
RESERVE = 0.12  # llm.reserve_pct: the answer's room
ANSWER = "Hello from a small model."


def rendered_tokens(request: dict[str, Any]) -> int:
    """Tokens of a request as a chat template renders it, at three characters a token: each
    message's role and text (and its tool calls), then each tool's schema as JSON."""
    parts = []
    for message in request["messages"]:
        content = message.get("content") or ""
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
        calls = "".join(json.dumps(call) for call in message.get("tool_calls") or ())
        parts.append(f"[{message['role']}]\n{text}{calls}\n")
    parts += [json.dumps(tool, ensure_ascii=False) + "\n" for tool in request.get("tools") or ()]
    return math.ceil(len("".join(parts)) / 3)


def small_server(request: dict[str, Any]) -> ScriptItem:
    """llama.cpp with a 2,048-token window: a prompt over it is refused with its numbers."""
    tokens = rendered_tokens(request)
    if tokens > WINDOW:
        return HttpError(400, context_error_body("llamacpp", tokens, WINDOW))
    return Reply(ANSWER)


def tool_names(request: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in request.get("tools") or ()]


def parameter_descriptions(schema: Any) -> int:
    """Descriptions anywhere in a parameters schema (a property *named* description is not one)."""
    if isinstance(schema, list):
        return sum(parameter_descriptions(item) for item in schema)
    if not isinstance(schema, dict):
        return 0
    found = int(isinstance(schema.get("description"), str))
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict):
            found += sum(parameter_descriptions(v) for v in value.values())
        elif key != "description":
            found += parameter_descriptions(value)
    return found


def fit_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "fitted to the 2,048-token window of test-model" in line]


# ---- the first message, through `gateway chat` -----------------------------------------------
async def test_a_2048_token_window_answers_the_first_message_with_the_default_tools(tmp_path):
    async with FakeLLM(server_kind="llamacpp", context_window=WINDOW, responder=small_server) as llm:
        config = write_config(tmp_path, llm.base_url)  # agent.tools: every tool, memory on
        chat = await ChatProcess.start(config)
        try:
            await chat.type("hello there")
            await chat.expect(ANSWER)
            assert await chat.quit() == 0
        finally:
            await chat.kill()
    assert len(llm.requests) == 1, "the first request fitted: nothing was refused and sent again"
    request = llm.requests[0]
    assert user_texts(request) == ["hello there"]
    # The request leaves the answer its room (llm.reserve_pct) and the conversation room too.
    assert rendered_tokens(request) <= WINDOW * (1 - RESERVE)
    offered = tool_names(request)
    assert offered and "ask_user" in offered and "delegate" not in offered  # the most useful kept, the least left out
    for tool in request["tools"]:
        function = tool["function"]
        assert function["description"].count(". ") == 0, function["description"]  # its first sentence
        assert parameter_descriptions(function["parameters"]) == 0
    # Said once, naming the model, the window and what was left out.
    said = fit_lines(chat.err)
    assert len(said) == 1, chat.err
    assert "left out" in said[0] and "delegate" in said[0] and "first sentence" in said[0]


def test_fitting_keeps_the_tools_by_priority_and_a_property_named_description():
    budget = make_budget(2_048, 12, 10_000)
    note = {
        "type": "function",
        "function": {
            "name": "note_add",
            "description": "Add a note. It is kept for the session. Use it often.",
            "parameters": {
                "type": "object",
                "properties": {
                    "description": {"type": "string", "description": "What the note says, in full."},
                    "tags": {"type": "array", "items": {"type": "string", "description": "one tag"}},
                },
                "required": ["description"],
            },
        },
    }
    modes = {"type": "object", "properties": {"mode": {"type": "string", "enum": [f"mode_{i}" for i in range(80)]}}}
    long = "Does something with a description that goes on " + "and on " * 60 + "until it ends."
    bulky = [
        {"type": "function", "function": {"name": f"extra_{n}", "description": long, "parameters": modes}}
        for n in range(4)
    ]
    fit = fit_request(budget, "You are a test agent.", "", [*bulky, note], priority=["note_*"], model="m")
    kept = {tool["function"]["name"]: tool["function"] for tool in fit.tools}
    assert "note_add" in kept and len(kept) < 5 and fit.dropped and fit.shortened
    assert all(len(f["description"]) <= 200 for f in kept.values())  # a long first sentence is cut too
    assert kept["note_add"]["description"] == "Add a note."
    properties = kept["note_add"]["parameters"]["properties"]
    assert set(properties) == {"description", "tags"} and "description" not in properties["description"]
    assert parameter_descriptions(kept["note_add"]["parameters"]) == 0
    assert kept["note_add"]["parameters"]["required"] == ["description"]
    unbudgeted = fit_request(make_budget(0, 12, 10_000), "p", "", [*bulky, note], priority=[], model="m")
    assert [t["function"] for t in unbudgeted.tools] == [t["function"] for t in [*bulky, note]]
    assert not unbudgeted.cut and "unbudgeted" in unbudgeted.describe()


# ---- said once at start, and by doctor -------------------------------------------------------
async def serve_log(config: Path, port: int) -> tuple[list[tuple[str, str, str]], int, dict[str, Any]]:
    """`gateway serve` from start to SIGTERM: its log lines, and /readyz's status and body."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config),
        cwd=str(REPO), env=child_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await wait_for_http(f"http://127.0.0.1:{port}/healthz")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
                status, body = response.status, await response.json()
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        assert process.stdout is not None
        output = (await process.stdout.read()).decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    lines = [LOG_LINE.match(line) for line in output.splitlines() if line.strip()]
    assert all(lines), output
    return [match.groups() for match in lines if match], status, body


def serving_config(tmp_path: Path, base_url: str, port: int) -> Path:
    config = write_config(tmp_path, base_url)
    config.write_text(config.read_text() + f"http:\n  port: {port}\nserve:\n  shutdown_grace: 2s\n")
    return config


async def test_serve_says_once_what_it_found_and_what_was_cut_for_which_model(tmp_path):
    port = free_port()
    async with FakeLLM(server_kind="llamacpp", context_window=WINDOW) as llm:
        lines, status, body = await serve_log(serving_config(tmp_path, llm.base_url, port), port)
    messages = [message for _, _, message in lines]
    found = [m for m in messages if m.startswith("model server ")]
    assert len(found) == 1, messages
    assert "reachable" in found[0] and "test-model" in found[0] and "2,048 tokens" in found[0]
    cut = fit_lines("\n".join(messages))
    assert len(cut) == 1 and "left out" in cut[0], messages
    assert status == 200 and body["ready"] is True
    assert body["model_server"]["reachable"] is True and body["model_server"]["window"] == WINDOW


async def test_serve_with_the_model_server_down_is_degraded_and_says_the_fix(tmp_path):
    """Degraded, not unready: messages are still taken and kept (a 503 would have webhooks held
    back and lost), and the state says what is wrong."""
    port, nothing = free_port(), free_port()
    config = serving_config(tmp_path, f"http://127.0.0.1:{nothing}/v1", port)
    lines, status, body = await serve_log(config, port)
    assert status == 200 and body["ready"] is True and body["degraded"] is True
    assert body["model_server"]["reachable"] is False and "llm.base_url" in body["model_server"]["problem"]
    found = [(level, message) for level, _, message in lines if message.startswith("model server ")]
    assert len(found) == 1 and found[0][0] == "WARNING", lines
    assert "not reachable" in found[0][1] and "llm.base_url" in found[0][1]


async def test_readyz_follows_the_model_server(sqlite_store):
    """Its state is checked again once it is old: a server that refused the key and then took
    it makes the gateway degraded, then not, without a restart."""
    now = [0.0]
    async with FakeLLM(api_key="right") as llm:
        async with LLMClient(LLMConfig(base_url=llm.base_url, model="m", api_key="wrong")) as client:
            health = ModelServerCheck(client, clock=lambda: now[0])
            pages = StatusPages(StoreOnly(sqlite_store), HttpConfig(), model_server=health)
            local = Origin(client="127.0.0.1", local=True, https=False)
            refused = await pages.readyz(local, "")
            shown = json.loads(refused.body)
            assert shown["degraded"] is True and "llm.api_key" in shown["model_server"]["problem"]
            llm.api_key = None  # the server now takes any key
            assert json.loads((await pages.readyz(local, "")).body)["degraded"] is True  # not asked again yet
            now[0] += 60
            answered = json.loads((await pages.readyz(local, "")).body)
            assert answered["degraded"] is False and answered["model_server"]["reachable"] is True


async def test_doctor_says_what_the_window_leaves_out(tmp_path):
    async with FakeLLM(server_kind="llamacpp", context_window=WINDOW) as llm:
        config = write_config(tmp_path, llm.base_url)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "doctor", "--config", str(config), "--log-level", "warning",
            cwd=str(tmp_path), env=child_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
    printed = out.decode()
    fit = [line for line in printed.splitlines() if line.startswith("! request fit:")]
    assert len(fit) == 1, printed + err.decode()
    assert "2,048-token window" in fit[0] and "left out" in fit[0]
    assert "agent.tool_priority" in printed  # the fix names what to set
    assert fit_lines(err.decode()) == []  # printed as a check, not logged besides


# ---- a person in a chat never reads an internal URL ------------------------------------------
async def test_a_chat_error_does_not_show_the_model_servers_address(tmp_path):
    nothing = free_port()
    config = write_config(tmp_path, f"http://127.0.0.1:{nothing}/v1")
    chat = await ChatProcess.start(config)
    try:
        await chat.type("hello?")
        apology = await chat.expect("Please try again.", timeout=30)
        assert await chat.quit() == 0
    finally:
        await chat.kill()
    assert "Sorry, I couldn't finish that: the model server cannot be reached" in apology
    assert str(nothing) not in chat.out and "http://" not in chat.out and "127.0.0.1" not in chat.out
