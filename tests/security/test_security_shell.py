"""Item 7: the shell cannot read the gateway's secrets.

The attack: a command (the model's, or a prompt injection's) reads the gateway's environment
through /proc, the config file, `.env`, the SQLite database and the owner's ~/.ssh. With the
default settings on Linux it must see none of them. Run through the gateway, so the wiring (the
session's directory, the default sandbox) is the one in production.
"""

from __future__ import annotations

import logging
import shutil
import subprocess

import pytest
from fakes.llm import FakeLLM
from harness import make_config, running_gateway
from helpers import tool_results

from gateway.tools.builtin_shell import sandbox_status

TOKEN = "123456:bot-token-marker-9d1e"
CREDENTIAL = "credential-marker-66c2"  # under a name no denylist knows


def _bwrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    done = subprocess.run(["bwrap", "--unshare-pid", "--ro-bind", "/", "/", "true"], capture_output=True, check=False)
    return done.returncode == 0


needs_bwrap = pytest.mark.skipif(
    not _bwrap_works(), reason="bubblewrap (bwrap) is not installed or cannot create namespaces"
)


@pytest.fixture
def secrets(tmp_path, monkeypatch):
    """The gateway's surroundings: a project with .env and config, an owner's home with a key."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("ssh-key-marker-41aa\n")
    (tmp_path / ".env").write_text("TELEGRAM_BOT_TOKEN=dotenv-marker-0b7f\n")
    (tmp_path / "config.yml").write_text("llm:\n  api_key: config-marker-c3d2\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("ACME_SERVICE_CREDENTIALS", CREDENTIAL)
    return {
        "proc parent environ": "cat /proc/$PPID/environ",
        "proc 1 environ": "cat /proc/1/environ",
        "all environ": "cat /proc/*/environ",
        "env": "env",
        "config": f"cat {tmp_path}/config.yml",
        ".env": f"cat {tmp_path}/.env ../../../.env",
        "database": f"head -c 16384 {tmp_path}/gateway.db",
        "home": f"cat {home}/.ssh/id_ed25519 ~/.ssh/id_ed25519",
    }


MARKERS = (TOKEN, CREDENTIAL, "dotenv-marker-0b7f", "config-marker-c3d2", "ssh-key-marker-41aa", "CREATE TABLE")


async def _run_each(store, tmp_path, commands: dict[str, str], source: str = "", **agent) -> dict[str, str]:  # noqa: ANN001
    async with FakeLLM() as llm:
        for n, command in enumerate(commands.values()):
            llm.tool_call("shell", {"command": command + " 2>&1; true"}, id=f"c{n}")
        llm.reply("Done.")
        config = make_config(
            llm.base_url,
            str(tmp_path / "ws"),
            agent=agent,
            approvals={"rules": [{"tool": "shell", "action": "allow"}]},
        )
        if source:  # the file the gateway read its config from
            config = config.model_copy(update={"source": source})
        async with running_gateway(store, config) as h:
            await h.say("look around")
            await h.idle()
        results = tool_results(llm.requests[-1])
    assert len(results) == len(commands)
    return dict(zip(commands, results, strict=True))


@needs_bwrap
async def test_with_the_defaults_a_command_reads_none_of_the_gateways_secrets(store, tmp_path, secrets) -> None:
    results = await _run_each(store, tmp_path, secrets)
    leaked = {what: [m for m in MARKERS if m in out] for what, out in results.items()}
    assert {what: found for what, found in leaked.items() if found} == {}
    assert "[exit code" in results["env"]


@needs_bwrap
async def test_a_config_in_a_directory_the_sandbox_shows_is_masked(store, tmp_path) -> None:
    """A config kept where commands see the system (say /etc/gateway/): it and its .env are
    blanked inside the sandbox; the rest of that directory stays readable."""
    etc = tmp_path / "etc-gateway"
    etc.mkdir()
    (etc / "config.yml").write_text("llm:\n  api_key: config-marker-c3d2\n")
    (etc / ".env").write_text("LLM_API_KEY=dotenv-marker-0b7f\n")
    (etc / "README").write_text("readable\n")
    commands = {"read": f"cat {etc}/config.yml {etc}/.env {etc}/README"}
    results = await _run_each(store, tmp_path, commands, source=str(etc / "config.yml"), shell_ro_paths=[str(etc)])
    assert "readable" in results["read"]
    assert "config-marker" not in results["read"] and "dotenv-marker" not in results["read"]


@needs_bwrap
async def test_the_sandboxed_command_still_works_in_its_session_directory(store, tmp_path) -> None:
    results = await _run_each(
        store, tmp_path, {"work": "echo made > out.txt && cat out.txt && pwd && echo $HOME && ls /usr/bin/env"}
    )
    out = results["work"]
    assert out.startswith("made\n"), out
    cwd = out.splitlines()[1]
    assert cwd.startswith(str((tmp_path / "ws").resolve())) and out.splitlines()[2] == cwd
    assert (tmp_path / "ws").resolve().joinpath(cwd).joinpath("out.txt").read_text() == "made\n"


async def test_without_a_sandbox_the_command_still_gets_no_secret_from_its_environment(
    store, tmp_path, secrets
) -> None:
    results = await _run_each(store, tmp_path, {"env": "env"}, shell_sandbox="none")
    assert TOKEN not in results["env"] and CREDENTIAL not in results["env"]
    assert "PATH=" in results["env"]


def test_a_machine_without_bubblewrap_is_told_loudly_and_gets_no_shell(monkeypatch, tmp_path, caplog) -> None:
    """Fail closed (tests/security/test_security_no_sandbox.py runs it as a process)."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    status = sandbox_status("auto")
    assert not status.offered and "bwrap is not installed" in status.problem
    with caplog.at_level(logging.WARNING):
        status.log()
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "not offered" in line and "apt-get install bubblewrap" in line and "agent.shell_sandbox: none" in line


@needs_bwrap
async def test_a_sandboxed_command_reaches_no_network_unless_configured(tmp_path) -> None:
    from aiohttp import web
    from tooling import call, make_ctx

    server = web.Application()
    server.router.add_get("/", lambda _request: web.Response(text="reached"))
    runner = web.AppRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    probe = f"python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/').read())\" 2>&1"
    try:
        closed = await call(make_ctx(tmp_path), "shell", command=probe)
        assert "reached" not in closed.text and "refused" in closed.text.lower()
        opened = await call(make_ctx(tmp_path, shell_network=True), "shell", command=probe)
        assert "reached" in opened.text
    finally:
        await runner.cleanup()
