"""The shell and web_fetch built-ins: real processes and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from pathlib import Path

import pytest
from aiohttp import web
from helpers import Site, serving, until
from tooling import call, make_ctx

from gateway.tools.builtin_http import is_public

# --- shell ---------------------------------------------------------------------------------


def alive(pid: int) -> bool:
    """A zombie counts as gone: it runs nothing and holds nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def wait_for(condition, what: str) -> None:
    # Process starts and deaths take seconds when the machine is loaded: a generous deadline.
    try:
        await until(condition, timeout=30)
    except TimeoutError:
        raise AssertionError(f"gave up waiting for {what}") from None


def read_pids(folder: Path, *names: str) -> list[int] | None:
    texts = [(folder / name).read_text().strip() if (folder / name).exists() else "" for name in names]
    return [int(t) for t in texts] if all(t.isdigit() for t in texts) else None


SPAWN = "sleep 60 & echo $! > child.pid; echo $$ > shell.pid; "


async def test_shell_runs_in_the_workspace_with_exit_code_and_stderr(tmp_path):
    ctx = make_ctx(tmp_path)
    outcome = await call(ctx, "shell", command="pwd; echo out; echo err >&2; exit 3")
    assert not outcome.failed
    assert outcome.text == f"{tmp_path.resolve()}\nout\nerr\n[exit code 3]"
    assert (await call(ctx, "shell", command="true")).text == "(no output)\n[exit code 0]"


async def test_shell_hides_gateway_secrets_from_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_API_KEY", "sk-very-secret")
    monkeypatch.setenv("SOME_SETTING", "visible")
    monkeypatch.setenv("OTHER_SETTING", "not listed")
    ctx = make_ctx(tmp_path, shell_env=["SOME_SETTING", "LLM_API_KEY"])  # a secret's name stays hidden when listed
    outcome = await call(ctx, "shell", command='echo "${LLM_API_KEY:-unset} $SOME_SETTING ${OTHER_SETTING:-unset}"')
    assert outcome.text.startswith("unset visible unset")


async def test_shell_environment_has_no_tokens_keys_secrets_or_database_urls(tmp_path, monkeypatch):
    hidden = {
        "GITHUB_TOKEN": "ghp_x", "AWS_SECRET_ACCESS_KEY": "aws", "STRIPE_SECRET": "sk", "OPENAI_API_KEY": "sk-o",
        "GATEWAY_DATABASE_URL": "postgresql://u:p@db/x", "PGPASSWORD": "pw", "DATABASE_URL": "postgres://x",
    }
    for name, value in hidden.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LANG_SETTING", "visible")
    outcome = await call(make_ctx(tmp_path, shell_env=["*"]), "shell", command="env")
    assert "LANG_SETTING=visible" in outcome.text
    assert not [name for name in hidden if f"{name}=" in outcome.text]


def _unshare_works() -> bool:
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--net", "--pid", "--fork", "--mount", "--mount-proc", "true"]
    if os.geteuid() != 0:
        probe[1:1] = ["--user", "--map-root-user"]
    return subprocess.run(probe, capture_output=True).returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="unshare (util-linux) with namespaces is not available here")
async def test_the_unshare_sandbox_has_no_network_and_its_own_processes(tmp_path):
    server = web.Application()
    server.router.add_get("/", lambda _request: web.Response(text="reached"))
    runner = web.AppRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        probe = f"python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/').read())\""
        assert "reached" in (await call(make_ctx(tmp_path, shell_sandbox="none"), "shell", command=probe)).text
        ctx = make_ctx(tmp_path, shell_sandbox="unshare")
        confined = await call(ctx, "shell", command=probe + " ; ls /proc | grep -c '^[0-9]'; pwd")
        assert "reached" not in confined.text and "unreachable" in confined.text.lower()
        lines = confined.text.splitlines()
        assert int(lines[-3]) < 10  # only its own few processes, not the machine's
        assert lines[-2] == str(tmp_path.resolve())
    finally:
        await runner.cleanup()


async def test_a_sandbox_that_is_not_installed_is_a_clear_tool_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    outcome = await call(make_ctx(tmp_path, shell_sandbox="bwrap"), "shell", command="true")
    assert outcome.failed and "bwrap is not installed" in outcome.text


async def test_shell_cancel_kills_the_whole_process_group(tmp_path):
    task = asyncio.create_task(call(make_ctx(tmp_path, shell_sandbox="none"), "shell", command=SPAWN + "wait"))
    await wait_for(lambda: read_pids(tmp_path, "child.pid", "shell.pid"), "the command to start")
    pids = read_pids(tmp_path, "child.pid", "shell.pid")
    assert all(alive(pid) for pid in pids)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_for(lambda: not any(alive(pid) for pid in pids), "the processes to die")


