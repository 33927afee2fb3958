"""send_file: a workspace file to the current chat or thread (scheduled runs: to `deliver_to`).

The send goes through the outbox under a key made of the session and the tool call id, so a
call that is run again (after a restart, say) finds its delivery recorded and never sends twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

from gateway.attachments import sniff
from gateway.attachments.content import human_size
from gateway.events import Outbound, OutboundFile, ThreadKey
from gateway.tools.paths import confine_ctx, relative_display, touches_secrets
from gateway.tools.registry import ToolContext, ToolError, ToolSpec, build_spec

MAX_SEND_BYTES = 50 * 1024 * 1024  # Telegram's upload limit for bots; Slack allows more
MAX_PHOTO_BYTES = 10 * 1024 * 1024  # Telegram sendPhoto
PHOTO_MIMES = ("image/jpeg", "image/png", "image/webp", "image/gif")
FileTarget = Callable[[ToolContext], Awaitable[ThreadKey | None]]  # where a session's files go


async def send_file(ctx: ToolContext, path: str, caption: str = "") -> str:
    """Send a file from the workspace to the person in this chat (images are shown as photos).

    Args:
        path: file path relative to the workspace
        caption: a short text shown with the file
    """
    root, target = confine_ctx(ctx, path)
    shown = relative_display(root, target)
    if touches_secrets(root, target):
        raise ToolError(f"{shown} is inside secrets/; it is never sent")
    if not target.is_file():
        raise ToolError(f"no such file: {shown}" if not target.exists() else f"{shown} is not a file")
    size = target.stat().st_size
    if size == 0:
        raise ToolError(f"{shown} is empty; there is nothing to send")
    if size > MAX_SEND_BYTES:
        raise ToolError(f"{shown} is {human_size(size)}; files over {human_size(MAX_SEND_BYTES)} cannot be sent")
    thread = await _destination(ctx)
    if thread is None:
        raise ToolError("this session has no chat to send files to (a scheduled job without deliver_to)")
    head = await asyncio.to_thread(_head, target)
    mime = sniff(head, target.name)
    kind: Literal["photo", "document"] = "photo" if mime in PHOTO_MIMES and size <= MAX_PHOTO_BYTES else "document"
    outbox = ctx.services["outbox"]
    file = OutboundFile(str(target), target.name, mime, kind, caption.strip())
    key = f"file:{ctx.session_id}:{ctx.call_id or shown}"
    await outbox.send(Outbound(thread, "", key, file=file))
    return f"Sent {shown} ({mime}, {human_size(size)}) as a {kind}."


async def _destination(ctx: ToolContext) -> ThreadKey | None:
    target: FileTarget | None = ctx.services.get("file_target")
    if target is not None:
        return await target(ctx)
    return ctx.thread


def _head(path: Path) -> bytes:
    with path.open("rb") as handle:
        return handle.read(8192)


def send_specs() -> list[ToolSpec]:
    return [build_spec(send_file, side_effects=True, lod="head")]
