"""An MCP tool result as the model sees it: the text content as the tool result, images and
other binary content saved to the workspace and referenced by path."""

from __future__ import annotations

import hashlib
import mimetypes
from pathlib import Path

from gateway.mcp.sdk import CallResult, Content

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
    relative = save(item, server, workspace)
    what = item.mime or item.kind
    return f"[{what} saved to the workspace: {relative} ({len(item.data)} bytes)]"


def save(item: Content, server: str, workspace: Path) -> str:
    """Write binary content under `mcp/<server>/` by its hash (the same bytes, one file)."""
    digest = hashlib.sha256(item.data).hexdigest()[:16]
    suffix = EXTENSIONS.get(item.mime) or mimetypes.guess_extension(item.mime or "") or ".bin"
    relative = Path("mcp") / server / f"{digest}{suffix}"
    target = workspace / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.write_bytes(item.data)
    return relative.as_posix()
