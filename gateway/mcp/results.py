"""An MCP tool result as the model sees it.

Text content is the tool result; an embedded text resource is inlined under a line naming
its uri; a resource link names the uri and how to read it (`mcp_read_resource`); images,
audio and other binary content are saved to the workspace and referenced by path, and
images are also returned as image records (path, mime, size) so that with `llm.vision` they
reach the model like the images people send. A result with only structured content is its
JSON text.
"""

from __future__ import annotations

import hashlib
import json
import mimetypes
import os
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gateway.attachments.images import image_info
from gateway.attachments.sniff import IMAGE_MIMES_FOR_MODELS
from gateway.files.workspace import entry_kind, open_dirs, read_regular, write_fresh
from gateway.mcp.sdk import CallResult, Content

READ_TOOL = "mcp_read_resource"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EXTENSIONS = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/gif": ".gif",
    "image/webp": ".webp",
    "audio/wav": ".wav",
    "audio/mpeg": ".mp3",
}


@dataclass
class Rendered:
    text: str
    images: list[dict[str, Any]] = field(default_factory=list)  # records as user rows keep them


def render(result: CallResult, *, server: str, workspace: Path) -> str:
    """The result's text for the model (`render_result` has its images too)."""
    return render_result(result, server=server, workspace=workspace).text


def render_result(result: CallResult, *, server: str, workspace: Path) -> Rendered:
    rendered = render_contents(result.content, server=server, workspace=workspace)
    if not rendered.text and result.structured is not None:
        rendered.text = structured_text(result.structured)
    rendered.text = rendered.text or "(no output)"
    return rendered


def render_contents(contents: tuple[Content, ...], *, server: str, workspace: Path) -> Rendered:
    rendered = Rendered("")
    parts = [_part(item, server, workspace, rendered.images) for item in contents]
    rendered.text = "\n".join(part for part in parts if part)
    return rendered


def structured_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1, default=str)


def _part(item: Content, server: str, workspace: Path, images: list[dict[str, Any]]) -> str:
    if item.kind == "text":
        return item.text
    if item.kind == "resource":
        mime = f" ({item.mime})" if item.mime else ""
        return f"[resource {item.uri}{mime}]\n{item.text}"
    if item.kind == "link":
        title = f" {item.title}:" if item.title else ""
        mime = f" ({item.mime})" if item.mime else ""
        return (
            f"[resource link{title} {item.uri}{mime}; read it with {READ_TOOL}"
            f"(server={json.dumps(server)}, uri={json.dumps(item.uri)})]"
        )
    if item.mime == "image/png":
        item = replace(item, data=mended_png(item.data))
    what = item.mime or item.kind
    try:
        relative = save(item, server, workspace)
    except OSError as exc:  # a link planted in the way, a full disk: the model is told
        return f"[{what} ({len(item.data)} bytes) not saved: {exc.strerror or exc}]"
    if item.kind == "image" and item.mime in IMAGE_MIMES_FOR_MODELS:
        info = image_info(item.data)
        if info is not None:
            images.append({"path": relative, "mime": item.mime, "width": info.width, "height": info.height})
    source = f" from {item.uri}" if item.uri else ""
    return f"[{what}{source} saved to the workspace: {relative} ({len(item.data)} bytes)]"


def mended_png(data: bytes) -> bytes:
    """The PNG without its ancillary chunks whose checksum is wrong (the reference server's own
    logo has such an iCCP chunk): viewers skip them, Pillow refuses the whole image. Critical
    chunks are kept as they are; anything that is not a PNG is returned unchanged."""
    if not data.startswith(PNG_SIGNATURE):
        return data
    out, at = [PNG_SIGNATURE], len(PNG_SIGNATURE)
    while at + 12 <= len(data):
        length = int.from_bytes(data[at : at + 4], "big")
        chunk = data[at : at + 12 + length]
        kind, body, crc = chunk[4:8], chunk[8:-4], chunk[-4:]
        if len(chunk) < 12 + length:
            return data  # cut short: leave it to the reader
        ancillary = bool(kind[0] & 0x20)
        if not ancillary or zlib.crc32(kind + body).to_bytes(4, "big") == crc:
            out.append(chunk)
        at += 12 + length
    return b"".join(out) if at == len(data) else data  # trailing bytes: not a PNG we can read


def save(item: Content, server: str, workspace: Path) -> str:
    """Write binary content under `mcp/<server>/` by its hash (the same bytes, one file). The
    session's tools can plant links there: no component is followed, and anything but a plain
    file of these bytes at the name is replaced by a fresh one (gateway/files/workspace.py)."""
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
