"""The shell built-in: one command in the workspace, in its own process group.

The group is killed when the command finishes, times out or the call is cancelled, so a
shell call never leaves processes behind (a `/stop` really stops the work). Output keeps
its end (where errors and summaries are) and says how much of the start was cut.

What the command can reach: it starts in the workspace, but by default it is an ordinary
process of the gateway's user (every file that user can read or write, the network). Its
environment is scrubbed: no `*_TOKEN`, `*_SECRET`, `*_KEY`, `*PASSWORD*`, `GATEWAY_*` or
database URLs. `agent.shell_sandbox` confines it further where the machine can:
`unshare` (util-linux) gives it no network and its own process tree; `bwrap`
(bubblewrap) in addition a read-only view of the system with only the workspace writable.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import fnmatch
import os
import shutil
import signal
from collections import deque
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from gateway.config import SECRETS
from gateway.tools.paths import workspace_root
from gateway.tools.registry import ToolContext, ToolError, ToolSpec, build_spec

_READ_CHUNK = 65_536


class TailText:
    """Keeps the last `limit` characters of a byte stream and counts what it dropped."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: deque[str] = deque()
        self._kept = 0
        self.cut = 0

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self._decoder.decode(data, final)
        if text:
            self._parts.append(text)
            self._kept += len(text)
        while self._kept > self.limit:
            excess = self._kept - self.limit
            head = self._parts[0]
            if len(head) <= excess:
                self._parts.popleft()
                self._kept -= len(head)
                self.cut += len(head)
            else:
                self._parts[0] = head[excess:]
                self._kept -= excess
                self.cut += excess

    def text(self) -> str:
        kept = "".join(self._parts)
        if self.cut:
            return f"[... {self.cut} earlier chars of output cut ...]\n{kept}"
        return kept


async def shell(ctx: ToolContext, command: str, timeout_s: float | None = None) -> str:
    """Run a shell command (bash) in the workspace; stdout and stderr are returned together with the exit code.

    Args:
        command: the command line to run
        timeout_s: seconds before the command is killed (default and maximum: the configured shell timeout)
    """
    if not command.strip():
        raise ToolError("command is empty")
    limit = ctx.agent.shell_timeout_s
    timeout = limit if timeout_s is None else min(float(timeout_s), limit)
    if timeout <= 0:
        raise ToolError("timeout_s must be positive")
    output = TailText(ctx.agent.shell_output_chars)
    code = await run_command(command, workspace_root(ctx.workspace), timeout, output, sandbox=ctx.agent.shell_sandbox)
    body = output.text() or "(no output)"
    if code is None:
        raise ToolError(f"timed out after {timeout:g}s; the command and its child processes were killed.\n{body}")
    return f"{body.rstrip(chr(10))}\n[exit code {code}]"


async def run_command(
    command: str, cwd: os.PathLike[str] | str, timeout: float, output: TailText, *, sandbox: str = "none"
) -> int | None:
    """Run `command`, feeding `output`; the exit code, or None on timeout. Cancel kills it."""
    proc = await _started(
        asyncio.create_subprocess_exec(
            *sandbox_prefix(sandbox, Path(cwd)),
            shutil.which("bash") or "/bin/sh",
            "-c",
            command,
            cwd=cwd,
            env=_clean_environment(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group, so the whole tree can be killed
        )
    )
    try:
        async with asyncio.timeout(timeout):
            await _drain(proc.stdout, output)
            return await proc.wait()
    except TimeoutError:
        return None
    finally:
        _kill_group(proc.pid)
        await proc.wait()
        output.feed(b"", final=True)


async def _started(start: Coroutine[Any, Any, asyncio.subprocess.Process]) -> asyncio.subprocess.Process:
    """The process, once started. A cancel during the start (forked, pipes not yet connected) is
    held until it is done and then kills the whole group: asyncio itself would kill only the
    shell and wait for the pipe its children keep open."""
    starting = asyncio.ensure_future(start)
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            proc = await starting
            _kill_group(proc.pid)
            await proc.wait()
        raise


async def _drain(stream: asyncio.StreamReader | None, output: TailText) -> None:
    if stream is None:
        return
    while chunk := await stream.read(_READ_CHUNK):
        output.feed(chunk)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


# Names of variables the command never sees (the gateway's secrets, and anyone else's).
HIDDEN_ENV = ("*_TOKEN", "*_SECRET", "*_SECRET_*", "*_KEY", "*PASSWORD*", "*_DSN", "GATEWAY_*", "DATABASE_URL")


def _clean_environment() -> dict[str, str]:
    hidden = set(SECRETS.values())
    return {
        name: value
        for name, value in os.environ.items()
        if name not in hidden and not any(fnmatch.fnmatchcase(name.upper(), p) for p in HIDDEN_ENV)
    }


def sandbox_prefix(sandbox: str, workspace: Path) -> list[str]:
    """The command line that confines the shell, or a clear error when the tool is missing."""
    if sandbox == "none":
        return []
    tool = shutil.which(sandbox)
    if tool is None:
        package = "bubblewrap" if sandbox == "bwrap" else "util-linux"
        raise ToolError(f"agent.shell_sandbox is {sandbox!r} but {sandbox} is not installed (install {package})")
    if sandbox == "unshare":
        user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        return [tool, *user, "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--"]
    ws = str(workspace)
    return [
        tool, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
        "--bind", ws, ws, "--chdir", ws, "--unshare-all", "--die-with-parent", "--new-session", "--",
    ]


def shell_specs() -> list[ToolSpec]:
    return [build_spec(shell, side_effects=True, classes={"exec"}, lod="tail")]
