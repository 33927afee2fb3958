"""Workspace confinement: every path a tool touches is canonical and inside the session's
directory (`ctx.workspace`, see gateway/files/workspace.py) or the configured shared directory.

Canonical means `..` and symlinks resolved, so a link inside the workspace that points out of
it (into another session's directory, or into a `secrets/` directory) is refused like the plain
path would be. The shared directory is read-only unless `agent.shared_writable`, and never
reaches into the sessions' directories even when it holds them.
"""

from __future__ import annotations

from pathlib import Path

from gateway.files.private_files import make_dirs
from gateway.files.workspace import SESSIONS, shared_root
from gateway.tools.registry import ToolContext, ToolError

SECRETS_DIR = "secrets"


def workspace_root(workspace: Path) -> Path:
    """The canonical workspace directory, created on first use."""
    root = Path(workspace).expanduser().resolve()
    make_dirs(root)
    return root


def canonical(root: Path, raw: str) -> Path:
    """`raw` (relative to `root`, or absolute) with `..` and symlinks resolved."""
    try:
        return (root / raw).resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise ToolError(f"cannot resolve path {raw!r}: {exc}") from None


def relative_display(root: Path, path: Path) -> str:
    """How a canonical path is shown and matched: relative to the root, else absolute."""
    if path == root:
        return "."
    if path.is_relative_to(root):
        return path.relative_to(root).as_posix()
    return path.as_posix()


def touches_secrets(root: Path, path: Path) -> bool:
    if not path.is_relative_to(root):
        return False
    return any(part.casefold() == SECRETS_DIR for part in path.relative_to(root).parts)


def confine(workspace: Path, raw: str, *, shared: Path | None = None, write: bool = False) -> tuple[Path, Path]:
    """(root, canonical path) or a ToolError telling the model why the path is refused. A path in
    `shared` is allowed too (shown absolute, as it is outside the root); `write` refuses it."""
    if not isinstance(raw, str) or not raw.strip():
        raise ToolError("path must be a non-empty string (relative to the workspace)")
    if "\0" in raw:
        raise ToolError("path must not contain NUL characters")
    root = workspace_root(workspace)
    path = canonical(root, raw)
    base = root
    if not path.is_relative_to(root) and shared is not None and in_shared(shared, path, root):
        if write:
            raise ToolError(f"refused: {raw!r} is in the shared directory, which is read-only")
        base = shared
    elif not path.is_relative_to(root):
        raise ToolError(f"refused: {raw!r} is outside the workspace (this session's directory); use a path inside it")
    if touches_secrets(base, path):
        raise ToolError(f"refused: {raw!r} is inside a {SECRETS_DIR}/ directory, which tools may not touch")
    return root, path


def in_shared(shared: Path, path: Path, session: Path) -> bool:
    """Inside the shared directory but not in the sessions' directories (should it hold them)."""
    sessions = session.parent if session.parent.name == SESSIONS else session
    return path.is_relative_to(shared) and not path.is_relative_to(sessions)


def shared_of(ctx: ToolContext) -> Path | None:
    return shared_root(ctx.agent.shared_dir)


def confine_ctx(ctx: ToolContext, raw: str, *, write: bool = False) -> tuple[Path, Path]:
    """`confine` for a tool call: the session's directory, and the shared one (writable when
    `agent.shared_writable`)."""
    shared = shared_of(ctx)
    return confine(ctx.workspace, raw, shared=shared, write=write and not ctx.agent.shared_writable)
