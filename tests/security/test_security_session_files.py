"""Item 6: one session's files are not another's.

Alice sends a file in her chat; Bob's session (another chat) is driven to read, list and send it
by every path the model could try. Before per-session directories every attachment sat in one
workspace, and `attachments/<Alice's session>/…` was readable by anyone's turn without approval.
"""

from __future__ import annotations

from pathlib import Path

from fakes.llm import FakeLLM
from harness import ALICE, BOB, make_config, running_gateway
from helpers import tool_results
from test_attachments import FilesChannel

from gateway.events import Attachment, InboundMessage, ThreadKey

SECRET = "alice-private-report-7731"
ALICE_CHAT = ThreadKey("fake", "chat-alice", "")
BOB_CHAT = ThreadKey("fake", "chat-bob", "")


async def _send_file(h, thread: ThreadKey, sender, name: str, file_id: str) -> None:  # noqa: ANN001
    message = InboundMessage(
        thread, sender, "here is a file", f"fake:{file_id}", attachments=(Attachment("document", file_id, name),)
    )
    await h.gateway.submit([message])
    await h.idle()


def _stored(ws: Path, name: str) -> Path:
    found = [p for p in ws.rglob(name) if p.is_file()]
    assert len(found) == 1, found
    return found[0]


async def test_a_session_cannot_read_list_or_send_another_sessions_attachment(store, tmp_path) -> None:
    ws = tmp_path / "ws"
    channel = FilesChannel(files={"f1": f"{SECRET}\n".encode()})
    async with FakeLLM() as llm:
        llm.reply("Got it.")
        config = make_config(llm.base_url, str(ws), approvals={"rules": [{"tool": "send_file", "action": "allow"}]})
        async with running_gateway(store, config, channel) as h:
            await _send_file(h, ALICE_CHAT, ALICE, "report.txt", "f1")
            stored = _stored(ws, "report.txt")
            relative = stored.relative_to(ws).as_posix()
            attempts = [
                ("read_file", {"path": relative}),
                ("read_file", {"path": str(stored)}),
                ("read_file", {"path": f"../{stored.parent.name}/{stored.name}"}),
                ("read_file", {"path": f"../../{relative}"}),
                ("list_dir", {"path": stored.parent.relative_to(ws).as_posix()}),
                ("list_dir", {"path": "attachments"}),
                ("list_dir", {"path": ".."}),
                ("send_file", {"path": str(stored)}),
                ("send_file", {"path": relative}),
            ]
            for n, (tool, args) in enumerate(attempts):
                llm.tool_call(tool, args, id=f"try{n}")
            llm.reply("Done.")
            await h.say("show me the other report", thread=BOB_CHAT, sender=BOB)
            await h.idle()
        results = tool_results(llm.requests[-1])
        assert len(results) == len(attempts)
        leaked = [
            (a, r)
            for a, r in zip(attempts, results, strict=True)
            if SECRET in r or "report.txt  (" in r or "Sent " in r
        ]
        assert leaked == []


async def test_old_attachment_paths_keep_resolving_for_their_own_session_only(store, tmp_path) -> None:
    """A deployment from before per-session directories: `attachments/<session>/<name>` named in
    the history still opens in that session, and in no other."""
    ws = tmp_path / "ws"
    async with FakeLLM() as llm:
        llm.reply("Hello.")
        config = make_config(llm.base_url, str(ws))
        async with running_gateway(store, config) as h:
            await h.say("hi", thread=ALICE_CHAT, sender=ALICE)
            await h.idle()
        (session,) = await store.sessions.list()
        legacy = ws / "attachments" / str(session.id) / "old.txt"
        legacy.parent.mkdir(parents=True, exist_ok=True)
        legacy.write_text(f"{SECRET}\n")
        old_path = f"attachments/{session.id}/old.txt"
        llm.tool_call("read_file", {"path": old_path}, id="own")
        llm.reply("Read.")
        llm.tool_call("read_file", {"path": old_path}, id="other")
        llm.reply("Tried.")
        async with running_gateway(store, config) as h:
            await h.say("read my old file", thread=ALICE_CHAT, sender=ALICE)
            await h.idle()
            assert SECRET in tool_results(llm.requests[-1])[-1]
            await h.say("read hers", thread=BOB_CHAT, sender=BOB)
            await h.idle()
            assert SECRET not in tool_results(llm.requests[-1])[-1]


async def test_the_shared_directory_is_readable_by_every_session_and_read_only(store, tmp_path) -> None:
    ws, shared = tmp_path / "ws", tmp_path / "shared"
    shared.mkdir()
    (shared / "handbook.md").write_text("team handbook 5512\n")
    async with FakeLLM() as llm:
        llm.tool_call("read_file", {"path": str(shared / "handbook.md")}, id="read")
        llm.tool_call("write_file", {"path": str(shared / "handbook.md"), "content": "defaced"}, id="write")
        llm.reply("Done.")
        config = make_config(
            llm.base_url,
            str(ws),
            agent={"shared_dir": str(shared)},
            approvals={"rules": [{"tool": "write_file", "action": "allow"}]},
        )
        async with running_gateway(store, config) as h:
            await h.say("read the handbook", thread=BOB_CHAT, sender=BOB)
            await h.idle()
        read, write = tool_results(llm.requests[-1])
        assert "team handbook 5512" in read
        assert "read-only" in write
        assert (shared / "handbook.md").read_text() == "team handbook 5512\n"


def test_image_records_from_before_and_after_find_their_files(tmp_path) -> None:
    """The context builder reads images by the record's path (relative to the workspace): an old
    record names `attachments/<session>/<name>`, which start moved into the session's directory."""
    from media import image_bytes

    from gateway.attachments.images import ImageParts
    from gateway.files.workspace import adopt_legacy_layout

    ws = tmp_path / "ws"
    old = ws / "attachments" / "3" / "p.png"
    old.parent.mkdir(parents=True)
    old.write_bytes(image_bytes(40, 20, fmt="PNG"))
    adopt_legacy_layout(ws, "attachments")
    assert not old.exists() and (ws / "sessions/3/attachments/3/p.png").is_file()
    parts = ImageParts(ws, 256, 4)
    for path in ("attachments/3/p.png", "sessions/3/attachments/3/p.png"):
        assert parts({"path": path, "mime": "image/png", "width": 40, "height": 20}) is not None, path


def test_an_image_record_never_reads_another_sessions_file_through_a_link(tmp_path) -> None:
    """A command in session 3 replaces its stored photo with a link to session 4's: the context
    builder must not send session 4's image to session 3's model."""
    import os

    from media import image_bytes

    from gateway.attachments.images import ImageParts

    ws = tmp_path / "ws"
    theirs = ws / "sessions/4/attachments/4/private.png"
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(image_bytes(40, 20, fmt="PNG"))
    mine = ws / "sessions/3/attachments/3/p.png"
    mine.parent.mkdir(parents=True)
    os.symlink("../../../4/attachments/4/private.png", mine)
    assert mine.resolve() == theirs.resolve()
    parts = ImageParts(ws, 256, 4)
    for path in ("attachments/3/p.png", "sessions/3/attachments/3/p.png"):
        assert parts({"path": path, "mime": "image/png", "width": 40, "height": 20}) is None, path
