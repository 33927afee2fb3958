"""`gateway setup` as a new user runs it: the real command in a subprocess, against the scripted
LLM server, the fake Bot API and the fake Slack (all real HTTP on 127.0.0.1).

With flags it writes a config.yml (no secrets in it) and a .env (0600) that `gateway serve`
starts with, and the owner it named is answered; run again it edits in place, keeps what the
person wrote, and changes an existing value only with --force; driven through stdin it asks,
re-asks after a refused token, and writes the same.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import stat
import sys
from pathlib import Path

import pytest
import yaml
from fakes.llm import FakeLLM
from fakes.slack import FakeSlack
from fakes.telegram import BOT_USERNAME, FakeTelegram
from test_chat_cli import REPO, child_env
from test_serve import free_port, wait_for_http

from gateway.cli.config_edit import DotEnv, EditError, YamlText
from gateway.config import Config, load_config

WAIT_S = 60.0


async def setup(config: Path, *args: str, answers: str | None = None) -> tuple[int, str]:
    """`gateway setup --config <config> ...`; `answers` (lines) make it an interactive run on a pipe."""
    mode = () if answers is not None else ("--non-interactive",)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "setup", "--config", str(config), *mode, *args,
        cwd=str(config.parent), env=child_env(), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate((answers or "").encode()), WAIT_S)
    return process.returncode or 0, out.decode()


def script_doctor_checks(llm: FakeLLM) -> None:
    """What the model server's checks ask for: a one-token answer, then a tool call round trip."""
    llm.reply("hi")
    llm.tool_call("get_time", {"timezone": "Europe/Oslo"}, id="t1")
    llm.reply("It is noon.")


def llm_flags(llm: FakeLLM, *more: str) -> list[str]:
    return ["--llm-base-url", llm.base_url, "--llm-api-key", "sk-setup", *more]


async def test_flags_write_a_config_serve_starts_with_and_the_owner_is_answered(tmp_path):
    async with FakeLLM(server_kind="vllm", context_window=32_768, api_key="sk-setup") as llm, \
            FakeTelegram() as telegram, FakeSlack() as slack:
        script_doctor_checks(llm)
        config = tmp_path / "config.yml"
        code, out = await setup(
            config, *llm_flags(llm),
            "--telegram-token", telegram.token, "--telegram-api-url", telegram.base_url, "--telegram-owner", "4242",
            "--slack-bot-token", slack.token, "--slack-app-token", slack.app_token, "--slack-api-url", slack.base_url,
        )
        assert code == 0, out
        assert "✓ tools" in out and "32,768 tokens" in out  # probed as doctor does, the window found
        assert f"@{BOT_USERNAME}" in out and "@gateway's in the workspace Fake" in out  # the bots' names
        assert "Socket Mode" in out
        assert f"gateway serve --config {config}" in out  # what to run next
        # Slack has no owner: its claim code is shown (Telegram's owner was given: none for it)
        claim = re.search(r"claim: slack has no admin yet: send `(\w{5}-\w{5})` to the bot", out)
        assert claim is not None and "claim: telegram" not in out, out

        text, env_file = config.read_text(), tmp_path / ".env"
        for secret in ("sk-setup", telegram.token, slack.token, slack.app_token):
            assert secret not in text and secret not in out
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        assert set(env_file.read_text().splitlines()) == {
            "LLM_API_KEY=sk-setup", f"TELEGRAM_BOT_TOKEN={telegram.token}",
            f"SLACK_BOT_TOKEN={slack.token}", f"SLACK_APP_TOKEN={slack.app_token}",
        }
        written = yaml.safe_load(text)
        assert written["llm"] == {"base_url": llm.base_url, "model": "m", "api_key": "${LLM_API_KEY}"}
        assert written["approvals"] == {"admins": {"telegram": [4242]}}

        # The person adds their own settings; then the gateway starts on this directory.
        port = free_port()
        config.write_text(text + f"http:\n  port: {port}\nserve:\n  shutdown_grace: 2s\n")
        serve = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--config", str(config),
            cwd=str(tmp_path), env=child_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        try:
            ready = await wait_for_http(f"http://127.0.0.1:{port}/readyz", timeout=WAIT_S)
            assert ready.status == 200
            assert [c for c in slack.calls if c.method == "apps.connections.open"]  # Socket Mode, with the xapp token
            telegram.private_message(4242, "hello")
            await until(lambda: telegram.bot_messages(4242), "the owner's message is answered")
            assert any(r.get("model") == "m" for r in llm.requests[-1:])
            serve.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(serve.wait(), 30) == 0
            assert claim.group(1) in (await serve.stdout.read()).decode()  # the start log shows the same code
        finally:
            if serve.returncode is None:
                serve.kill()
                await serve.wait()


