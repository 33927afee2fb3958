"""`gateway chat` end to end: the real command in a subprocess, talking to the fake LLM server.

The fake LLM runs in the test's event loop on 127.0.0.1; the chat process gets a config file
pointing `llm.base_url` at it and `database.url` at a temporary SQLite file. Output is read as
it arrives and every wait is for a piece of text, with a timeout (no sleeps as synchronisation).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fakes.llm import FakeLLM
from helpers import tool_results

REPO = Path(__file__).resolve().parents[1]
WAIT_S = 20.0
BANNER = "Talking to the agent."


def child_env() -> dict[str, str]:
    """The environment without settings that would override the test's config file."""
    prefixes = ("GATEWAY_", "TELEGRAM_", "SLACK_", "LLM_", "OPENAI_", "OTEL_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return env


def write_config(directory: Path, llm_url: str) -> Path:
    path = directory / "config.yml"
    path.write_text(
        "database:\n"
        f"  url: sqlite+aiosqlite:///{directory / 'chat.db'}\n"
        "llm:\n"
        f"  base_url: {llm_url}\n"
        "  model: test-model\n"
        "  max_retries: 1\n"
        "  retry_budget_s: 5\n"
        "agent:\n"
        f"  workspace: {directory / 'workspace'}\n"
        "  system_prompt: You are a test agent.\n"
        "scheduler:\n"
        "  enabled: false\n"
        "inbox:\n"
        "  poll_interval_s: 0.1\n"
    )
    return path


def gateway_command(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A one-shot `gateway ...` command (runs, sessions) against the chat's database."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args, "--config", str(config), "--log-level", "warning"],
        cwd=config.parent, env=child_env(), capture_output=True, text=True, timeout=60,
    )


class ChatProcess:
    """`gateway chat` with its stdout collected as it streams; `expect` waits for text."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.out = ""
        self.err = ""
        self.cursor = 0  # output before this offset was consumed by an earlier expect
        self._arrived = asyncio.Event()
        self._pumps = [
            asyncio.create_task(self._pump(proc.stdout, "out")),
            asyncio.create_task(self._pump(proc.stderr, "err")),
        ]

    @classmethod
    async def start(cls, config: Path, *, env: dict[str, str] | None = None) -> ChatProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "chat", "--config", str(config), "--log-level", "warning",
            cwd=config.parent, env=env or child_env(),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        chat = cls(proc)
        await chat.expect(BANNER)
        return chat

    async def _pump(self, stream: asyncio.StreamReader | None, name: str) -> None:
        assert stream is not None
        while chunk := await stream.read(4096):
            setattr(self, name, getattr(self, name) + chunk.decode(errors="replace"))
            self._arrived.set()
        self._arrived.set()

    async def expect(self, text: str, timeout: float = WAIT_S) -> str:
        """Wait until `text` appears after the cursor; return the output up to and including it."""
        deadline = asyncio.get_running_loop().time() + timeout
        while (index := self.out.find(text, self.cursor)) < 0:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0 or (self.proc.returncode is not None and all(p.done() for p in self._pumps)):
                raise AssertionError(
                    f"{text!r} not shown.\n--- stdout since last match:\n{self.out[self.cursor :]}"
                    f"\n--- stderr:\n{self.err[-3000:]}"
                )
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                pass
        end = index + len(text)
        segment, self.cursor = self.out[self.cursor:end], end
        return segment

    async def type(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def quit(self) -> int:
        await self.type("/quit")
        return await self.wait()

    async def wait(self) -> int:
        code = await asyncio.wait_for(self.proc.wait(), WAIT_S)
        await asyncio.gather(*self._pumps)
        return code

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        await asyncio.gather(*self._pumps, return_exceptions=True)


@pytest.fixture
def config(tmp_path: Path, llm: FakeLLM) -> Path:
    return write_config(tmp_path, llm.base_url)


@pytest.fixture
async def chat(config: Path):
    process = await ChatProcess.start(config)
    try:
        yield process
    finally:
        await process.kill()


def user_texts(request: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in request["messages"] if m.get("role") == "user"]


def run_timeline(config: Path, run_id: str) -> tuple[subprocess.CompletedProcess[str], list[tuple[str, str, str]]]:
    """`gateway runs show ID` and its timeline lines as (seq, kind, rest)."""
    report = gateway_command(config, "runs", "show", run_id)
    assert report.returncode == 0, report.stderr
    lines = re.finditer(r"^\s*#(\d+)\s+\+\s*[\d.]+s\s+(\w+)(.*)$", report.stdout, re.M)
    return report, [(m[1], m[2], m[3]) for m in lines]


def button_number(prompt_text: str, label: str) -> str:
    """The number the console shows for the button whose label contains `label`."""
    for number, shown in re.findall(r"\[(\d+)\]\s*(.+)", prompt_text):
        if label in shown:
            return number
    raise AssertionError(f"no button {label!r} in:\n{prompt_text}")


# ---- conversation -------------------------------------------------------------------------


async def test_replies_stream_to_stdout_ctrl_c_stops_a_turn_and_quit_exits_zero(chat: ChatProcess, llm: FakeLLM):
    llm.reply("Hello from the fake model, streamed in small pieces.")
    await chat.type("hi there")
    await chat.expect("Hello from the fake model, streamed in small pieces.")
    assert any("hi there" in text for text in user_texts(llm.requests[-1]))

    llm.stall("The first half of an answer")  # streams this, then never finishes
    await chat.type("tell me a long story")
    await chat.expect("The first half of an answer")  # shown while the LLM call is still open
    assert llm.disconnects == 0
    chat.proc.send_signal(signal.SIGINT)
    await chat.expect("Stopped.")
    await llm.wait_disconnect()  # the LLM request was cancelled, not left running

    llm.reply("A fresh answer after the stop.")
    await chat.type("are you still there?")
    await chat.expect("A fresh answer after the stop.")
    assert await chat.quit() == 0
    assert chat.out.rstrip().endswith("A fresh answer after the stop."), "output after /quit"


async def test_a_tool_turn_is_traced_and_the_call_is_shown(chat: ChatProcess, llm: FakeLLM, config: Path):
    llm.tool_call("clock", {}, id="call_1")
    llm.reply("Half past.")
    await chat.type("what time is it?")
    shown = await chat.expect("Half past.")
    assert await chat.quit() == 0
    assert tool_results(llm.requests[-1]), "the tool result was not sent back to the model"

    listed = gateway_command(config, "runs", "list")
    assert listed.returncode == 0, listed.stderr
    runs = [line.split() for line in listed.stdout.splitlines()[1:] if line.strip()]
    assert len(runs) == 1, listed.stdout
    run_id, stage, end = runs[0][:3]
    assert (stage, end) == ("SUCCESS", "reply")

    report, timeline = run_timeline(config, run_id)
    kinds = [kind for _, kind, _ in timeline]
    assert kinds == ["LLM_REQUEST", "LLM_RESPONSE", "TOOL_CALL", "LLM_REQUEST", "LLM_RESPONSE"], report.stdout
    _, _, tool_detail = timeline[2]
    assert f"<- #{timeline[1][0]}" in tool_detail and "clock done" in tool_detail, report.stdout
    assert "2 LLM calls, 1 tool calls" in report.stdout
    assert re.search(r"^trace [0-9a-f]{32}  turn span [0-9a-f]{16}$", report.stdout, re.M), report.stdout

    assert "clock" in shown, f"the tool call is not shown on the console:\n{shown}"


# ---- approvals ----------------------------------------------------------------------------


async def test_approval_buttons_are_numbered_and_typing_a_number_decides(
    chat: ChatProcess, llm: FakeLLM, tmp_path: Path, config: Path
):
    llm.tool_call("shell", {"command": "echo approved-by-number"}, id="call_1")
    llm.reply("The command ran.")
    await chat.type("run the echo command")
    prompt = await chat.expect("Allow in this chat")
    assert "shell" in prompt and "echo approved-by-number" in prompt
    assert len(llm.requests) == 1, "the turn went on before the decision"
    await chat.type(button_number(prompt, "Approve"))
    await chat.expect("Approved")
    await chat.expect("The command ran.")
    assert any("approved-by-number" in r for r in tool_results(llm.requests[-1])), "the approved command did not run"

    marker = tmp_path / "workspace" / "must-not-exist"
    llm.tool_call("shell", {"command": f"touch {marker}"}, id="call_2")
    llm.reply("Understood, I did not run it.")
    await chat.type("create the file")
    prompt = await chat.expect("Allow in this chat")
    await chat.type(button_number(prompt, "Deny"))
    await chat.expect("Denied")
    await chat.expect("Understood, I did not run it.")
    assert tool_results(llm.requests[-1])[-1] == "User rejected this tool call."
    assert not marker.exists()
    assert await chat.quit() == 0

    # The approved run's trace: the call ran after the park, linked to the response that asked.
    listed = gateway_command(config, "runs", "list")
    first_run = min(int(line.split()[0]) for line in listed.stdout.splitlines()[1:] if line.strip())
    report, timeline = run_timeline(config, str(first_run))
    kinds = [kind for _, kind, _ in timeline]
    assert kinds == ["LLM_REQUEST", "LLM_RESPONSE", "AWAITING_INPUT", "TOOL_CALL", "LLM_REQUEST", "LLM_RESPONSE"], (
        report.stdout
    )
    assert f"<- #{timeline[1][0]}" in timeline[3][2], (
        f"the resumed TOOL_CALL is not linked to its LLM_RESPONSE:\n{report.stdout}"
    )


# ---- sessions -----------------------------------------------------------------------------


async def test_new_starts_a_new_session(chat: ChatProcess, llm: FakeLLM, config: Path):
    llm.reply("Noted: apricot.")
    await chat.type("remember the word apricot")
    await chat.expect("Noted: apricot.")
    await chat.type("/new")
    await chat.expect("Started a new session.")
    llm.reply("A clean slate.")
    await chat.type("what word did I say?")
    await chat.expect("A clean slate.")
    assert await chat.quit() == 0

    assert len(llm.requests) == 2, "/new must not reach the model"
    assert not any("apricot" in text for text in user_texts(llm.requests[-1])), (
        "the new session still sees the old history"
    )
    listed = gateway_command(config, "sessions", "list")
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines() if "console:" in line]
    assert len(rows) == 2, listed.stdout
    assert "(closed)" in rows[1] and "(closed)" not in rows[0], listed.stdout  # newest first


# ---- bad input --------------------------------------------------------------------------------


async def test_runs_show_of_an_unknown_run_says_so(config: Path):
    result = gateway_command(config, "runs", "show", "999")
    assert result.returncode == 1
    assert "no run 999" in result.stderr


def test_a_bad_config_is_refused_naming_the_key(tmp_path: Path):
    path = tmp_path / "config.yml"
    path.write_text(json.dumps({"llm": {"context_window": "big"}}))  # JSON is YAML
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "chat", "--config", str(path)],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=60, input="",
    )
    assert result.returncode == 3  # the configuration's exit code (docs/operations.md)
    assert "llm.context_window" in result.stderr
    assert BANNER not in result.stdout
