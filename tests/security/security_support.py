"""What the attack tests of who may run what share."""

from __future__ import annotations

from pathlib import Path


def written(tmp_path: Path, name: str) -> bool:
    """Whether a file of that name was written anywhere in the workspace (each session writes in
    its own directory under it)."""
    return any((tmp_path / "ws").rglob(name))
