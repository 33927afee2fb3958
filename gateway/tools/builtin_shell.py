"""The shell built-in: one command in the session's directory, in its own process group.

The group is killed when the command finishes, times out or the call is cancelled, so a
shell call never leaves processes behind (a `/stop` really stops the work). Output keeps
its end (where errors and summaries are) and says how much of the start was cut.

What the command can reach (its environment, the sandbox) is decided in `sandbox.py`: it
starts in the session's directory, with an allowlisted environment, in bubblewrap by default.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import os
import shutil
from collections import deque
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from gateway.config import AgentConfig
from gateway.tools.paths import workspace_root
from gateway.tools.process_tree import kill_group, kill_tree
from gateway.tools.registry import ToolContext, ToolError, ToolSpec, build_spec
from gateway.tools.sandbox import SandboxStatus, command_environment, config_files, sandbox_prefix, sandbox_status

__all__ = ["SandboxStatus", "TailText", "run_command", "sandbox_status", "shell", "shell_specs"]

_READ_CHUNK = 65_536
REAP_WAIT_S = 5.0
log = logging.getLogger(__name__)


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
    """Run a shell command (bash) in this session's directory; stdout and stderr come back with the exit code.

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
    cwd = workspace_root(ctx.workspace)
    agent = await _with_skills(ctx)
    prefix = sandbox_prefix(agent, cwd, hidden=config_files(getattr(ctx.services.get("config"), "source", "")))
    code = await run_command(command, cwd, timeout, output, prefix=prefix, env=command_environment(agent, cwd))
    body = output.text() or "(no output)"
    if code is None:
        raise ToolError(f"timed out after {timeout:g}s; the command and its child processes were killed.\n{body}")
    return f"{body.rstrip(chr(10))}\n[exit code {code}]"


async def _with_skills(ctx: ToolContext) -> AgentConfig:
    """The agent's settings with the folders of the skills this person is offered bound
    read-only into the sandbox (their scripts run from there); a skill that changed since it
    was approved, or that the role does not list, is not bound."""
    skills = ctx.services.get("skills")
    if skills is None:
        return ctx.agent
    allowed = skills.allowed(ctx.person, f"{ctx.thread.channel}:{ctx.thread.chat}")
    folders = [state.path for state in await skills.offered(allowed)]
    if not folders:
        return ctx.agent
    return ctx.agent.model_copy(update={"shell_ro_paths": [*ctx.agent.shell_ro_paths, *folders]})


async def run_command(
    command: str,
    cwd: os.PathLike[str] | str,
    timeout: float,
    output: TailText,
    *,
    prefix: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> int | None:
    """Run `command` (after the sandbox's `prefix`), feeding `output`; the exit code, or None
    on timeout. Cancel kills it. The sandbox itself gets `env` too: inside its PID namespace it
    is the command's parent and process 1, whose environ a command could read."""
    proc = await _started(
        asyncio.create_subprocess_exec(
            *prefix,
            shutil.which("bash") or "/bin/sh",
            "-c",
            command,
            cwd=cwd,
            env=dict(env) if env is not None else {"PATH": os.environ.get("PATH", os.defpath)},
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
        _end(proc)
        await _reaped(proc)
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
            _end(proc)
            await _reaped(proc)
        raise


async def _drain(stream: asyncio.StreamReader | None, output: TailText) -> None:
    if stream is None:
        return
    while chunk := await stream.read(_READ_CHUNK):
        output.feed(chunk)


def _end(proc: asyncio.subprocess.Process) -> None:
    """Kill what the command left: all it started while it still runs (a sandbox's init in a
    session of its own too), else its group (background jobs of a command that exited)."""
    if proc.returncode is None:
        kill_tree(proc.pid)
    else:
        kill_group(proc.pid)


async def _reaped(proc: asyncio.subprocess.Process) -> None:
    """Wait for the end of the process and its output pipe; a descendant that escaped the kill
    (a daemon of its own, reparented away) and holds the pipe is not waited for beyond a bound."""
    try:
        await asyncio.wait_for(proc.wait(), REAP_WAIT_S)
    except TimeoutError:
        log.warning("shell: pid %s ended but something it started still holds its output open", proc.pid)


def shell_specs() -> list[ToolSpec]:
    return [build_spec(shell, side_effects=True, classes={"exec"}, lod="tail")]
