"""`gateway doctor` against the fake server: what it finds, what it tells the user to change."""

from __future__ import annotations

import socket
import subprocess
import sys

from fakes.llm import FakeLLM
from test_chat_cli import child_env

from gateway.cli.doctor import diagnose
from gateway.config import LLMConfig


def statuses(report) -> dict[str, str]:  # noqa: ANN001
    return {check.name: check.status for check in report.checks}


async def test_a_working_server_with_tool_calls_passes_every_check():
    async with FakeLLM(server_kind="vllm", context_window=32_768) as llm:
        llm.reply("hi")
        llm.tool_call("get_time", {"timezone": "Europe/Oslo"}, id="t1")
        llm.reply("It is noon.")
        report = await diagnose(LLMConfig(base_url=llm.base_url, model="m"))
    assert statuses(report) == {
        "reachable": "ok",
        "auth": "ok",
        "model listed": "ok",
        "api": "ok",
        "context window": "ok",
        "completion": "ok",
        "tools": "ok",
    }
    api = next(c for c in report.checks if c.name == "api")
    assert api.found == f"llm.api: chat; {llm.base_url} speaks it" and not api.fix
    window = next(c for c in report.checks if c.name == "context window")
    assert "32,768 tokens" in window.found and "max_model_len" in window.found
    assert llm.requests[-1]["messages"][-1] == {"role": "tool", "tool_call_id": "t1", "content": "12:00"}


async def test_tools_answered_with_text_are_reported_honestly():
    async with FakeLLM(usage_chunks=False) as llm:
        llm.reply("hi")
        llm.reply("I cannot check the time.")
        report = await diagnose(LLMConfig(base_url=llm.base_url, model="m"))
    tools = report.checks[-1]
    assert (tools.name, tools.status) == (
        "tools",
        "warn",
    ) and "accepted tools but the model returned text" in tools.found
    completion = next(c for c in report.checks if c.name == "completion")
    assert "without usage chunks" in completion.found and not report.failed


async def test_a_refused_key_stops_at_auth():
    async with FakeLLM(api_key="right") as llm:
        report = await diagnose(LLMConfig(base_url=llm.base_url, model="m", api_key="wrong"))
    assert statuses(report) == {"reachable": "ok", "auth": "fail"} and report.failed
    assert "llm.api_key" in report.checks[-1].fix


async def test_an_unknown_model_and_an_unsaid_window_are_named_with_the_fix():
    async with FakeLLM(server_kind="openai") as llm:
        llm.reply("hi")
        llm.reply("text")
        report = await diagnose(LLMConfig(base_url=llm.base_url, model="gpt-x"))
    checks = {c.name: c for c in report.checks}
    assert checks["model listed"].status == "warn" and "llm.model: m" in checks["model listed"].fix
    assert checks["context window"].status == "warn" and "llm.context_window" in checks["context window"].fix


def test_the_command_prints_the_checks_and_fails_on_an_unreachable_server(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = tmp_path / "config.yml"
    config.write_text(f"llm:\n  base_url: http://127.0.0.1:{port}/v1\n  model: m\n")
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "doctor", "--config", str(config), "--log-level", "warning"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert "✗ reachable: cannot reach" in done.stdout and "llm.base_url" in done.stdout


async def test_the_command_without_a_config_file_checks_the_server_the_environment_names(tmp_path):
    """Run from a directory without config.yml: LLM_BASE_URL, LLM_MODEL and LLM_API_KEY are the
    settings, as the README says (not the built-in local default)."""
    import asyncio

    async with FakeLLM(server_kind="vllm", context_window=8192, api_key="sk-env") as llm:
        llm.reply("hi")
        llm.tool_call("get_time", {"timezone": "Europe/Oslo"}, id="t1")
        llm.reply("It is noon.")
        env = child_env() | {"LLM_BASE_URL": llm.base_url, "LLM_MODEL": "env-model", "LLM_API_KEY": "sk-env"}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "doctor", "--log-level", "warning",
            env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
    assert not (tmp_path / "config.yml").exists()
    assert process.returncode == 0, out.decode() + err.decode()
    assert llm.base_url.split("//")[1].split("/")[0] in out.decode()  # the server it checked
    assert "✓ auth" in out.decode() and "✓ tools" in out.decode()
    assert {r.get("model") for r in llm.requests if r} == {"env-model"}  # {}: the probe of what it speaks
