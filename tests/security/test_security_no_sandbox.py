"""Item 10: without a sandbox the default fails closed.

The attack: on a machine without bubblewrap, the model (or a prompt injection it read) runs
`cat /proc/$PPID/environ` through the shell and gets the bot token and the model server's key.
With `agent.shell_sandbox: auto` (the default) the shell is then not offered to the model at
all, a call it makes anyway is refused without running, and the start log and `gateway doctor`
say in one line how to install bubblewrap or opt in to unconfined commands. The gateway runs as
a real process whose PATH has the usual tools but no `bwrap` (how the sandbox is found).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest
from fakes.llm import FakeLLM
from helpers import tool_results
from test_chat_cli import REPO, ChatProcess, child_env, write_config

KEY = "llm-key-marker-5e0c"
TOOLS = ("bash", "sh", "cat", "env", "tr", "echo", "true")
HOW_TO_FIX = ("apt-get install bubblewrap", "agent.shell_sandbox: none")


def path_without_bwrap(tmp_path: Path) -> str:
    """A PATH with the shell and the usual tools, but no bubblewrap."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in TOOLS:
        if found := shutil.which(name):
            (bin_dir / name).symlink_to(found)
    assert not (bin_dir / "bwrap").exists()
    return str(bin_dir)


def config_with(tmp_path: Path, llm: FakeLLM, extra: str = "") -> Path:
    """The chat's config: the shell allowed by a rule (no approval to wait for), a key to steal."""
    config = write_config(tmp_path, llm.base_url)
    text = config.read_text().replace("llm:\n", "llm:\n  api_key: ${LLM_API_KEY}\n", 1)
    config.write_text(text + "approvals:\n  rules:\n    - {tool: shell, action: allow}\n" + extra)
    return config


def env_without_bwrap(tmp_path: Path) -> dict[str, str]:
    return {**child_env(), "PATH": path_without_bwrap(tmp_path), "LLM_API_KEY": KEY}


def tool_names(request: dict) -> list[str]:
    return [tool["function"]["name"] for tool in request.get("tools", [])]


async def chat_once(config: Path, env: dict[str, str], llm: FakeLLM) -> ChatProcess:
    """`gateway chat` with the given environment: one message, its answer, then /quit."""
    chat = await ChatProcess.start(config, env=env)
    try:
        await chat.type("look around")
        await chat.expect("Done.")
        assert await chat.quit() == 0
    finally:
        await chat.kill()
    return chat


async def test_without_bubblewrap_the_shell_is_not_offered_and_a_call_is_refused(llm: FakeLLM, tmp_path):
    llm.tool_call("shell", {"command": "cat /proc/$PPID/environ | tr '\\0' '\\n'"}, id="steal")
    llm.reply("Done.")
    chat = await chat_once(config_with(tmp_path, llm), env_without_bwrap(tmp_path), llm)
    first, last = llm.requests[0], llm.requests[-1]
    assert "shell" not in tool_names(first) and "read_file" in tool_names(first)  # the rest is offered
    [result] = tool_results(last)
    assert KEY not in result and "not offered" in result and "bubblewrap" in result
    start_log = [line for line in chat.err.splitlines() if "shell sandbox" in line]
    assert len(start_log) == 1 and all(fix in start_log[0] for fix in HOW_TO_FIX), chat.err


async def test_doctor_says_how_to_install_bubblewrap_or_opt_in(llm: FakeLLM, tmp_path):
    doctor = await asyncio.create_subprocess_exec(  # the fake model server answers on this loop
        sys.executable, "-m", "gateway", "doctor", "--config", str(config_with(tmp_path, llm)),
        cwd=str(REPO), env=env_without_bwrap(tmp_path), stdout=asyncio.subprocess.PIPE,
    )
    out = (await asyncio.wait_for(doctor.communicate(), 60))[0].decode()
    said = [line for line in out.splitlines() if "apt-get install bubblewrap" in line]
    assert len(said) == 1 and "agent.shell_sandbox: none" in said[0], out
    assert "shell sandbox" in out and "not offered" in out


async def test_an_explicit_none_keeps_unconfined_commands_with_its_warning(llm: FakeLLM, tmp_path):
    """The operator's choice: `shell_sandbox: none` offers the shell and runs it unconfined."""
    llm.tool_call("shell", {"command": "echo ran-unconfined"}, id="c1")
    llm.reply("Done.")
    config = config_with(tmp_path, llm, "")
    config.write_text(config.read_text().replace("agent:\n", "agent:\n  shell_sandbox: none\n", 1))
    chat = await chat_once(config, env_without_bwrap(tmp_path), llm)
    assert "shell" in tool_names(llm.requests[0])
    assert "ran-unconfined" in tool_results(llm.requests[-1])[0]
    assert "UNCONFINED" in chat.err and "agent.shell_sandbox: none" in chat.err


@pytest.mark.parametrize("configured", ["bwrap", "unshare"])
async def test_an_explicit_sandbox_that_is_missing_is_not_offered_either(llm: FakeLLM, tmp_path, configured):
    llm.tool_call("shell", {"command": "echo hi"}, id="c1")
    llm.reply("Done.")
    config = config_with(tmp_path, llm)
    config.write_text(config.read_text().replace("agent:\n", f"agent:\n  shell_sandbox: {configured}\n", 1))
    env = env_without_bwrap(tmp_path)
    await chat_once(config, env, llm)
    assert "shell" not in tool_names(llm.requests[0])
    assert "not offered" in tool_results(llm.requests[-1])[0]
