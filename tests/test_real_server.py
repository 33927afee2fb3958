"""`gateway chat` and `gateway doctor` against a real OpenAI-compatible server written by others.

llama.cpp's server through llama-cpp-python, with a tiny model generated here whose chat
template is strict the way Llama-2, Mistral and Gemma templates are (tests/llamacpp/). The server
answers template errors and over-long prompts with a 200 and an empty stream, sends no usage
chunks, and says its window only when refusing a prompt over it: all of it is met here for real.
The tier skips, saying why, when the server's environment is not built (`.ci/run` builds it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes.llm import FakeLLM
from llamacpp.server import MODEL_ALIAS, N_CTX, LlamaServer, start_server, unavailable_reason
from test_chat_cli import ChatProcess, gateway_command

from gateway.config import LLMConfig
from gateway.llm import LLMClient, LLMError, Refused
from gateway.llm.api_probe import probe_apis, spoken

REPLY = "Sure thing."  # what the tiny model always answers


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory) -> LlamaServer:  # noqa: ANN001
    if reason := unavailable_reason():
        pytest.skip(f"real-server tier skipped: {reason}")
    server = start_server(tmp_path_factory.mktemp("llama"))
    yield server
    server.stop()


def write_config(directory: Path, base_url: str, model: str = MODEL_ALIAS) -> Path:
    path = directory / "config.yml"
    path.write_text(
        "database:\n"
        f"  url: sqlite+aiosqlite:///{directory / 'chat.db'}\n"
        "llm:\n"
        f"  base_url: {base_url}\n"
        f"  model: {model}\n"
        "  context_window: auto\n"
        "  temperature: 0\n"
        "  max_retries: 2\n"
        "  retry_budget_s: 20\n"
        "agent:\n"
        f"  workspace: {directory / 'workspace'}\n"
        "  system_prompt: You are a test agent.\n"
        "scheduler:\n"
        "  enabled: false\n"
        "inbox:\n"
        "  poll_interval_s: 0.1\n"
    )
    return path


def runs_of(config: Path) -> list[dict[str, str]]:
    """`gateway runs list`, newest first, each row by its column's name (read from the header)."""
    listed = gateway_command(config, "runs", "list")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    names = header.replace("tokens in/out", "tokens").split()
    return [dict(zip(names, row.split(), strict=True)) for row in rows if row.strip()]


def outcomes(runs: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(run["stage"], run["end"]) for run in runs]


async def test_first_and_second_turn_are_answered_and_their_tokens_estimated(llama_server, tmp_path):
    config = write_config(tmp_path, llama_server.base_url)
    chat = await ChatProcess.start(config)
    try:
        await chat.type("hello there")
        await chat.expect(REPLY, timeout=60)
        await chat.type("and a second question, with the first in the history")
        await chat.expect(REPLY, timeout=60)
        assert await chat.quit() == 0
    finally:
        await chat.kill()
    runs = runs_of(config)
    assert outcomes(runs) == [("SUCCESS", "reply"), ("SUCCESS", "reply")], runs
    assert runs[0]["model"] == MODEL_ALIAS
    tokens_in, tokens_out = runs[0]["tokens"].split("/")
    # Counted by the server's tokenizer (one token a character, and the BOS it adds): not 4 characters a token.
    assert tokens_in.startswith("~") and tokens_out in (f"~{len(REPLY)}", f"~{len(REPLY) + 1}")
    shown = gateway_command(config, "runs", "show", runs[0]["id"])
    assert "estimated: the server sent no usage" in shown.stdout, shown.stdout


