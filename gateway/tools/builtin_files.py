"""File built-ins confined to the session's directory (and the shared one): read_file, write_file, list_dir.

Blocking file work runs in a thread so a large file never stalls other threads' turns.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from gateway.attachments.content import human_size
from gateway.attachments.images import image_info
from gateway.attachments.sniff import is_text, looks_like_text, sniff
from gateway.files.private_files import make_dirs
from gateway.tools.paths import SECRETS_DIR, confine_ctx, relative_display
from gateway.tools.registry import ToolContext, ToolError, ToolSpec, build_spec

MAX_LINES = 2_000
MAX_READ_CHARS = 100_000
MAX_WRITE_CHARS = 5_000_000
MAX_ENTRIES = 500
_SNIFF_BYTES = 8_192
MAX_IMAGE_BYTES = 50_000_000  # images larger than this are described without their dimensions


async def read_file(ctx: ToolContext, path: str, offset: int = 0, limit: int = 500) -> str:
    """Read a text file in the workspace, a window of lines at a time.

    Args:
        path: file path relative to the workspace
        offset: number of lines to skip from the start of the file
        limit: maximum number of lines to return (at most 2000)
    """
    if offset < 0:
        raise ToolError("offset must be 0 or more")
    if not 1 <= limit <= MAX_LINES:
        raise ToolError(f"limit must be between 1 and {MAX_LINES}")
    root, target = confine_ctx(ctx, path)
    shown = relative_display(root, target)
    if target.is_dir():
        raise ToolError(f"{shown} is a directory; use list_dir to see what it holds")
    if not target.is_file():
        raise ToolError(f"no such file: {shown}")
    return await asyncio.to_thread(_read_window, target, shown, offset, limit)


def _read_window(target: Path, shown: str, offset: int, limit: int) -> str:
    with target.open("rb") as handle:
        head = handle.read(_SNIFF_BYTES)
    mime = sniff(head, target.name)
    if mime.startswith("image/"):
        return _image_text(target, shown, mime)
    if b"\0" in head or not (is_text(mime) or looks_like_text(head)):
        return f"{shown} is a binary file ({mime}, {target.stat().st_size} bytes); not shown"
    lines: list[str] = []
    chars = 0
    total = 0
    cut_by_chars = False
    with target.open("r", encoding="utf-8", errors="replace", newline="") as handle:
        for total, line in enumerate(handle, start=1):
            if total <= offset or len(lines) >= limit or cut_by_chars:
                continue
            if chars + len(line) > MAX_READ_CHARS and lines:
                cut_by_chars = True
                continue
            lines.append(line)
            chars += len(line)
    return _window_text(shown, lines, offset, total)


def _image_text(target: Path, shown: str, mime: str) -> str:
    size = target.stat().st_size
    info = image_info(target.read_bytes()) if size <= MAX_IMAGE_BYTES else None
    dimensions = f"{info.width}x{info.height}, " if info else ""
    return f"{shown} is an image ({mime}, {dimensions}{human_size(size)}); it cannot be shown as text"


def _window_text(shown: str, lines: list[str], offset: int, total: int) -> str:
    if total == 0:
        return f"({shown} is empty)"
    if not lines:
        return f"(offset {offset} is past the end of {shown}, which has {total} lines)"
    text = "".join(lines)
    last = offset + len(lines)
    if offset == 0 and last == total:
        return text
    more = f"; call again with offset={last} for more" if last < total else ""
    return f"{text.rstrip(chr(10))}\n[lines {offset + 1}-{last} of {total}{more}]"


async def write_file(ctx: ToolContext, path: str, content: str) -> str:
    """Create or replace a text file in the workspace (parent directories are created).

    Args:
        path: file path relative to the workspace
        content: the complete new content of the file
    """
    if len(content) > MAX_WRITE_CHARS:
        raise ToolError(f"content is {len(content)} chars; the limit is {MAX_WRITE_CHARS}")
    root, target = confine_ctx(ctx, path, write=True)
    shown = relative_display(root, target)
    if target == root or target.is_dir():
        raise ToolError(f"{shown} is a directory; give a file path")
    size = await asyncio.to_thread(_write_atomically, target, content)
    return f"Wrote {size} bytes to {shown}."


def _write_atomically(target: Path, content: str) -> int:
    """Write beside the target and rename, so a crash never leaves half a file (0600: mkstemp's)."""
    data = content.encode("utf-8")
    make_dirs(target.parent)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return len(data)


async def list_dir(ctx: ToolContext, path: str = ".") -> str:
    """List a directory in the workspace: sub-directories end with /, files show their size.

    Args:
        path: directory path relative to the workspace
    """
    root, target = confine_ctx(ctx, path)
    shown = relative_display(root, target)
    if not target.exists():
        raise ToolError(f"no such directory: {shown}")
    if not target.is_dir():
        raise ToolError(f"{shown} is a file; use read_file to read it")
    return await asyncio.to_thread(_listing, target, shown)


def _listing(target: Path, shown: str) -> str:
    entries = sorted(
        (entry for entry in target.iterdir() if entry.name.casefold() != SECRETS_DIR),
        key=lambda entry: (not entry.is_dir(), entry.name),
    )
    if not entries:
        return f"({shown} is empty)"
    lines = [_entry_line(entry) for entry in entries[:MAX_ENTRIES]]
    if len(entries) > MAX_ENTRIES:
        lines.append(f"[{len(entries) - MAX_ENTRIES} more entries not shown]")
    return "\n".join(lines)


def _entry_line(entry: Path) -> str:
    if entry.is_symlink():
        return f"{entry.name}@"
    if entry.is_dir():
        return f"{entry.name}/"
    try:
        return f"{entry.name}  ({entry.stat().st_size} bytes)"
    except OSError:
        return entry.name


def file_specs() -> list[ToolSpec]:
    return [
        build_spec(read_file, classes={"fs_read"}, lod="head"),
        build_spec(write_file, side_effects=True, classes={"fs_write"}, lod="head"),
        build_spec(list_dir, classes={"fs_read"}, lod="head"),
    ]
