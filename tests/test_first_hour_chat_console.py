"""The first hour in `gateway chat`.

`gateway chat` runs as a real process against the scripted LLM server: a turn waiting on a
prompt shows the prompt again after a restart (and a number typed then decides it); a number
that is no button is answered in the terminal and never reaches the agent; the terminal says
what to type, never "tap".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fakes.llm import FakeLLM, user_texts
from helpers import tool_results
from test_chat_cli import ChatProcess, button_number, write_config


@pytest.fixture
def config(tmp_path: Path, llm: FakeLLM) -> Path:
    return write_config(tmp_path, llm.base_url)


def choices_of(prompt: str) -> list[str]:
    return re.findall(r"^\s*\[(\d+)\]", prompt, re.M)


# ---- gateway chat ---------------------------------------------------------------------------


@pytest.mark.parametrize("ended_by", ["quit", "kill -9"])
async def test_a_prompt_waiting_over_a_restart_is_shown_again_and_a_number_decides_it(
    config: Path, llm: FakeLLM, ended_by: str
):
    assert config.read_text().endswith("inbox:\n  poll_interval_s: 0.1\n")
    with config.open("a") as file:  # the killed holder's lease on the thread runs out soon
        file.write("  lease_ttl_s: 2\n")
    llm.tool_call("shell", {"command": "echo decided-after-restart"}, id="call_1")
    llm.reply("The command ran after the restart.")
    chat = await ChatProcess.start(config)
    try:
        await chat.type("run the echo command")
        first = await chat.expect("Allow in this chat")
        assert "echo decided-after-restart" in first
        if ended_by == "quit":
            assert await chat.quit() == 0
    finally:
        await chat.kill()

    chat = await ChatProcess.start(config)
    try:
        shown = await chat.expect("Allow in this chat")  # before anything is typed
        assert "Approve `shell`?" in shown and "echo decided-after-restart" in shown, shown
        assert choices_of(shown) == ["1", "2", "3", "4"], shown
        assert "Waiting for a decision" not in shown
        assert len(llm.requests) == 1, "the parked turn went on before the decision"
        await chat.type(button_number(shown, "Approve"))
        await chat.expect("Approved")
        await chat.expect("The command ran after the restart.")
        assert any("decided-after-restart" in r for r in tool_results(llm.requests[-1]))
        assert await chat.quit() == 0
    finally:
        await chat.kill()


async def test_a_number_that_is_no_choice_is_answered_and_never_reaches_the_agent(config: Path, llm: FakeLLM):
    llm.tool_call("shell", {"command": "echo chosen"}, id="call_1")
    llm.reply("Done choosing.")
    chat = await ChatProcess.start(config)
    try:
        await chat.type("run it")
        prompt = await chat.expect("Allow in this chat")
        for typed in ("7", "0", "12"):
            await chat.type(typed)
            assert "Choose 1-4" in await chat.expect("Choose 1-4"), typed
        await chat.type(button_number(prompt, "Deny"))
        await chat.expect("Denied")
        await chat.expect("Done choosing.")
        assert await chat.quit() == 0
    finally:
        await chat.kill()
    assert len(llm.requests) == 2
    assert tool_results(llm.requests[-1])[-1] == "User rejected this tool call.", "a typed number became the reason"
    assert all(typed not in user_texts(r) for r in llm.requests for typed in ("7", "0", "12"))
    assert "Waiting for a decision" not in chat.out


async def test_the_terminal_says_what_to_type_and_never_tap(config: Path, llm: FakeLLM):
    llm.tool_call("shell", {"command": "echo typed"}, id="call_1")
    llm.reply("It ran.")
    chat = await ChatProcess.start(config)
    try:
        await chat.type("run it")
        prompt = await chat.expect("to choose.")
        assert prompt.rstrip().endswith("Allow in this chat\nType 1-4 to choose."), prompt
        await chat.type("why do you need the shell?")  # a message while the request waits
        notice = await chat.expect("your message is used as the reason")
        assert "type its number" in notice, notice
        await chat.type(button_number(prompt, "Approve"))
        await chat.expect("It ran.")
        assert await chat.quit() == 0
    finally:
        await chat.kill()
    assert "tap" not in chat.out.lower(), chat.out
