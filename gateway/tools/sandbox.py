"""What a shell command can reach: its environment and, where the machine can, a sandbox.

The environment is built from an allowlist (PATH, LANG, LC_*, TZ, TERM, and the names in
`agent.shell_env`), never a secret's name, with HOME the session's directory. With
`agent.shell_sandbox: auto` (the default) the command runs in bubblewrap: a new PID namespace
(the gateway's /proc/<pid>/environ is not there), no network unless `agent.shell_network`, the
system directories read-only (minus /etc's secrets), a private /tmp and only the session's
directory (and `agent.shared_dir`) bound; the gateway's config, `.env`, database and home are
simply not in its file system. Where the configured sandbox is missing or cannot make
namespaces, the default fails closed: the tools that run commands are not offered to the model
(a call it makes anyway is answered why), and the start log and `gateway doctor` say how to
install bubblewrap or opt in to unconfined commands with `none`. `unshare` is no fallback of
`auto`: it hides the gateway's processes and the network but not its files (`.env`, database).
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config import SECRETS, AgentConfig
from gateway.files.workspace import sessions_root, shared_root
from gateway.tools.registry import ToolError, ToolRegistry

log = logging.getLogger(__name__)

SAFE_ENV = ("PATH", "LANG", "LANGUAGE", "LC_*", "TZ", "TERM")
# Names a command never sees, even when `agent.shell_env` lists them.
HIDDEN_ENV = ("*_TOKEN", "*_SECRET", "*_SECRET_*", "*_KEY", "*PASSWORD*", "*_DSN", "GATEWAY_*", "DATABASE_URL")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers")
MASKED_DIRS = ("/etc/ssh", "/etc/ssl/private", "/etc/sudoers.d")
_PACKAGES = {"bwrap": "bubblewrap", "unshare": "util-linux"}


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return _globs(tuple(patterns)).match(name) is not None


@functools.lru_cache(maxsize=32)
def _globs(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """The globs as one compiled expression (a command's environment is filtered at every start)."""
    return re.compile("|".join(fnmatch.translate(p) for p in patterns) or "(?!)")


def command_environment(agent: AgentConfig, home: Path) -> dict[str, str]:
    """The environment of a command: the allowlist only, HOME its session's directory."""
    hidden = set(SECRETS.values())
    allowed = (*SAFE_ENV, *agent.shell_env)
    env = {
        name: value
        for name, value in os.environ.items()
        if _matches(name, allowed) and name not in hidden and not _matches(name.upper(), HIDDEN_ENV)
    }
    env.setdefault("PATH", os.defpath)
    env["HOME"] = str(home)
    return env


@dataclass(frozen=True)
class SandboxStatus:
    configured: str  # agent.shell_sandbox
    mode: str  # what commands run in: bwrap | unshare | none
    tool: str = ""  # the sandbox's executable
    problem: str = ""  # why the configured sandbox is not available

    @property
    def offered(self) -> bool:
        """Whether tools that run commands are offered: their sandbox works here, or the
        operator chose `none`. Never unconfined by default."""
        return not self.problem

    @property
    def fix(self) -> str:
        package = _PACKAGES.get(self.mode, "bubblewrap")
        how = (
            f"let {self.mode} create namespaces here (a container must allow user namespaces)"
            if self.tool
            else f"install {package} (apt-get install {package})"
        )
        return f"{how}, or set agent.shell_sandbox: none to run commands unconfined (docs/security.md)"

    def withheld(self) -> str:
        """One line: what is missing, that the shell is not offered, and the fix."""
        configured = f"agent.shell_sandbox: {self.configured}"
        return f"{self.problem} ({configured}); the shell is not offered to the model: {self.fix}"

    def log(self) -> None:
        if self.problem:
            log.warning("shell sandbox: %s", self.withheld())
        elif self.mode == "bwrap":
            log.info(
                "shell sandbox: bubblewrap (%s): commands see the system read-only and only their session's "
                "directory; no network unless agent.shell_network; set agent.shell_sandbox: none for unconfined",
                self.tool,
            )
        elif self.configured == "none":
            log.warning(
                "shell sandbox: none (agent.shell_sandbox: none): shell commands run UNCONFINED as the gateway's "
                "user and can read its config, .env, database and home (docs/security.md)"
            )
        else:
            log.warning(
                "shell sandbox: unshare: commands have their own processes (and no network) but read the "
                "gateway's files; bubblewrap confines them to their session's directory"
            )


class WithheldCommands:
    """The tools that run commands, withheld while their sandbox is not available: a call the
    model makes anyway is answered why (a registry source, like an MCP server that is down)."""

    def __init__(self, names: Sequence[str], status: SandboxStatus) -> None:
        self.names, self.status = frozenset(names), status

    async def first_listing(self) -> None:
        return None

    def absent(self, name: str) -> str | None:
        if name not in self.names:
            return None
        status = self.status
        return f"Tool {name!r} is not offered here and did not run: {status.problem}; the operator can {status.fix}."


def withhold_unconfined(registry: ToolRegistry, agent: AgentConfig) -> None:
    """Take the tools that run commands (`@exec`) out of the registry when their sandbox is not
    available here: fail closed, unless the operator chose `shell_sandbox: none`."""
    commands = [spec.name for spec in registry.specs() if "exec" in spec.classes]
    if not commands:
        return
    status = sandbox_status(agent.shell_sandbox)
    if status.offered:
        return
    for name in commands:
        registry.unregister(name)
    registry.add_source(WithheldCommands(commands, status))


def doctor_checks(agent: AgentConfig) -> list[tuple[str, str, str, str]]:
    """(name, ok | warn, found, fix) of the shell's sandbox for `gateway doctor`."""
    if not _shell_enabled(agent):
        return []
    return [("shell sandbox", *described(sandbox_status(agent.shell_sandbox)))]


def sandbox_state(agent: AgentConfig) -> dict[str, Any]:
    """The shell's sandbox as the console shows it: the setting, what commands run in, whether
    the tools that run commands are offered, and in words what a command reaches (with the fix
    when it could be safer). The first look at bubblewrap runs it once: call it off the loop."""
    status = sandbox_status(agent.shell_sandbox)
    level, found, fix = described(status)
    return {
        "configured": status.configured, "mode": status.mode, "tool": status.tool, "problem": status.problem,
        "offered": status.offered, "shell_enabled": _shell_enabled(agent), "level": level, "found": found,
        "fix": fix,
    }


def described(status: SandboxStatus) -> tuple[str, str, str]:
    """(ok | warn, what a command reaches, the fix) of a sandbox status."""
    if status.problem:
        return "warn", f"{status.problem}; the shell is not offered to the model", status.fix
    if status.mode == "bwrap":
        return "ok", f"bubblewrap ({status.tool}): commands see only their session's files", ""
    better = "install bubblewrap (apt-get install bubblewrap) and set agent.shell_sandbox: auto"
    if status.mode == "unshare":
        return "warn", "unshare: commands read the gateway's files (.env, database)", better
    return "warn", "none: commands run unconfined and can read the gateway's secrets", better


def _shell_enabled(agent: AgentConfig) -> bool:
    return any(fnmatch.fnmatchcase("shell", pattern) for pattern in agent.tools)


@functools.cache
def _bwrap_problem(tool: str) -> str:
    """Why bubblewrap cannot sandbox here ('' when it can): a container may forbid namespaces."""
    try:
        done = subprocess.run(
            [tool, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
            capture_output=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not be run ({exc})"
    if done.returncode != 0:
        error = done.stderr.decode(errors="replace").strip().splitlines()
        return f"bwrap cannot create namespaces here ({error[-1] if error else f'exit {done.returncode}'})"
    return ""


def sandbox_status(configured: str) -> SandboxStatus:
    """The sandbox commands get here; found on PATH (`bwrap`, or `unshare` when configured)."""
    if configured == "none":
        return SandboxStatus("none", "none")
    name = "unshare" if configured == "unshare" else "bwrap"
    tool = shutil.which(name)
    problem = "" if tool else f"{name} is not installed"
    if tool and name == "bwrap":
        problem = _bwrap_problem(tool)
    return SandboxStatus(configured, name, tool or "", problem)


def config_files(source: str) -> list[Path]:
    """The gateway's config file and the `.env` beside it (masked where a bound directory holds them)."""
    path = Path(source)
    return [path, path.parent / ".env"] if source and path.is_file() else []


def sandbox_prefix(agent: AgentConfig, session: Path, *, hidden: Sequence[Path] = ()) -> list[str]:
    """The command line that confines a command, or a ToolError when the sandbox is missing
    (nothing runs unconfined unless `none` was chosen)."""
    status = sandbox_status(agent.shell_sandbox)
    if status.problem:
        raise ToolError(f"agent.shell_sandbox is {agent.shell_sandbox!r} but {status.problem}: {status.fix}")
    if status.mode == "none":
        return []
    if status.mode == "unshare":
        user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        net = [] if agent.shell_network else ["--net"]
        return [status.tool, *user, *net, "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--"]
    return bwrap_args(status.tool, agent, session, hidden)


def bwrap_args(tool: str, agent: AgentConfig, session: Path, hidden: Sequence[Path] = ()) -> list[str]:
    args = [tool, "--die-with-parent", "--new-session", "--unshare-all"]
    if agent.shell_network:
        args.append("--share-net")
    args += _system_view()
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    extra, bound = _extra_binds(agent)
    args += extra
    for path in (p.resolve() for p in hidden if p.is_file()):  # the config and .env, should /etc hold them
        if any(path.is_relative_to(b) for b in bound) and not path.is_relative_to(session):
            args += ["--ro-bind", "/dev/null", str(path)]
    ws = str(session)
    return [*args, "--bind", ws, ws, "--chdir", ws, "--"]


def _system_view() -> list[str]:
    """The system directories read-only, /etc's secrets masked."""
    args: list[str] = []
    for name in SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            args += ["--ro-bind", name, name]
    args += [a for name in MASKED_FILES if Path(name).is_file() for a in ("--ro-bind", "/dev/null", name)]
    args += [a for name in MASKED_DIRS if Path(name).is_dir() for a in ("--tmpfs", name)]
    return args


def _extra_binds(agent: AgentConfig) -> tuple[list[str], list[Path]]:
    """`shell_ro_paths` and the shared directory (never showing the sessions' directories), and
    every directory the command sees."""
    args: list[str] = []
    bound = [Path(name) for name in SYSTEM_DIRS]
    for extra in agent.shell_ro_paths:
        path = Path(extra).expanduser().resolve()
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
            bound.append(path)
    shared = shared_root(agent.shared_dir)
    if shared is not None and shared.is_dir():
        args += ["--bind" if agent.shared_writable else "--ro-bind", str(shared), str(shared)]
        bound.append(shared)
        sessions = sessions_root(agent.workspace)
        if sessions.is_relative_to(shared):
            args += ["--tmpfs", str(sessions)]
    return args, bound
