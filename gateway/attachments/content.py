"""What the model and the user are told about each attachment.

An `Outcome` is recorded on the inbox item once an attachment is settled (saved, too large,
failed); everything the model reads is derived from it, so a restart changes nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

Status = Literal["saved", "too_large", "failed"]
Kind = Literal["image", "text", "pdf", "audio", "video", "file"]


@dataclass(frozen=True)
class Outcome:
    status: Status
    kind: Kind  # what the content is (sniffed), not what the sender called it
    label: str  # how to speak of it: "photo", "voice note", "document", ...
    name: str
    path: str = ""  # relative to the workspace, when saved
    mime: str = ""
    size: int = 0
    width: int = 0
    height: int = 0
    duration: int = 0
    pages: int = 0
    text: str = ""  # inline text, a PDF's text or a transcript
    text_complete: bool = True
    note: str = ""  # why there is no text, e.g. "no transcription model is configured"
    error: str = ""  # why it failed; on a saved file, why no parser could read it
    attempts: int = 0
    # A transcription: the model that heard it, the audio's length and what it cost (nano-USD;
    # None: unpriced), counted on the run of the turn it joins (gateway/store, `_consume_in`).
    transcribed_by: str = ""
    heard_seconds: float = 0.0
    cost_nano_usd: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def shown_as_image(self) -> bool:
        return self.status == "saved" and self.kind == "image"


def human_size(size: int) -> str:
    """Decimal units, like the limits in the configuration (20000000 is "20.0 MB")."""
    if size < 1000:
        return f"{size} B"
    if size < 1_000_000:
        return f"{size / 1000:.0f} KB"
    return f"{size / 1_000_000:.1f} MB"


def duration_text(seconds: int) -> str:
    return f"{seconds // 60}:{seconds % 60:02d}"


def _details(outcome: Outcome) -> str:
    parts = [outcome.mime]
    if outcome.width and outcome.height:
        parts.append(f"{outcome.width}x{outcome.height}")
    if outcome.pages:
        parts.append(f"{outcome.pages} page{'s' if outcome.pages != 1 else ''}")
    if outcome.duration:
        parts.append(duration_text(outcome.duration))
    parts.append(human_size(outcome.size))
    return ", ".join(p for p in parts if p)


def note(outcome: Outcome, *, max_bytes: int = 0) -> str:
    """The one-line note the model always gets (and the only thing, for an image in an old turn)."""
    named = f' "{outcome.name}"' if outcome.name else ""
    if outcome.status == "too_large":
        limit = f", over the {human_size(max_bytes)} limit" if max_bytes else ""
        size = f" ({human_size(outcome.size)})" if outcome.size else ""
        return f"[{outcome.label}{named}{size} was not downloaded: too large{limit}]"
    if outcome.status == "failed":
        return f"[{outcome.label}{named} could not be downloaded: {outcome.error}]"
    return f"[{outcome.label}{named} saved at {outcome.path} ({_details(outcome)})]"


def model_block(outcome: Outcome, *, max_bytes: int = 0) -> str:
    """The note, and the text that goes with it: inline text, a PDF's text, a transcript."""
    head = note(outcome, max_bytes=max_bytes)
    if outcome.status != "saved":
        return head
    if outcome.text:
        cut = (
            ""
            if outcome.text_complete
            else f"\n[cut at {len(outcome.text):,} characters: the whole file is {outcome.path}]"
        )
        intro = {"audio": "Transcript", "video": "Transcript", "pdf": "Text of the PDF"}.get(outcome.kind, "Content")
        return f"{head}\n{intro}:\n<<<\n{outcome.text}\n>>>{cut}"
    if outcome.note:
        return f"{head}\n[{outcome.note}]"
    return head


def model_text(text: str, outcomes: list[Outcome], *, max_bytes: int = 0) -> str:
    """The user row's text: what the person wrote, then a block per attachment."""
    blocks = [model_block(o, max_bytes=max_bytes) for o in outcomes]
    return "\n\n".join(part for part in (text.strip(), *blocks) if part)


def user_notice(outcome: Outcome, *, max_bytes: int) -> str | None:
    """A short reply when a file could not be used (the rest of the message is still answered)."""
    named = f" {outcome.name}" if outcome.name else ""
    if outcome.status == "too_large":
        size = f" ({human_size(outcome.size)})" if outcome.size else ""
        return (
            f"⚠️ Your {outcome.label}{named}{size} is over the {human_size(max_bytes)} limit, so I did not download it."
        )
    if outcome.status == "failed":
        return f"⚠️ I could not download your {outcome.label}{named}: {outcome.error}. I'll answer without it."
    if outcome.status != "saved":
        return None
    if outcome.kind in ("audio", "video") and outcome.error:  # no transcript
        return f"⚠️ I saved your {outcome.label}{named}, but I could not listen to it: {outcome.error.rstrip('.')}."
    if outcome.error:  # saved, but unreadable (gateway/attachments/prepare.py, `unreadable`)
        return f"⚠️ I saved your {outcome.label}{named}, but that file could not be read: {outcome.error}."
    if outcome.kind == "file":  # a type no parser reads: the model sees only its name and path
        kind = f" ({outcome.mime})" if outcome.mime else ""
        return f"⚠️ I saved your {outcome.label}{named}{kind}, but I cannot read that kind of file directly."
    return None


def image_record(outcome: Outcome) -> dict[str, Any]:
    """What a stored user row keeps per image, so the context can attach it while it is recent."""
    return {"path": outcome.path, "mime": outcome.mime, "width": outcome.width, "height": outcome.height}
