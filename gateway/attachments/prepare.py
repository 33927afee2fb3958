"""Attachments of an inbox item: downloaded after the item is committed, before its turn.

Each attachment is settled once (saved, too large, or failed after retries with backoff) and its
`Outcome` is written onto the inbox item at once, so a restart resumes with the attachments that
are left instead of losing or repeating any. The raw file is stored under the workspace before
anything that can fail (reading an image, a PDF's text, a transcription) looks at it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gateway.attachments.content import Kind, Outcome, image_record, model_text, user_notice
from gateway.attachments.documents import PdfLimits, pdf_text
from gateway.attachments.images import ImageUnreadable, read_image
from gateway.attachments.sniff import decode_text, extension_for, is_text, sniff
from gateway.config import AttachmentsConfig
from gateway.events import Attachment, ChannelError, Fetched, FetchFile, FileTooLarge, ThreadKey
from gateway.files.workspace import SESSIONS, entry_kind, open_dirs, read_regular, relative_parts, write_fresh
from gateway.llm.errors import without_urls

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Heard:
    """A transcript, who made it, the audio's length (None: unknown) and its cost (None: unpriced)."""

    text: str
    model: str
    seconds: float | None
    cost_nano_usd: int | None


class TranscriptionRefused(Exception):
    """Not transcribed, and trying again would not help (a spend cap is reached): `str()` says why."""


Transcribe = Callable[[bytes, str, str, float | None], Awaitable[Heard]]  # (audio, name, mime, seconds)
SavePayload = Callable[[int, dict[str, Any]], Awaitable[None]]  # (inbox item id, payload)
Notify = Callable[[ThreadKey, str, str, str], Awaitable[Any]]  # (thread, text, key, reply_to)
TRANSCRIBE_ATTEMPTS = 2
# Reads of one file started and never finished (the gateway stopped while a parser ran): past
# this, the file is recorded as unreadable instead of being parsed again after every restart.
READ_ATTEMPTS = 2
_LABELS = {
    "photo": "photo",
    "voice": "voice note",
    "audio": "audio file",
    "video": "video",
    "video_note": "video note",
    "document": "document",
    "file": "file",
}
_UNSAFE = re.compile(r"[^\w.\- ()+,@=]+")


@dataclass(frozen=True)
class Prepared:
    payload: dict[str, Any]  # the item's payload with `content` (the model's text) and `images`
    outcomes: list[Outcome]


def attachment_of(data: dict[str, Any]) -> Attachment:
    known = Attachment.__dataclass_fields__
    return Attachment(**{k: v for k, v in data.items() if k in known})


def has_unsettled(payload: dict[str, Any]) -> bool:
    return any("outcome" not in a for a in payload.get("attachments") or ())


