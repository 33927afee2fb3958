"""Workspace confinement: every path a tool touches is canonical and inside the workspace.

Canonical means `..` and symlinks resolved, so a link inside the workspace that points out of
it (or into a `secrets/` directory) is refused like the plain path would be.
"""

from __future__ import annotations

from pathlib import Path

from gateway.tools.registry import ToolError

SECRETS_DIR = "secrets"


def workspace_root(workspace: Path) -> Path:
    """The canonical workspace directory, created on first use."""
    root = Path(workspace).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
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


def confine(workspace: Path, raw: str) -> tuple[Path, Path]:
    """(root, canonical path) or a ToolError telling the model why the path is refused."""
    if not isinstance(raw, str) or not raw.strip():
        raise ToolError("path must be a non-empty string (relative to the workspace)")
    if "\0" in raw:
        raise ToolError("path must not contain NUL characters")
    root = workspace_root(workspace)
    path = canonical(root, raw)
    if not path.is_relative_to(root):
        raise ToolError(f"refused: {raw!r} is outside the workspace; use a path inside it")
    if touches_secrets(root, path):
        raise ToolError(f"refused: {raw!r} is inside a {SECRETS_DIR}/ directory, which tools may not touch")
    return root, path
