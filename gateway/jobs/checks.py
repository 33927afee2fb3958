"""The probes of a job's check (scheduler/checks.py decides what they found means):

- `command`: run like the shell tool runs one, in its sandbox (bubblewrap by default, failing
  closed where it is missing), with the shell's allowlisted environment, in the job's own
  directory `<agent.workspace>/jobs/<name>/` (kept between firings: its scripts and state go
  there), no network unless the check says `network: true`, killed with its children at the
  check's timeout, its output cut at `max_output`;
- `url`: a GET under web_fetch's rules (every address public unless
  `agent.http_fetch_allow_private`, redirects only to the same host or `agent.http_allow_hosts`),
  sending the last answer's ETag / Last-Modified so a 304 costs nothing; an HTML page becomes
  its readable text;
- `mcp`: a call of a read-only tool (`readOnlyHint`) of a trusted server, nothing asked answered.

Every failure raises with one line saying what went wrong.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.config import AgentConfig
from gateway.files.private_files import make_dirs
from gateway.files.workspace import base_dir
from gateway.store.schedules import ScheduleState
from gateway.tools.builtin_http import decode, guarded_get
from gateway.tools.builtin_shell import TailText, run_command
from gateway.tools.readable import is_html, readable
from gateway.tools.registry import ToolError
from gateway.tools.sandbox import command_environment, config_files, sandbox_prefix

if TYPE_CHECKING:
    from gateway.mcp.manager import McpManager

JOBS_DIR = "jobs"


@dataclass(frozen=True)
class Probed:
    output: str
    exit_code: int | None = None
    not_modified: bool = False
    etag: str = ""
    last_modified: str = ""
    cut: bool = False


class HeadText(TailText):
    """Keeps the first `limit` bytes of a stream (a check's output is read from its start) and
    counts what was dropped; `text()` is what was kept, with no note (the note would change the
    output's hash with every length)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._raw = bytearray()

    def feed(self, data: bytes, final: bool = False) -> None:
        room = self.limit - len(self._raw)
        self._raw += data[: max(0, room)]
        self.cut += max(0, len(data) - max(0, room))

    def text(self) -> str:
        return bytes(self._raw).decode("utf-8", errors="replace")


def job_dir(agent: AgentConfig, job: str) -> Path:
    """Where a job's command check runs: `<agent.workspace>/jobs/<name>/` (made 0700)."""
    path = base_dir(agent.workspace) / JOBS_DIR / job
    make_dirs(path)
    return path


class JobChecks:
    """Runs checks for the scheduler (its `Prober`)."""

    def __init__(self, agent: AgentConfig, *, mcp: McpManager | None = None, config_source: str = "") -> None:
        self.agent = agent
        self.mcp = mcp
        self.config_source = config_source

    async def probe(self, job: str, spec: dict[str, Any], state: ScheduleState) -> Probed:
        timeout = float(spec.get("timeout_s") or 30)
        cap = int(spec.get("max_output") or 16384)
        if "command" in spec:
            return await self.command(job, str(spec["command"]), timeout, cap, bool(spec.get("network")))
        if "url" in spec:
            conditional = spec.get("wake_when", "changed") == "changed" and state.output_hash is not None
            return await self.url(str(spec["url"]), timeout, cap, state if conditional else None)
        if "mcp" in spec:
            return await self.tool(job, dict(spec["mcp"]), timeout, cap)
        raise ToolError("the check has no command, url or mcp")

    async def command(self, job: str, command: str, timeout: float, cap: int, network: bool) -> Probed:
        agent = self.agent.model_copy(update={"shell_network": network})
        cwd = job_dir(agent, job)
        prefix = sandbox_prefix(agent, cwd, hidden=config_files(self.config_source))
        output = HeadText(cap)
        code = await run_command(command, cwd, timeout, output, prefix=prefix, env=command_environment(agent, cwd))
        if code is None:
            raise ToolError(f"the command timed out after {timeout:g}s (check.timeout) and was killed")
        return Probed(output.text(), exit_code=code, cut=output.cut > 0)

    async def url(self, url: str, timeout: float, cap: int, last: ScheduleState | None) -> Probed:
        headers = {}
        if last is not None and last.etag:
            headers["If-None-Match"] = last.etag
        if last is not None and last.last_modified:
            headers["If-Modified-Since"] = last.last_modified
        try:
            page = await guarded_get(
                url, cap=cap, timeout_s=timeout, allow_private=self.agent.http_fetch_allow_private,
                allow_hosts=self.agent.http_allow_hosts, headers=headers,
            )
        except TimeoutError:
            raise ToolError(f"GET {url} timed out after {timeout:g}s (check.timeout)") from None
        if page.status == 304 and headers:
            return Probed("", not_modified=True, etag=page.etag or (last.etag if last else "") or "",
                          last_modified=page.last_modified or (last.last_modified if last else "") or "")
        if page.status >= 400 or page.status == 304:
            raise ToolError(f"GET {url} answered HTTP {page.status} {page.reason}".rstrip())
        if is_html(page.content_type, page.body):
            html = decode(page.body, page.charset) if page.charset else page.body
            text = (await readable(html, str(page.url))).text
        else:
            text = decode(page.body, page.charset)
        return Probed(text, etag=page.etag, last_modified=page.last_modified, cut=page.truncated)

    async def tool(self, job: str, mcp: dict[str, Any], timeout: float, cap: int) -> Probed:
        if self.mcp is None:
            raise ToolError("MCP servers are not running in this process (gateway serve runs mcp checks)")
        server, tool = str(mcp.get("server")), str(mcp.get("tool"))
        arguments = dict(mcp.get("arguments") or {})
        try:
            async with asyncio.timeout(timeout):
                text = await self.mcp.call_read_only(server, tool, arguments, workspace=job_dir(self.agent, job))
        except TimeoutError:
            raise ToolError(f"MCP tool {tool!r} of {server!r} gave no answer in {timeout:g}s (check.timeout)") from None
        raw = text.encode("utf-8", errors="replace")
        return Probed(raw[:cap].decode("utf-8", errors="ignore"), cut=len(raw) > cap)