async def test_the_first_message_is_answered_in_a_2048_token_window_with_the_default_tools(llama_server, tmp_path):
    """The default tools are more than this window holds (the template renders them as JSON,
    as real ones do, at one token a character): they are fitted to it at start, said once, and
    the first message gets its answer from the first request."""
    config = write_config(tmp_path, llama_server.base_url)  # agent.tools: every tool
    chat = await ChatProcess.start(config)
    try:
        await chat.type("hello there")
        await chat.expect(REPLY, timeout=60)
        assert await chat.quit() == 0
    finally:
        await chat.kill()
    runs = runs_of(config)
    assert outcomes(runs) == [("SUCCESS", "reply")], runs
    shown = gateway_command(config, "runs", "show", runs[0]["id"])
    assert "too long" not in shown.stdout, shown.stdout  # never refused, never sent again smaller
    said = f"fitted to the {N_CTX:,}-token window of {MODEL_ALIAS}"
    fitted = [line for line in chat.err.splitlines() if said in line]
    assert len(fitted) == 1 and "left out" in fitted[0], chat.err


async def test_a_turn_after_a_tool_exchange_is_answered(llama_server, tmp_path):
    """The tool exchange is made with the scripted server (the tiny model calls no tools); the
    next turn sends it, as history, to the real one and its strict template."""
    async with FakeLLM() as fake:
        fake.tool_call("clock", {}, id="call_1")
        fake.reply("It is noon.")
        config = write_config(tmp_path, fake.base_url, model="test-model")
        chat = await ChatProcess.start(config)
        try:
            await chat.type("what time is it?")
            await chat.expect("It is noon.")
            assert await chat.quit() == 0
        finally:
            await chat.kill()
    config = write_config(tmp_path, llama_server.base_url)
    chat = await ChatProcess.start(config)
    try:
        await chat.type("thanks, and now?")
        await chat.expect(REPLY, timeout=60)
        assert await chat.quit() == 0
    finally:
        await chat.kill()
    assert outcomes(runs_of(config))[0] == ("SUCCESS", "reply")  # newest first


async def test_an_over_long_message_gets_a_clear_reply_and_the_next_turn_works(llama_server, tmp_path):
    config = write_config(tmp_path, llama_server.base_url)
    chat = await ChatProcess.start(config)
    try:
        await chat.type("please read this: " + "lorem ipsum " * 300)
        await chat.expect(f"too long for the model's context window ({N_CTX:,} tokens)", timeout=90)
        await chat.type("a short one")
        await chat.expect(REPLY, timeout=60)
        assert await chat.quit() == 0
    finally:
        await chat.kill()
    assert outcomes(runs_of(config)) == [("SUCCESS", "reply"), ("FAILED", "overflow")]  # newest first


async def test_doctor_reports_what_this_server_does(llama_server, tmp_path):
    config = write_config(tmp_path, llama_server.base_url)
    done = gateway_command(config, "doctor")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"✓ model listed: '{MODEL_ALIAS}' is served" in out
    assert f"✓ api: llm.api: chat; {llama_server.base_url} speaks it\n" in out  # and nothing else
    assert f"✓ context window: {N_CTX:,} tokens (llama-cpp-python" in out
    assert "without usage chunks" in out
    assert "! tools: the server accepted tools but the model returned text" in out


async def test_the_probe_finds_it_speaks_chat_completions_only(llama_server):
    """What `gateway setup` and `gateway doctor` ask: its validation refuses an empty Chat
    Completions request; it has no Responses or Anthropic Messages route."""
    answers = await probe_apis(llama_server.base_url)
    assert spoken(answers) == ["chat"], answers
    assert (answers["responses"].detail, answers["anthropic"].detail) == ("HTTP 404", "HTTP 404")


async def test_the_real_server_refuses_as_the_fake_does(llama_server):
    """What the fake LLM imitates, checked against the real thing: a template error is an
    empty stream (a refusal after one retry), `content: null` beside tool calls a 500 dump."""
    async with LLMClient(LLMConfig(base_url=llama_server.base_url, model=MODEL_ALIAS, max_retries=3)) as client:
        hi = {"role": "user", "content": "hi"}
        with pytest.raises(Refused):
            await client.complete([hi, hi])
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        null = [
            hi,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ]
        with pytest.raises(LLMError, match="refused the request as invalid") as caught:
            await client.complete(null)
        assert caught.value.status == 500 and not caught.value.retryable
        empty = [hi, {**null[1], "content": ""}, null[2]]
        assert (await client.complete(empty)).text == REPLY