async def test_a_rerun_edits_in_place_keeps_the_persons_edits_and_needs_force_to_change_a_value(tmp_path):
    async with FakeLLM(api_key="sk-setup") as llm:
        config = tmp_path / "config.yml"
        code, out = await setup(config, *llm_flags(llm))
        assert code == 0, out
        # The person's own edits: a comment, a setting of a section setup writes, another section.
        edited = config.read_text().replace("llm:\n", "llm:\n  # my server\n  max_retries: 2\n", 1)
        edited += "agent:\n  system_prompt: You are my assistant.   # keep this\n"
        config.write_text(edited)
        env_file = tmp_path / ".env"
        env_file.write_text(env_file.read_text() + "# mine\nMY_OTHER=1\n")
        env_file.chmod(0o644)

        code, out = await setup(config, *llm_flags(llm, "--llm-model", "bigger"))
        assert code == 3, out  # an existing value changes: not without --force
        assert "llm.model: m -> bigger" in out and "--force" in out
        assert config.read_text() == edited  # nothing written

        code, out = await setup(config, *llm_flags(llm, "--llm-model", "bigger"), "--force")
        assert code == 0, out
        assert config.read_text() == edited.replace("model: m\n", "model: bigger\n")  # only that line
        assert "# mine\nMY_OTHER=1\n" in env_file.read_text()
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600  # closed again
        assert load_config(config, env={"LLM_API_KEY": "sk-setup"}).agent.system_prompt == "You are my assistant."

        before = (config.read_text(), env_file.read_text())
        code, out = await setup(config, *llm_flags(llm, "--llm-model", "bigger"))
        assert code == 0 and "Nothing to change" in out, out
        assert (config.read_text(), env_file.read_text()) == before


async def test_the_shipped_config_is_edited_in_place_keeping_its_variables(tmp_path):
    """Run in the project directory, setup edits the commented config.yml the project ships: the
    `${LLM_BASE_URL:-...}` settings keep their variable (the README's way still overrides them)."""
    async with FakeLLM(api_key="sk-setup") as llm, FakeTelegram() as telegram:
        config = tmp_path / "config.yml"
        shutil.copy(REPO / "config.yml", config)
        shipped = yaml.safe_load(config.read_text())
        code, out = await setup(
            config, *llm_flags(llm), "--telegram-token", telegram.token, "--telegram-api-url", telegram.base_url,
            "--telegram-owner", "4242", "--context-window", "16384", "--force",
        )
        assert code == 0, out
        text = config.read_text()
        assert f"base_url: ${{LLM_BASE_URL:-{llm.base_url}}}" in text and "model: ${LLM_MODEL:-m}" in text
        assert "context_window: ${LLM_CONTEXT_WINDOW:-16384}" in text
        assert text.count("\n#") == (REPO / "config.yml").read_text().count("\n#")  # every comment kept
        written = yaml.safe_load(text)
        shipped["llm"].update(base_url=f"${{LLM_BASE_URL:-{llm.base_url}}}", model="${LLM_MODEL:-m}",
                              context_window="${LLM_CONTEXT_WINDOW:-16384}")
        shipped["telegram"].update(api_base_url=telegram.base_url, api_file_url=f"{telegram.url}/file/bot")
        shipped["approvals"]["admins"] = {"telegram": [4242]}
        assert written == shipped  # exactly those keys changed; the secrets' ${VAR:-} references stay
        loaded = load_with_dotenv(config)
        assert loaded.telegram.token == telegram.token and loaded.llm.api_key == "sk-setup"
        assert loaded.llm.context_window == 16384