async def test_a_cancel_while_the_shell_is_still_starting_kills_its_children_too(tmp_path):
    # The cancel lands inside create_subprocess_exec (forked, pipes not connected yet): asyncio
    # then kills only the shell, so the gateway must kill the group itself.
    import time

    def children() -> set[str]:
        return set(Path(f"/proc/self/task/{os.getpid()}/children").read_text().split())

    before = children()  # a session's servers may be children of this process too
    task = asyncio.create_task(call(make_ctx(tmp_path, shell_sandbox="none"), "shell", command=SPAWN + "wait"))
    pids: list[int] | None = None
    try:
        for _ in range(100):  # step the loop until the shell is forked: its pipes take more steps to connect
            await asyncio.sleep(0)
            if children() - before:
                break
        deadline = time.monotonic() + 30
        while (pids := read_pids(tmp_path, "child.pid", "shell.pid")) is None:  # the loop held: no start ends
            assert time.monotonic() < deadline, "the command did not start"
            time.sleep(0.01)
        task.cancel()
        # asyncio alone kills the shell and then waits for the pipe its orphan keeps open: 60 s
        done, _ = await asyncio.wait({task}, timeout=15)
        assert task in done, "the cancel waited for the shell's orphaned children"
        with pytest.raises(asyncio.CancelledError):
            task.result()
        await wait_for(lambda: not any(alive(pid) for pid in pids), "the processes to die")
    finally:
        # Never leave a start pending for the loop's teardown: cancelling asyncio's own pipe
        # set-up there leaves the subprocess transport waiting forever.
        task.cancel()
        await asyncio.wait({task}, timeout=90)
        for pid in pids or read_pids(tmp_path, "child.pid", "shell.pid") or []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_a_cancel_ends_at_once_even_when_a_child_left_the_group_holding_the_output(tmp_path):
    # A process in a session of its own (as bubblewrap's sandbox init is, with --new-session) is
    # out of the group's reach and keeps the output pipe open: the cancel would wait for it.
    command = "setsid sleep 60 & echo $! > child.pid; echo $$ > shell.pid; wait"
    task = asyncio.create_task(call(make_ctx(tmp_path, shell_sandbox="none"), "shell", command=command))
    await wait_for(lambda: read_pids(tmp_path, "child.pid", "shell.pid"), "the command to start")
    pids = read_pids(tmp_path, "child.pid", "shell.pid")
    assert pids is not None and all(alive(pid) for pid in pids)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=15)
    assert task in done, "the cancel waited for the child that left the process group"
    await wait_for(lambda: not any(alive(pid) for pid in pids), "the processes to die")


