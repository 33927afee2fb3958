"""Item 8: the gateway never writes through a link.

A command in the session (the shell can make links) plants a symlink where the gateway will
store the next attachment or MCP binary result, pointing out of the workspace. The outside file
must stay untouched (or not be created); the store writes a fresh file or fails with a note.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gateway.attachments import AttachmentPreparer
from gateway.config import AttachmentsConfig
from gateway.events import Attachment, Fetched, ThreadKey
from gateway.mcp.results import render
from gateway.mcp.sdk import CallResult, Content

THREAD = ThreadKey("fake", "chat1", "")


class Files:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    async def __call__(self, attachment: Attachment, max_bytes: int) -> Fetched:
        return Fetched(self.files[attachment.file_id])


def _preparer(ws: Path, files: dict[str, bytes]) -> tuple[AttachmentPreparer, list[str]]:
    told: list[str] = []

    async def save_payload(item_id: int, payload: dict[str, Any]) -> None:
        return None

    async def notify(thread: ThreadKey, text: str, key: str, reply_to: str) -> None:
        told.append(text)

    preparer = AttachmentPreparer(
        AttachmentsConfig(download_backoff_s=0), ws, {"fake": Files(files)}, save_payload=save_payload, notify=notify
    )
    return preparer, told


async def _store(preparer: AttachmentPreparer, item_id: int, name: str, file_id: str):  # noqa: ANN202
    payload = {"text": "", "attachments": [{"kind": "document", "file_id": file_id, "name": name}]}
    return (await preparer.prepare(item_id, payload, THREAD, 7)).outcomes[0]


async def test_an_attachment_is_never_written_through_a_planted_link(tmp_path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("precious\n")
    missing = outside / "created.txt"
    preparer, _ = _preparer(ws, {"a": b"first\n", "b": b"attack\n", "c": b"again\n"})
    first = await _store(preparer, 1, "first.txt", "a")
    (stored_first,) = ws.rglob("first.txt")  # where this session's attachments go
    folder = stored_first.parent
    assert first.status == "saved" and first.path.endswith("first.txt")
    # Links where the next file of each name (and its temporary file) would go.
    for name in ("report.txt", "report.txt.part", "report-2.txt", "report-2.txt.part"):
        os.symlink(victim, folder / name)
    for name in ("notes.txt", "notes.txt.part"):
        os.symlink(missing, folder / name)
    report = await _store(preparer, 2, "report.txt", "b")
    notes = await _store(preparer, 3, "notes.txt", "b")
    assert victim.read_text() == "precious\n"
    assert not missing.exists()
    for outcome in (report, notes):
        if outcome.status == "saved":
            stored = folder / Path(outcome.path).name
            assert not stored.is_symlink() and stored.read_bytes() == b"attack\n"
            assert stored.resolve().is_relative_to(ws.resolve())
        else:
            assert outcome.error or outcome.note
    # The folder itself swapped for a link to a directory outside.
    folder.rename(tmp_path / "moved")
    os.symlink(outside, folder)
    again = await _store(preparer, 4, "again.txt", "c")
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert again.status != "saved"
    assert again.error


def _image(data: bytes) -> CallResult:
    return CallResult((Content("image", data=data, mime="image/png"),), is_error=False)


def test_an_mcp_binary_result_is_never_written_through_a_planted_link(tmp_path) -> None:
    ws, scout, outside = tmp_path / "ws", tmp_path / "scout", tmp_path / "outside"
    outside.mkdir()
    data = b"\x89PNG\r\n\x1a\nfake image"
    # Where this result is stored (the name comes from its bytes): learnt in another workspace.
    render(_image(data), server="pics", workspace=scout)
    (relative,) = [p.relative_to(scout) for p in scout.rglob("*") if p.is_file()]
    target = ws / relative
    target.parent.mkdir(parents=True)
    os.symlink(outside / "created.png", target)
    text = render(_image(data), server="pics", workspace=ws)
    assert not (outside / "created.png").exists()
    assert "saved to the workspace" in text or "not saved" in text
    if "saved to the workspace" in text:
        assert not target.is_symlink() and target.read_bytes() == data
    # The server's folder swapped for a link to a directory outside.
    target.parent.rename(tmp_path / "moved")
    os.symlink(outside, target.parent)
    text = render(_image(b"\x89PNG\r\n\x1a\nanother"), server="pics", workspace=ws)
    assert list(outside.iterdir()) == []
    assert "not saved" in text
