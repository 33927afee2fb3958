"""An MCP tool result as the model sees it: the text content as the tool result, images and
other binary content saved to the workspace and referenced by path."""

from __future__ import annotations

import hashlib
import mimetypes
import os
from pathlib import Path

from gateway.mcp.sdk import CallResult, Content
from gateway.workspace import entry_kind, open_dirs, read_regular, write_fresh

EXTENSIONS = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/gif": ".gif",
    "image/webp": ".webp",
    "audio/wav": ".wav",
    "audio/mpeg": ".mp3",
}


def render(result: CallResult, *, server: str, workspace: Path) -> str:
    parts = [_part(item, server, workspace) for item in result.content]
    text = "\n".join(part for part in parts if part)
    if not text and result.structured is not None:
        text = str(result.structured)
    return text or "(no output)"


def _part(item: Content, server: str, workspace: Path) -> str:
    if item.kind == "text":
        return item.text
    if item.kind == "link":
        return f"[resource: {item.text}]"
    what = item.mime or item.kind
    try:
        relative = save(item, server, workspace)
    except OSError as exc:  # a link planted in the way, a full disk: the model is told
        return f"[{what} ({len(item.data)} bytes) not saved: {exc.strerror or exc}]"
    return f"[{what} saved to the workspace: {relative} ({len(item.data)} bytes)]"


def save(item: Content, server: str, workspace: Path) -> str:
    """Write binary content under `mcp/<server>/` by its hash (the same bytes, one file). The
    session's tools can plant links there: no component is followed, and anything but a plain
    file of these bytes at the name is replaced by a fresh one (gateway/workspace.py)."""
    digest = hashlib.sha256(item.data).hexdigest()[:16]
    suffix = EXTENSIONS.get(item.mime) or mimetypes.guess_extension(item.mime or "") or ".bin"
    name = f"{digest}{suffix}"
    folder = open_dirs(workspace, ["mcp", server])
    try:
        if entry_kind(folder, name) != "file" or read_regular(folder, name) != item.data:
            write_fresh(folder, name, item.data)
    finally:
        os.close(folder)
    return f"mcp/{server}/{name}"