class AttachmentPreparer:
    def __init__(
        self,
        config: AttachmentsConfig,
        workspace: Path,
        fetchers: Mapping[str, FetchFile],
        *,
        save_payload: SavePayload,
        notify: Notify,
        transcribe: Transcribe | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ):
        self.config = config
        self.workspace = workspace
        self.fetchers = fetchers
        self.save_payload = save_payload
        self.notify = notify
        self.transcribe = transcribe
        self.sleep = sleep
        self._running: dict[int, asyncio.Task[Prepared]] = {}

    async def prepare(self, item_id: int, payload: dict[str, Any], thread: ThreadKey, session_id: int) -> Prepared:
        """Settle every attachment of the item (those settled before a restart are kept) and
        compose the text the model reads. Concurrent calls for one item share the work."""
        running = self._running.get(item_id)
        if running is None:
            running = asyncio.ensure_future(self._prepare(item_id, payload, thread, session_id))
            self._running[item_id] = running
            running.add_done_callback(lambda _t: self._running.pop(item_id, None))
        return await asyncio.shield(running)

    async def _prepare(self, item_id: int, payload: dict[str, Any], thread: ThreadKey, session_id: int) -> Prepared:
        payload = {**payload, "attachments": [dict(a) for a in payload.get("attachments") or ()]}
        outcomes: list[Outcome] = []
        for index, entry in enumerate(payload["attachments"]):
            if "outcome" not in entry:
                entry["outcome"] = (await self._settle(item_id, payload, index, thread, session_id)).to_json()
                await self.save_payload(item_id, payload)  # settled: a restart will not fetch it again
            outcome = Outcome.from_json(entry["outcome"])
            outcomes.append(outcome)
            notice = user_notice(outcome, max_bytes=self.config.max_bytes)
            if notice:
                await self._tell(thread, notice, f"attachment:{item_id}:{index}", str(payload.get("message_id", "")))
        payload["content"] = model_text(str(payload.get("text", "")), outcomes, max_bytes=self.config.max_bytes)
        # Image records are read back by the context builder, which knows the workspace only.
        own = f"{SESSIONS}/{session_id}/"
        payload["images"] = [
            {**image_record(o), "path": own + o.path} for o in outcomes if o.shown_as_image
        ]
        await self.save_payload(item_id, payload)
        return Prepared(payload, outcomes)

    async def _tell(self, thread: ThreadKey, text: str, key: str, reply_to: str) -> None:
        try:
            await self.notify(thread, text, key, reply_to)
        except ChannelError as exc:  # the model is told anyway; the turn goes on
            log.warning("%s: could not tell the user about an attachment: %s", thread, exc)

    # ---- one attachment ------------------------------------------------------------------
    async def _settle(
        self, item_id: int, payload: dict[str, Any], index: int, thread: ThreadKey, session_id: int
    ) -> Outcome:
        entry = payload["attachments"][index]
        attachment = attachment_of(entry)
        label = _LABELS.get(attachment.kind, "file")
        base = Outcome(
            "failed",
            "file",
            label,
            attachment.name,
            mime=attachment.mime,
            size=attachment.size,
            width=attachment.width,
            height=attachment.height,
            duration=attachment.duration,
        )
        if attachment.size > self.config.max_bytes:
            return _with(base, status="too_large")
        fetch = self.fetchers.get(thread.channel)
        if fetch is None:
            return _with(base, error=f"the {thread.channel} channel cannot download files")
        fetched, failure = await self._download(fetch, attachment, item_id, payload, index)
        if fetched is None:
            return failure
        data = fetched.data
        if fetched.name and not attachment.name:  # known only once the platform was asked
            attachment = replace(attachment, name=fetched.name, mime=attachment.mime or fetched.mime)
            base = _with(base, name=attachment.name)
        try:
            path = await asyncio.to_thread(self._store_file, data, attachment, label, session_id, item_id, index)
        except OSError as exc:  # a link planted in the way, a full disk: a note, never a crashed worker
            log.warning("%s: could not store %s: %s", thread, attachment.name or attachment.file_id, exc)
            return _with(base, error=f"it could not be stored ({exc.strerror or exc})")
        saved = _with(
            base,
            status="saved",
            path=path,
            size=len(data),
            attempts=int(entry.get("attempts", 0)) + 1,
        )
        if _parsed(sniff(data, attachment.name)):
            reads = int(entry.get("reads", 0))
            if reads >= READ_ATTEMPTS:
                reason = f"reading it was cut short {reads} times (the gateway stopped); not tried again"
                return unreadable(saved, reason)
            entry["reads"] = reads + 1
            await self.save_payload(item_id, payload)  # a read that never ends (kill -9 mid-parse) is counted
        return await self._read_safely(saved, data, attachment)

    async def _read_safely(self, saved: Outcome, data: bytes, attachment: Attachment) -> Outcome:
        """`_read`, where any failure of any parser becomes a note and a notice, never a crash
        that leaves the item pending (to be parsed again, and fail again, after every restart)."""
        try:
            return await self._read(saved, data, attachment)
        except ImageUnreadable as exc:
            return unreadable(saved, str(exc))
        except Exception as exc:  # noqa: BLE001 - a parser's bug is the file's problem, not the worker's
            log.warning("reading %s failed", saved.path, exc_info=True)
            return unreadable(saved, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)

    async def _download(
        self, fetch: FetchFile, attachment: Attachment, item_id: int, payload: dict[str, Any], index: int
    ) -> tuple[Fetched | None, Outcome]:
        entry = payload["attachments"][index]
        label = _LABELS.get(attachment.kind, "file")
        failed = Outcome("failed", "file", label, attachment.name, mime=attachment.mime, size=attachment.size)
        error = ""
        while int(entry.get("attempts", 0)) < self.config.download_attempts:
            try:
                async with asyncio.timeout(self.config.download_timeout_s):
                    fetched = await fetch(attachment, self.config.max_bytes)
            except FileTooLarge as exc:
                return None, _with(
                    failed,
                    status="too_large",
                    size=exc.size or attachment.size,
                    attempts=int(entry.get("attempts", 0)) + 1,
                )
            except ChannelError as exc:
                if exc.permanent:
                    return None, _with(failed, error=str(exc), attempts=int(entry.get("attempts", 0)) + 1)
                error = str(exc)
            except (TimeoutError, OSError) as exc:
                error = f"{type(exc).__name__}: {exc}" if str(exc) else "the download timed out"
            else:
                if len(fetched.data) > self.config.max_bytes:
                    return None, _with(failed, status="too_large", size=len(fetched.data))
                return fetched, failed
            entry["attempts"] = int(entry.get("attempts", 0)) + 1
            entry["last_error"] = error
            await self.save_payload(item_id, payload)  # a restart continues the count
            if entry["attempts"] < self.config.download_attempts:
                delay = self.config.download_backoff_s * 2 ** (entry["attempts"] - 1)
                log.warning(
                    "download of %s failed (%s); retrying in %.1fs", attachment.name or attachment.file_id, error, delay
                )
                await self.sleep(delay)
        return None, _with(failed, error=error or "the download failed", attempts=int(entry.get("attempts", 0)))

    def _store_file(
        self, data: bytes, attachment: Attachment, label: str, session_id: int, item_id: int, index: int
    ) -> str:
        """<session dir>/<dir>/<session>/<name> (the layout from before per-session directories,
        within the session's: old and new paths alike), relative to the session's directory; the same bytes again
        (a download repeated after a restart) reuse the file, another file of the same name (or
        anything that is not a plain file: a planted link) gets a suffix. Every component is
        opened without following links and the file is written fresh (gateway/files/workspace.py)."""
        parts = [SESSIONS, str(session_id), *relative_parts(self.config.dir), str(session_id)]
        name = (
            safe_name(attachment.name) or f"{label.replace(' ', '-')}-{item_id}-{index + 1}{extension_for(sniff(data))}"
        )
        stem, dot, suffix = name.rpartition(".") if "." in name[1:] else (name, "", "")
        folder = open_dirs(self.workspace, parts)
        try:
            candidate, n = name, 1
            while (kind := entry_kind(folder, candidate)) != "missing":
                if kind == "file" and read_regular(folder, candidate) == data:
                    break
                n += 1
                candidate = f"{stem}-{n}{dot}{suffix}"
            else:
                write_fresh(folder, candidate, data)
        finally:
            os.close(folder)
        return "/".join([*parts[2:], candidate])

    async def _read(self, saved: Outcome, data: bytes, attachment: Attachment) -> Outcome:
        mime = sniff(data, attachment.name)
        kind = _kind(mime, attachment)
        if kind == "audio" and mime.startswith("video/"):
            mime = "audio/" + mime.split("/", 1)[1]  # webm/mp4 containers sent as audio
        saved = _with(saved, mime=mime, kind=kind)
        claimed = _claimed(attachment)
        if claimed and kind == "file":  # a zip called report.pdf: say so instead of guessing
            return unreadable(saved, f"it is called {claimed} but its content is {mime}")
        if kind == "image":
            info = await asyncio.to_thread(read_image, data, self.config.max_image_pixels)
            return _with(saved, width=info.width, height=info.height)
        limit = self.config.max_inline_chars
        if kind == "text":
            text = decode_text(data)
            return _with(saved, text=text[:limit], text_complete=len(text) <= limit)
        if kind == "pdf":
            return self._pdf(saved, await pdf_text(data, limit, self._pdf_limits()))
        if kind == "audio":
            return await self._transcribed(saved, data)
        return _with(saved, note="not shown inline; use a tool to open it")

    def _pdf_limits(self) -> PdfLimits:
        c = self.config
        return PdfLimits(c.pdf_max_pages, c.pdf_cpu_s, c.pdf_memory_mb, c.pdf_timeout_s)

    def _pdf(self, saved: Outcome, found: Any) -> Outcome:
        if found.error:
            return unreadable(_with(saved, pages=found.pages), found.error)
        if not found.text:
            return _with(saved, pages=found.pages, note="no text could be extracted (a scan?); open it with a tool")
        text = found.text
        if found.pages_read < found.pages:
            text += (
                f"\n\n[only the first {found.pages_read} of {found.pages} pages were read "
                f"(attachments.pdf_max_pages); the whole file is {saved.path}]"
            )
        return _with(saved, pages=found.pages, text=text, text_complete=found.complete)

    async def _transcribed(self, saved: Outcome, data: bytes) -> Outcome:
        if self.transcribe is None:
            note = "not transcribed: no transcription model is configured"
            return _with(saved, note=note, error="no speech-to-text is set up here")
        error = ""
        for attempt in range(TRANSCRIBE_ATTEMPTS):
            try:
                heard = await self.transcribe(data, Path(saved.path).name, saved.mime, saved.duration or None)
            except TranscriptionRefused as exc:
                return _with(saved, note=f"not transcribed: {exc}", error=str(exc))
            except Exception as exc:  # noqa: BLE001 - any failure becomes a note; the file is kept
                error = str(exc) or type(exc).__name__
                log.warning("transcription of %s failed: %s", saved.path, error)
                if attempt + 1 < TRANSCRIBE_ATTEMPTS:
                    await self.sleep(self.config.download_backoff_s)
                continue
            spent = _with(
                saved,
                transcribed_by=heard.model,
                heard_seconds=heard.seconds or 0.0,
                cost_nano_usd=heard.cost_nano_usd,
            )
            text = heard.text.strip()
            return _with(spent, text=text) if text else _with(spent, note="the transcription came back empty")
        note = f"the transcription failed ({without_urls(error)}); the audio is kept"  # the model may repeat it
        return _with(saved, note=note, error="the transcription failed")


