"""Where a session's files live, and how the gateway writes there without following links.

Each session has its own directory, `<agent.workspace>/sessions/<id>/` (a sub-agent uses its
root session's): its file tools are confined to it, its shell is started (and, sandboxed, bound)
in it, its attachments and MCP binary results are stored in it. Nothing of one session is
reachable from another's tools; `agent.shared_dir` is the one place they share.

Tools (the shell above all) can plant links in a session directory, so the gateway's own writes
walk each path component from a directory descriptor with `O_NOFOLLOW` and create files with
`O_EXCL` under a fresh name before renaming them into place: a link is replaced, never followed.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from gateway.files.private_files import PRIVATE_DIR, PRIVATE_FILE, close_to_others, make_dirs

log = logging.getLogger(__name__)

SESSIONS = "sessions"
CHECKLISTS = "checklists"  # ticks' checklists (gateway/files/checklists.py), outside every session's directory
JOBS = "jobs"  # the directories jobs' command checks run in (gateway/jobs/checks.py)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def base_dir(workspace: Path | str) -> Path:
    return Path(workspace).expanduser().resolve()


def sessions_root(workspace: Path | str) -> Path:
    return base_dir(workspace) / SESSIONS


def session_dir(workspace: Path | str, session_id: int) -> Path:
    """The directory of one session's files (not created here)."""
    return sessions_root(workspace) / str(int(session_id))


def private_workspace(workspace: Path | str) -> None:
    """The workspace and `sessions/` exist and are 0700: no other account of the machine reaches
    a session's files. A `sessions/` an earlier version made 0755 is closed (said once)."""
    root = sessions_root(workspace)
    make_dirs(root)
    if close_to_others(root):
        log.warning("closed %s to other users of this machine (they could list and read the sessions' files)", root)


def shared_root(shared_dir: str) -> Path | None:
    return Path(shared_dir).expanduser().resolve() if shared_dir.strip() else None


def relative_parts(path: str) -> list[str]:
    """A configured sub-directory (`attachments.dir`) as safe components: no root, no `..`."""
    return [p for p in PurePosixPath(path.replace("\\", "/")).parts if p not in ("/", ".", "..")]


# ---- writing without following links --------------------------------------------------------
class LinkInTheWay(OSError):
    """A component of a path the gateway writes to is a link or not a directory."""


def open_dirs(root: Path, parts: Sequence[str], *, mode: int = PRIVATE_DIR) -> int:
    """A descriptor of `root/parts…`, each component created when missing and refused when it is
    a link or not a directory. `root` itself is the operator's (the configured workspace)."""
    make_dirs(root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in parts:
            if part in ("", ".", "..") or "/" in part:
                raise ValueError(f"not a path component: {part!r}")
            try:
                os.mkdir(part, mode, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:  # ELOOP: a link; ENOTDIR: a file
                raise LinkInTheWay(exc.errno, f"{part} is a link or not a directory", part) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def entry_kind(dir_fd: int, name: str) -> str:
    """ "missing", "file" (a regular file) or "other" (a link, a directory, …), never followed."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return "missing"
    return "file" if stat.S_ISREG(mode) else "other"


def read_regular(dir_fd: int, name: str) -> bytes | None:
    """The bytes of a regular file in the directory; None when it is missing or anything else."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        return handle.read()


def write_fresh(dir_fd: int, name: str, data: bytes, *, mode: int = PRIVATE_FILE) -> None:
    """`name` in the directory becomes a new regular file holding `data`: written under a
    temporary name created with O_EXCL|O_NOFOLLOW, then renamed over whatever was there (a
    link planted at `name` is replaced, its target untouched). A crash leaves no half file."""
    temp = f".{name[:60]}.{secrets.token_hex(6)}.tmp"
    fd = os.open(
        temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=dir_fd
    )
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


# ---- deployments from before per-session directories ----------------------------------------
def adopt_legacy_layout(workspace: Path | str, attachments_dir: str, shared: Path | None = None) -> None:
    """Move `<workspace>/<attachments.dir>/<id>/` (the old shared layout) into session `<id>`'s
    directory at the same relative path, so `attachments/<id>/<name>` named in that session's
    history still opens there, and only there. Anything else left at the top of the workspace is
    no longer reachable by tools: the start log says so and what to do."""
    base = base_dir(workspace)
    parts = relative_parts(attachments_dir)
    old = base.joinpath(*parts) if parts else None
    moved = 0
    if old is not None and old.is_dir() and not old.is_symlink():
        for entry in sorted(old.iterdir()):
            if not entry.name.isdigit() or entry.is_symlink() or not entry.is_dir():
                continue
            target = session_dir(base, int(entry.name)).joinpath(*parts, entry.name)
            if target.exists():
                continue
            make_dirs(target.parent)
            try:
                entry.rename(target)
                moved += 1
            except OSError as exc:
                log.warning("could not move %s to %s: %s", entry, target, exc)
        if moved:
            log.warning(
                "moved the attachments of %d session(s) from %s/<session>/ into each session's own directory "
                "(%s/<session>/%s/<session>/): sessions no longer see each other's files",
                moved,
                old,
                sessions_root(base),
                "/".join(parts),
            )
        if not any(old.iterdir()):
            old.rmdir()
    kept = {SESSIONS, CHECKLISTS, JOBS} | (
        {shared.relative_to(base).parts[0]} if shared and shared.is_relative_to(base) and shared != base else set()
    )
    left = sorted(e.name for e in base.iterdir() if e.name not in kept) if base.is_dir() else []
    if left:
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        log.warning(
            "the workspace %s holds files from before per-session directories (%s): tools now see only their "
            "session's directory (%s/<session>/) and agent.shared_dir; move what the agent should read into a "
            "directory and set agent.shared_dir to it",
            base,
            shown,
            sessions_root(base),
        )