def _host_pids_running(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace") and alive(int(entry.name)):
                    found.append(int(entry.name))
    return found


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
async def test_a_cancel_kills_everything_inside_the_bubblewrap_sandbox_too(tmp_path):
    marker = f"{os.getpid() % 1000 + 3000}.{len(str(tmp_path))}17"  # sleep's argument, found in /proc
    task = asyncio.create_task(
        call(make_ctx(tmp_path, shell_sandbox="bwrap"), "shell", command=f"sleep {marker} & sleep {marker}; wait")
    )
    await wait_for(lambda: len(_host_pids_running(f"sleep\0{marker}")) == 2, "the sandboxed commands to start")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_for(lambda: not _host_pids_running(f"sleep\0{marker}"), "the sandboxed processes to die")


async def test_shell_timeout_kills_and_reports_partial_output(tmp_path):
    ctx = make_ctx(tmp_path, shell_timeout_s=0.5, shell_sandbox="none")  # pids as the host sees them
    # asking for more than the configured maximum is capped to it
    outcome = await call(ctx, "shell", command=SPAWN + "echo started; sleep 60", timeout_s=1000)
    assert outcome.failed
    assert "timed out after 0.5s" in outcome.text and "started" in outcome.text
    pids = read_pids(tmp_path, "child.pid", "shell.pid")
    await wait_for(lambda: not any(alive(pid) for pid in pids), "the processes to die")


async def test_shell_output_keeps_the_end_and_says_how_much_was_cut(tmp_path):
    ctx = make_ctx(tmp_path, shell_output_chars=1000)
    outcome = await call(ctx, "shell", command="head -c 50000 /dev/zero | tr '\\0' a; echo; echo END")
    first, rest = outcome.text.split("\n", 1)
    assert first == "[... 49005 earlier chars of output cut ...]"
    assert rest.endswith("a\nEND\n[exit code 0]")
    assert len(rest) < 1100


async def test_shell_refuses_an_empty_command(tmp_path):
    outcome = await call(make_ctx(tmp_path), "shell", command="   ")
    assert outcome.failed and "empty" in outcome.text


# --- web_fetch -----------------------------------------------------------------------------


@pytest.fixture
async def site():
    state = Site()

    async def handle(request: web.Request) -> web.StreamResponse:
        state.hits.append(request.path)
        name = request.match_info["name"]
        if name == "text":
            return web.Response(text="hello world", content_type="text/plain")
        if name == "host":
            return web.Response(text=request.headers.get("Host", ""))
        if name == "big":
            return web.Response(text="x" * 10_000, content_type="text/plain")
        if name == "binary":
            return web.Response(body=b"\x00\x01\x02PNG", content_type="application/octet-stream")
        if name == "redirect":
            raise web.HTTPFound("/text")
        if name == "to-file":
            raise web.HTTPFound("file:///etc/passwd")
        if name == "loop":
            raise web.HTTPFound("/loop")
        if name == "slow":
            await state.release.wait()
            return web.Response(text="late")
        return web.Response(status=404, text="not here")

    app = web.Application()
    app.router.add_get("/{name}", handle)
    async with serving(app) as state.base:
        yield state
        state.release.set()


async def test_web_fetch_refuses_loopback_by_default(site, tmp_path):
    ctx = make_ctx(tmp_path)
    for url in (f"{site.base}/text", site.base.replace("127.0.0.1", "localhost") + "/text"):
        outcome = await call(ctx, "web_fetch", url=url)
        assert outcome.failed and "refused" in outcome.text and "http_fetch_allow_private" in outcome.text
    assert site.hits == []


async def test_web_fetch_allowed_on_loopback_when_configured(site, tmp_path):
    ctx = make_ctx(tmp_path, http_fetch_allow_private=True)
    outcome = await call(ctx, "web_fetch", url=f"{site.base}/text")
    assert not outcome.failed
    assert outcome.text.startswith("HTTP 200 OK\n")
    assert "Content-Type: text/plain" in outcome.text and outcome.text.endswith("\n\nhello world")
    host = await call(ctx, "web_fetch", url=f"{site.base}/host")
    assert host.text.endswith("\n\n" + site.base.removeprefix("http://"))


async def test_web_fetch_caps_the_body(site, tmp_path):
    ctx = make_ctx(tmp_path, http_fetch_allow_private=True, http_fetch_max_bytes=500)
    small = await call(ctx, "web_fetch", url=f"{site.base}/big", max_bytes=100)
    assert "\n\n" + "x" * 100 + "\n[truncated: only the first 100 bytes were read]" in small.text
    capped = await call(ctx, "web_fetch", url=f"{site.base}/big", max_bytes=1_000_000)
    assert "x" * 500 + "\n[truncated: only the first 500 bytes were read]" in capped.text
    assert "x" * 501 not in capped.text


async def test_web_fetch_follows_and_rechecks_redirects(site, tmp_path):
    ctx = make_ctx(tmp_path, http_fetch_allow_private=True)
    followed = await call(ctx, "web_fetch", url=f"{site.base}/redirect")
    assert f"URL: {site.base}/text" in followed.text and followed.text.endswith("hello world")
    to_file = await call(ctx, "web_fetch", url=f"{site.base}/to-file")
    assert to_file.failed and "only http:// and https://" in to_file.text
    looping = await call(ctx, "web_fetch", url=f"{site.base}/loop")
    assert looping.failed and "more than 5 redirects" in looping.text
    assert site.hits.count("/loop") == 6


async def test_web_fetch_times_out(site, tmp_path):
    ctx = make_ctx(tmp_path, http_fetch_allow_private=True, http_fetch_timeout_s=0.3)
    outcome = await call(ctx, "web_fetch", url=f"{site.base}/slow")
    assert outcome.failed and "timed out after 0.3s" in outcome.text


async def test_web_fetch_reports_status_binary_and_bad_urls(site, tmp_path):
    ctx = make_ctx(tmp_path, http_fetch_allow_private=True)
    missing = await call(ctx, "web_fetch", url=f"{site.base}/missing")
    assert not missing.failed and missing.text.startswith("HTTP 404 Not Found")
    binary = await call(ctx, "web_fetch", url=f"{site.base}/binary")
    assert "[binary content, 6 bytes, not shown]" in binary.text
    for url, expected in [
        ("ftp://example.com/file", "only http:// and https://"),
        ("file:///etc/passwd", "only http:// and https://"),
        ("not a url", "only http:// and https://"),
        ("http://nonexistent.invalid/", "cannot resolve host nonexistent.invalid"),
    ]:
        outcome = await call(ctx, "web_fetch", url=url)
        assert outcome.failed and expected in outcome.text, url


@pytest.mark.parametrize(
    "address, public",
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("fd00::1", False),
        ("fe80::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:8.8.8.8", True),
    ],
)
def test_address_classification(address, public):
    assert is_public(address) is public