def safe_name(name: str) -> str:
    """A file name that stays inside its folder: no separators, no leading dots, not too long."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    cleaned = _UNSAFE.sub("_", base).strip(" .")
    if len(cleaned) > 120:
        stem, dot, suffix = cleaned.rpartition(".")
        cleaned = (stem[: 120 - len(suffix) - 1] + dot + suffix) if dot and len(suffix) <= 10 else cleaned[:120]
    return cleaned


def unreadable(saved: Outcome, reason: str) -> Outcome:
    """Saved, but no parser could read it: the model gets the note, the person a notice
    (`content.user_notice`), and the file is never shown as an image."""
    kind: Kind = "file" if saved.kind == "image" else saved.kind
    return _with(saved, kind=kind, note=f"that file could not be read: {reason}", error=reason)


def _parsed(mime: str) -> bool:
    """Files a parser of ours opens (Pillow, pypdf): their reads are counted."""
    return mime.startswith("image/") or mime == "application/pdf"


def _claimed(attachment: Attachment) -> str:
    """What the sender says the file is, when it is a type we parse: "a PDF", "an image"."""
    name, mime = attachment.name.lower(), attachment.mime.lower()
    if name.endswith(".pdf") or mime == "application/pdf":
        return "a PDF"
    if attachment.kind == "photo" or mime.startswith("image/"):
        return "an image"
    if name.endswith((".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff")):
        return "an image"
    return ""


def _kind(mime: str, attachment: Attachment) -> Kind:
    claimed_audio = attachment.kind in ("voice", "audio") or attachment.mime.startswith("audio/")
    if mime.startswith("image/"):
        return "image"
    if mime == "application/pdf":
        return "pdf"
    if is_text(mime):
        return "text"
    if mime.startswith("audio/") or (claimed_audio and mime in ("video/webm", "video/mp4")):
        return "audio"
    if mime.startswith("video/"):
        return "video"
    return "file"


def _with(outcome: Outcome, **changes: Any) -> Outcome:
    return replace(outcome, **changes)