async def test_an_interactive_run_through_stdin_asks_picks_a_model_and_asks_again_after_a_refused_token(tmp_path):
    async with FakeLLM(server_kind="openai", api_key="sk-setup") as llm, FakeTelegram() as telegram:
        llm.served = ("small", "tools-model")
        script_doctor_checks(llm)
        config = tmp_path / "config.yml"
        answers = "\n".join([
            llm.base_url,  # address
            "sk-setup",  # API key
            "2",  # the second model listed
            "16384",  # the window (an "openai" server does not say it)
            "y",  # Telegram
            "123:wrong",  # refused...
            telegram.token,  # ...asked again
            "not-a-number",  # the owner's id must be a number
            "4242",
            "n",  # no Slack
            "y",  # write
        ]) + "\n"
        code, out = await setup(config, "--telegram-api-url", telegram.base_url, answers=answers)
        assert code == 0, out
        assert "1. small" in out and "2. tools-model" in out
        assert "Telegram refused the bot token" in out and "@BotFather" in out and "123:wrong" not in out
        assert "a Telegram user id is a number" in out
        assert {r.get("model") for r in llm.requests if r} == {"tools-model"}  # {}: the probe of what it speaks
        loaded = load_with_dotenv(config)
        assert (loaded.llm.model, loaded.llm.context_window) == ("tools-model", 16384)
        assert loaded.telegram.token == telegram.token and loaded.approvals.admins == {"telegram": ["4242"]}
        assert not loaded.slack.enabled


async def test_a_failed_check_writes_nothing_and_says_what_to_fix(tmp_path):
    async with FakeLLM(api_key="sk-setup") as llm, FakeTelegram() as telegram:
        config = tmp_path / "config.yml"
        code, out = await setup(config, "--llm-base-url", llm.base_url, "--llm-api-key", "wrong")
        assert code == 1 and "✗ auth" in out and "nothing was written" in out, out
        code, out = await setup(config, "--llm-base-url", llm.base_url.removesuffix("/v1"), "--llm-api-key", "x")
        assert code == 1 and "ends in /v1" in out, out
        code, out = await setup(
            config, *llm_flags(llm), "--telegram-token", "123:wrong", "--telegram-api-url", telegram.base_url,
        )
        assert code == 1 and "Telegram refused the bot token" in out and "123:wrong" not in out, out
        assert not config.exists() and not (tmp_path / ".env").exists()


def test_the_editor_replaces_block_values_keeps_comments_and_refuses_what_it_cannot_edit_safely():
    text = (
        "approvals:\n  admins:\n    telegram:\n    - 1\n  rules:\n  - {tool: shell, action: require}\n"
        "llm:\n  base_url: \"http://a#b\"   # mine\n  model: x      # why\n"
    )
    edit = YamlText(text)
    edit.set("approvals", "admins", {"telegram": [1, 2]})
    edit.set("llm", "model", "y")
    edit.set("telegram", "token", "${TELEGRAM_BOT_TOKEN}")
    assert edit.text() == (
        "approvals:\n  admins: {telegram: [1, 2]}\n  rules:\n  - {tool: shell, action: require}\n"
        "llm:\n  base_url: \"http://a#b\"   # mine\n  model: y      # why\n"
        "\ntelegram:\n  token: ${TELEGRAM_BOT_TOKEN}\n"
    )
    twice = YamlText("llm:\n  model: a\n  model: b\n")  # which one counts is not setup's guess to make
    twice.set("llm", "model", "c")
    with pytest.raises(EditError, match="Set these by hand: llm.model: c"):
        twice.text()
    with pytest.raises(EditError, match="written on one line"):
        YamlText("llm: {model: a}\n").set("llm", "model", "c")
    with pytest.raises(EditError, match=r"not valid YAML \(line \d+\)"):
        YamlText("llm:\n  model: [\n")


def test_dotenv_lines_keep_their_order_comments_and_export():
    env = DotEnv("# keys\nexport LLM_API_KEY=old\nOTHER='a b'\n")
    env.set("LLM_API_KEY", "new value")
    env.set("TELEGRAM_BOT_TOKEN", "1:x")
    env.remove("OTHER")
    assert env.text() == "# keys\nexport LLM_API_KEY='new value'\nTELEGRAM_BOT_TOKEN=1:x\n"
    assert env.values() == {"LLM_API_KEY": "new value", "TELEGRAM_BOT_TOKEN": "1:x"}


def load_with_dotenv(config: Path) -> Config:
    """The settings a start reads: the .env beside the file (this process's environment untouched)."""
    return load_config(config, env=DotEnv((config.parent / ".env").read_text()).values())


async def until(condition, what: str, timeout: float = WAIT_S) -> None:  # noqa: ANN001
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.05)
