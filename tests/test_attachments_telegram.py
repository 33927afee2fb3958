"""Files people send on Telegram reach the model; files the agent sends reach the chat.

End to end: FakeTelegram (getFile, file downloads, sendPhoto/sendDocument) <- real PTB <-
TelegramChannel <- Gateway -> FakeLLM (chat completions and /audio/transcriptions), on SQLite
and PostgreSQL.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fakes.llm import FakeLLM, FakeToolCall
from fakes.telegram import BOT_ID, FakeTelegram
from harness import make_config
from helpers import until
from media import decoded_image, image_bytes, image_parts, pdf_bytes, text_of, user_message, voice_bytes
from test_telegram_e2e import GROUP, PRIVATE, running, settle, texts, tg_config

from gateway.config import Config

pytestmark = pytest.mark.asyncio


def config(
    llm: FakeLLM,
    tg: FakeTelegram,
    tmp_path: Path,
    *,
    llm_settings: dict[str, Any] | None = None,
    attachments: dict[str, Any] | None = None,
    **sections: Any,
) -> Config:
    base = tg_config(llm, tg, tmp_path, telegram={"api_file_url": f"{tg.url}/file/bot"})
    return make_config(
        llm.base_url,
        str(tmp_path / "ws"),
        telegram=base.telegram.model_dump(),
        http={"port": 0},
        llm={"max_retries": 1, "retry_budget_s": 5, **(llm_settings or {})},
        attachments={"download_backoff_s": 0.01, "album_wait_s": 0.3, "image_max_side": 512, **(attachments or {})},
        approvals={"rules": [{"tool": "send_file", "action": "allow"}]},
        **sections,
    )


def photo_update(
    tg: FakeTelegram, data: bytes, width: int, height: int, caption: str = "", **media: Any
) -> dict[str, Any]:
    """Queues a photo message; returns the update."""
    photo = tg.files.photo(data, width, height)
    return tg.enqueue(tg.message_update(PRIVATE, caption, user_id=PRIVATE, media={"photo": photo, **media}))


def saved(tmp_path: Path, relative: str, session: int = 1) -> Path:
    """A stored attachment: in its session's directory, at the path the model is shown."""
    return tmp_path / "ws" / "sessions" / str(session) / relative


# --- images ----------------------------------------------------------------------------------


async def test_a_photo_with_caption_reaches_a_vision_model_as_an_image_part(store, llm, tg, tmp_path) -> None:
    picture = image_bytes(2000, 1000)
    llm.reply("A red picture with black stripes.")
    async with running(store, config(llm, tg, tmp_path, llm_settings={"vision": True})) as gateway:
        update = photo_update(tg, picture, 2000, 1000, caption="what is this?")
        await settle(gateway, lambda: texts(tg, PRIVATE))
    assert texts(tg, PRIVATE) == ["A red picture with black stripes."]
    message = user_message(llm.requests[0])
    text = text_of(message)
    assert text.startswith("what is this?")
    assert "[photo saved at attachments/1/photo-1-1.jpg (image/jpeg, 2000x1000," in text
    [url] = image_parts(message)
    assert url.startswith("data:image/jpeg;base64,")
    assert decoded_image(url).size == (512, 256)  # downscaled to attachments.image_max_side
    assert saved(tmp_path, "attachments/1/photo-1-1.jpg").read_bytes() == picture  # the original is kept
    largest = update["message"]["photo"][-1]["file_id"]  # the full size, not the thumbnail
    assert [c.params["file_id"] for c in tg.calls_to("getFile")] == [largest]


async def test_of_a_photos_sizes_the_largest_under_the_attachment_limit_is_downloaded(store, llm, tg, tmp_path) -> None:
    """Only the Bot API's 20 MB bounded the choice: a photo whose full size is over
    `attachments.max_bytes` was "not downloaded: too large" although Telegram had sent a
    smaller copy of it that fits."""
    picture = image_bytes(2560, 1920, color=(40, 90, 200))
    photo = tg.files.photo(picture, 2560, 1920, sizes=(320, 800, 1280))
    fits = next(p for p in photo if p["width"] == 1280)
    limit = (fits["file_size"] + photo[-1]["file_size"]) // 2
    assert fits["file_size"] < limit < photo[-1]["file_size"]
    llm.reply("A blue picture.")
    async with running(store, config(llm, tg, tmp_path, attachments={"max_bytes": limit})) as gateway:
        tg.enqueue(tg.message_update(PRIVATE, "look", user_id=PRIVATE, media={"photo": photo}))
        await settle(gateway, lambda: texts(tg, PRIVATE))
    assert [c.params["file_id"] for c in tg.calls_to("getFile")] == [fits["file_id"]]
    assert "(image/jpeg, 1280x960," in text_of(user_message(llm.requests[0]))


async def test_without_vision_a_photo_is_a_note_that_a_tool_then_reads(store, llm, tg, tmp_path) -> None:
    picture = image_bytes(640, 480, fmt="PNG")
    llm.tool_call("read_file", {"path": "attachments/1/photo-1-1.png"}, id="call_1")
    llm.reply("It is a 640x480 PNG.")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        photo_update(tg, picture, 640, 480)
        await settle(gateway, lambda: texts(tg, PRIVATE))
    first = user_message(llm.requests[0])
    assert isinstance(first["content"], str)  # no image part without llm.vision
    assert "[photo saved at attachments/1/photo-1-1.png (image/png, 640x480," in first["content"]
    [tool] = [m["content"] for m in llm.requests[1]["messages"] if m["role"] == "tool"]
    assert "attachments/1/photo-1-1.png is an image (image/png, 640x480" in tool
    assert texts(tg, PRIVATE) == ["It is a 640x480 PNG."]


async def test_old_image_parts_become_their_note(store, llm, tg, tmp_path) -> None:
    settings = config(llm, tg, tmp_path, llm_settings={"vision": True}, attachments={"image_turns": 2})
    async with running(store, settings) as gateway:
        photo_update(tg, image_bytes(300, 200), 300, 200, caption="first")
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 1)
        for n, word in enumerate(("second", "third"), start=2):
            tg.private_message(PRIVATE, word)
            await settle(gateway, lambda n=n: len(texts(tg, PRIVATE)) == n)
    with_images = [len([u for m in r["messages"] if m["role"] == "user" for u in image_parts(m)]) for r in llm.requests]
    assert with_images == [1, 1, 0]  # the photo's turn and the next one; then only its note
    oldest = [m for m in llm.requests[2]["messages"] if m["role"] == "user"][0]
    assert "[photo saved at attachments/1/" in text_of(oldest)


# --- documents and voice ---------------------------------------------------------------------


async def test_a_pdf_and_a_text_file_are_read_inline(store, llm, tg, tmp_path) -> None:
    llm.reply("Read both.")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        pdf = tg.files.document(pdf_bytes("Quarterly revenue grew", "Costs fell"), "report.pdf", "application/pdf")
        tg.enqueue(tg.message_update(PRIVATE, "summarise", user_id=PRIVATE, media={"document": pdf}))
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 1)
        llm.reply("Noted.")
        # The name and the claimed type say CSV; the content is what counts.
        csv = tg.files.document(b"name,qty\napples,3\npears,5\n", "stock.csv", "application/octet-stream")
        tg.enqueue(tg.message_update(PRIVATE, "", user_id=PRIVATE, media={"document": csv}))
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 2)
    pdf_text = text_of(user_message(llm.requests[0]))
    assert "[document \"report.pdf\" saved at attachments/1/report.pdf (application/pdf, 2 pages," in pdf_text
    assert "Text of the PDF:\n<<<\nQuarterly revenue grew\n\nCosts fell\n>>>" in pdf_text
    csv_text = text_of(user_message(llm.requests[1]))
    assert "saved at attachments/1/stock.csv (text/csv," in csv_text
    assert "Content:\n<<<\nname,qty\napples,3\npears,5\n\n>>>" in csv_text


async def test_a_long_text_file_is_cut_and_says_where_the_rest_is(store, llm, tg, tmp_path) -> None:
    body = "".join(f"line {n}\n" for n in range(2000))
    async with running(store, config(llm, tg, tmp_path, attachments={"max_inline_chars": 100})) as gateway:
        doc = tg.files.document(body.encode(), "log.txt", "text/plain")
        tg.enqueue(tg.message_update(PRIVATE, "", user_id=PRIVATE, media={"document": doc}))
        await settle(gateway, lambda: texts(tg, PRIVATE))
    text = text_of(user_message(llm.requests[0]))
    assert f"<<<\n{body[:100]}\n>>>\n[cut at 100 characters: the whole file is attachments/1/log.txt]" in text
    assert saved(tmp_path, "attachments/1/log.txt").read_text() == body


async def test_a_voice_note_is_transcribed_and_its_audio_kept(store, llm, tg, tmp_path) -> None:
    audio = voice_bytes()
    llm.transcripts[audio] = "remind me to buy milk"
    llm.transcription_failures = 1  # one server error: tried again
    llm.reply("I'll remind you.")
    settings = config(llm, tg, tmp_path, llm_settings={"transcription_model": "whisper-1"})
    async with running(store, settings) as gateway:
        tg.enqueue(tg.message_update(PRIVATE, "", user_id=PRIVATE, media={"voice": tg.files.voice(audio, duration=7)}))
        await settle(gateway, lambda: texts(tg, PRIVATE))
    text = text_of(user_message(llm.requests[0]))
    assert "[voice note saved at attachments/1/voice-note-1-1.ogg (audio/ogg, 0:07," in text
    assert "Transcript:\n<<<\nremind me to buy milk\n>>>" in text
    assert [t["model"] for t in llm.transcriptions] == ["whisper-1", "whisper-1"]
    assert llm.transcriptions[-1]["content_type"] == "audio/ogg"
    assert saved(tmp_path, "attachments/1/voice-note-1-1.ogg").read_bytes() == audio


async def test_without_a_transcription_model_a_voice_note_is_a_note_with_its_path(store, llm, tg, tmp_path) -> None:
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        tg.enqueue(
            tg.message_update(PRIVATE, "", user_id=PRIVATE, media={"voice": tg.files.voice(voice_bytes(), duration=65)})
        )
        await settle(gateway, lambda: texts(tg, PRIVATE))
    text = text_of(user_message(llm.requests[0]))
    assert "voice note saved at attachments/1/voice-note-1-1.ogg (audio/ogg, 1:05," in text
    assert "[not transcribed: no transcription model is configured]" in text
    assert llm.transcriptions == []
    assert "⚠️ I saved your voice note, but I could not listen to it: no speech-to-text is set up here." in texts(
        tg, PRIVATE
    )


async def test_a_failed_transcription_and_an_unreadable_type_are_each_told_in_one_line(store, llm, tg, tmp_path):
    """The person was told nothing when a voice note could not be transcribed or a file was of
    a kind no parser reads: the answer came as if the file had not been sent."""
    llm.transcription_failures = 10
    llm.reply("Answered.")
    llm.reply("Answered.")
    settings = config(llm, tg, tmp_path, llm_settings={"transcription_model": "whisper-1"})
    archive = b"PK\x03\x04" + bytes(200)
    async with running(store, settings) as gateway:
        media = {"voice": tg.files.voice(voice_bytes(), duration=7)}
        tg.enqueue(tg.message_update(PRIVATE, "", user_id=PRIVATE, media=media))
        await settle(gateway, lambda: "Answered." in texts(tg, PRIVATE))
        document = tg.files.document(archive, "bundle.zip", "application/zip")
        tg.enqueue(tg.message_update(PRIVATE, "unpack this", user_id=PRIVATE, media={"document": document}))
        await settle(gateway, lambda: texts(tg, PRIVATE).count("Answered.") == 2)
    notices = [t for t in texts(tg, PRIVATE) if t.startswith("⚠️")]
    assert notices == [
        "⚠️ I saved your voice note, but I could not listen to it: the transcription failed.",
        "⚠️ I saved your document bundle.zip (application/zip), but I cannot read that kind of file directly.",
    ]


# --- albums, limits, failures ----------------------------------------------------------------


async def test_an_album_is_one_message(store, llm, tg, tmp_path) -> None:
    llm.reply("Two photos.")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        photo_update(tg, image_bytes(100, 80), 100, 80, caption="our garden", media_group_id="g1")
        photo_update(tg, image_bytes(120, 90, fmt="PNG"), 120, 90, media_group_id="g1")
        await settle(gateway, lambda: texts(tg, PRIVATE))
    assert len(llm.requests) == 1 and texts(tg, PRIVATE) == ["Two photos."]
    text = text_of(user_message(llm.requests[0]))
    assert text.startswith("our garden")
    assert "attachments/1/photo-1-1.jpg (image/jpeg, 100x80" in text
    assert "(image/png, 120x90" in text
    assert await store.inbox.count_pending() == 0


def group_photo(tg: FakeTelegram, data: bytes, caption: str = "", **media: Any) -> dict[str, Any]:
    photo = tg.files.photo(data, 100, 80)
    update = tg.message_update(GROUP, caption, user_id=7, chat_type="supergroup", media={"photo": photo, **media})
    return tg.enqueue(update)


async def test_a_group_album_addressed_by_one_part_is_one_message_with_every_part(store, llm, tg, tmp_path) -> None:
    """In a group only the part with the caption names the bot: the other parts were dropped
    as "not addressed", and the model saw one photo of the three."""
    llm.reply("Three photos.")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        group_photo(tg, image_bytes(100, 80), media_group_id="g7")
        group_photo(tg, image_bytes(101, 80), "@test_bot what are these?", media_group_id="g7")
        group_photo(tg, image_bytes(102, 80), media_group_id="g7")
        await settle(gateway, lambda: "Three photos." in texts(tg, GROUP))
    assert len(llm.requests) == 1
    text = text_of(user_message(llm.requests[0]))
    assert "what are these?" in text and text.count("[photo saved at") == 3
    assert await store.inbox.count_pending() == 0


async def test_a_group_album_nobody_addressed_is_no_turn(store, llm, tg, tmp_path) -> None:
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        group_photo(tg, image_bytes(100, 80), "our trip", media_group_id="g8")
        group_photo(tg, image_bytes(101, 80), media_group_id="g8")
        tg.group_message(GROUP, "@test_bot hello", user_id=7)
        await settle(gateway, lambda: bool(texts(tg, GROUP)))
    assert len(llm.requests) == 1 and "[photo" not in text_of(user_message(llm.requests[0]))
    assert await store.inbox.count_pending() == 0 and tg.files.download_attempts == []


async def test_an_oversize_file_is_not_downloaded_and_both_sides_are_told(store, llm, tg, tmp_path) -> None:
    llm.reply("Here is my answer to the text.")
    async with running(store, config(llm, tg, tmp_path, attachments={"max_bytes": 1000})) as gateway:
        big = tg.files.document(b"x" * 50, "video.mov", "video/quicktime", size=5_000_000)
        tg.enqueue(tg.message_update(PRIVATE, "and a question", user_id=PRIVATE, media={"document": big}))
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 2)
    assert tg.calls_to("getFile") == [] and tg.files.download_attempts == []
    notice, answer = texts(tg, PRIVATE)
    assert notice == "⚠️ Your document video.mov (5.0 MB) is over the 1 KB limit, so I did not download it."
    assert answer == "Here is my answer to the text."
    text = text_of(user_message(llm.requests[0]))
    assert text.startswith("and a question")
    assert '[document "video.mov" (5.0 MB) was not downloaded: too large, over the 1 KB limit]' in text


async def test_a_file_the_bot_api_will_not_hand_over_is_too_large(store, llm, tg, tmp_path) -> None:
    async with running(store, config(llm, tg, tmp_path, attachments={"max_bytes": 100_000_000})) as gateway:
        big = tg.files.document(b"x" * 10, "dump.bin", "application/octet-stream", size=30_000_000)
        tg.enqueue(tg.message_update(PRIVATE, "", user_id=PRIVATE, media={"document": big}))
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 2)
    assert tg.files.download_attempts == []  # getFile said "file is too big"
    assert "was not downloaded: too large" in text_of(user_message(llm.requests[0]))


async def test_a_download_that_fails_twice_then_succeeds(store, llm, tg, tmp_path) -> None:
    tg.files.fail_downloads(2)
    llm.reply("Got it.")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        doc = tg.files.document(b"hello file\n", "hello.txt", "text/plain")
        update = tg.enqueue(tg.message_update(PRIVATE, "read this", user_id=PRIVATE, media={"document": doc}))
        await settle(gateway, lambda: texts(tg, PRIVATE))
    assert tg.files.download_attempts == [doc["file_id"]] * 3
    assert texts(tg, PRIVATE) == ["Got it."] and len(llm.requests) == 1
    assert "Content:\n<<<\nhello file\n\n>>>" in text_of(user_message(llm.requests[0]))
    item = await store.inbox.get_by_event(f"tg:{BOT_ID}:{update['update_id']}")
    [entry] = item.payload["attachments"]  # what the download did is recorded on the inbox item
    assert entry["attempts"] == 2 and entry["outcome"]["status"] == "saved" and entry["outcome"]["attempts"] == 3


async def test_a_download_that_keeps_failing_is_explained_and_the_text_still_answered(store, llm, tg, tmp_path) -> None:
    tg.files.fail_downloads(10)
    llm.reply("Answering the words.")
    async with running(store, config(llm, tg, tmp_path, attachments={"download_attempts": 3})) as gateway:
        doc = tg.files.document(b"data", "notes.txt", "text/plain")
        tg.enqueue(tg.message_update(PRIVATE, "see attached", user_id=PRIVATE, media={"document": doc}))
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 2)
    assert len(tg.files.download_attempts) == 3
    notice, answer = texts(tg, PRIVATE)
    assert notice.startswith("⚠️ I could not download your document notes.txt:") and answer == "Answering the words."
    text = text_of(user_message(llm.requests[0]))
    assert text.startswith("see attached") and '[document "notes.txt" could not be downloaded:' in text


# --- files out -------------------------------------------------------------------------------


async def test_send_file_sends_a_photo_and_a_document_once(store, llm, tg, tmp_path) -> None:
    workspace = tmp_path / "ws" / "sessions" / "1"  # the first session's own directory
    workspace.mkdir(parents=True)
    (workspace / "chart.png").write_bytes(image_bytes(300, 200, fmt="PNG"))
    (workspace / "report.txt").write_text("all good\n")
    llm.tool_calls(
        FakeToolCall("send_file", {"path": "chart.png", "caption": "the chart"}, id="c1"),
        FakeToolCall("send_file", {"path": "report.txt"}, id="c2"),
    )
    llm.reply("Sent both.")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "send me the chart and the report")
        await settle(gateway, lambda: "Sent both." in texts(tg, PRIVATE))
        [photo] = tg.calls_to("sendPhoto")
        [document] = tg.calls_to("sendDocument")
        assert photo.params["photo"]["content"] == (workspace / "chart.png").read_bytes()
        assert photo.params["caption"] == "the chart"
        assert document.params["document"]["filename"] == "report.txt"
        results = [m["content"] for m in llm.requests[1]["messages"] if m["role"] == "tool"]
        assert results[0].startswith("Sent chart.png (image/png,") and results[0].endswith("as a photo.")
        assert results[1].startswith("Sent report.txt (text/plain,") and results[1].endswith("as a document.")
        # Run again (as after a restart), the same call finds its send recorded: nothing is sent twice.
        session = (await store.sessions.list())[0]
        records = [await store.outbox.get(f"file:{session.id}:{call}") for call in ("c1", "c2")]
        assert [(r.kind, r.status) for r in records] == [("message", "sent"), ("message", "sent")]
        ctx = _tool_context(gateway, session.id, "c2")
        await gateway.registry.get("send_file").func(ctx, {"path": "report.txt"})
        assert len(tg.calls_to("sendDocument")) == 1


async def test_send_file_refuses_paths_outside_the_workspace(store, llm, tg, tmp_path) -> None:
    (tmp_path / "secret.txt").write_text("no")
    llm.tool_call("send_file", {"path": "../secret.txt"}, id="c1")
    llm.reply("Could not.")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "send ../secret.txt")
        await settle(gateway, lambda: "Could not." in texts(tg, PRIVATE))
    assert tg.calls_to("sendDocument") == [] and tg.calls_to("sendPhoto") == []
    [result] = [m["content"] for m in llm.requests[1]["messages"] if m["role"] == "tool"]
    assert "outside the workspace" in result


def _tool_context(gateway, session_id: int, call_id: str):
    from gateway.events import ThreadKey
    from gateway.files.workspace import session_dir
    from gateway.tools import ToolContext

    return ToolContext(
        session_id=session_id,
        thread=ThreadKey("telegram", str(PRIVATE)),
        source="telegram",
        interactive=True,
        workspace=session_dir(gateway.config.agent.workspace, session_id),
        agent=gateway.config.agent,
        notes=gateway.store.sessions,
        services=gateway.services.tool_services,
        call_id=call_id,
    )


async def test_a_scheduled_run_sends_its_file_to_deliver_to(store, llm, tg, tmp_path) -> None:
    from datetime import UTC, datetime

    shared = tmp_path / "reports"  # each run is a new session: what it sends comes from the shared directory
    shared.mkdir()
    (shared / "daily.txt").write_text("numbers\n")
    job = {"name": "daily", "cron": "0 6 * * *", "prompt": "Send the daily file.", "deliver_to": f"telegram:{PRIVATE}"}
    llm.tool_call("send_file", {"path": str(shared / "daily.txt"), "caption": "today"}, id="s1")
    llm.reply("Sent the daily file.")
    sections = {"scheduler": {"enabled": True, "jobs": [job]}, "agent": {"shared_dir": str(shared)}}
    async with running(store, config(llm, tg, tmp_path, **sections)) as gateway:
        schedule = await store.schedules.by_name("daily")
        await gateway.scheduler.fire(schedule.id, datetime.now(UTC))
        await settle(gateway, lambda: any("Sent the daily file." in t for t in texts(tg, PRIVATE)))
    [sent] = tg.calls_to("sendDocument")
    assert int(sent.params["chat_id"]) == PRIVATE and sent.params["caption"] == "today"
    assert sent.params["document"]["content"] == b"numbers\n"


async def test_a_stuck_file_send_is_swept_with_its_file_or_failed_with_a_reason(store, llm, tg, tmp_path) -> None:
    """The sweeper rebuilt a stuck send_file row as an empty text message and marked it sent:
    the file never went out and nothing said so."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    report = workspace / "report.txt"
    report.write_text("quarterly figures\n")
    thread = f"telegram:{PRIVATE}:"
    (workspace / "linked.txt").symlink_to(tmp_path / "outside.txt")  # a link put there since
    (tmp_path / "outside.txt").write_text("another session's secret\n")
    rows = (("file:1:c1", report), ("file:1:c2", workspace / "gone.txt"), ("file:1:c3", workspace / "linked.txt"))
    for key, path in rows:
        file = {"path": str(path), "name": path.name, "mime": "text/plain", "kind": "document", "caption": "figures"}
        await store.outbox.record(key, thread, "message", {"text": "", "reply_to": "", "document": None, "file": file})
    sweep = {"sweep_after_s": 0.2, "backoff_s": 0.01, "backoff_max_s": 0.02}
    async with running(store, config(llm, tg, tmp_path, outbox=sweep)):
        await until(lambda: len(tg.calls_to("sendDocument")) == 1)
        await until_async(lambda: _status(store, "file:1:c2"), "failed")
        await until_async(lambda: _status(store, "file:1:c3"), "failed")
    [sent] = tg.calls_to("sendDocument")
    assert sent.params["document"]["content"] == b"quarterly figures\n" and sent.params["caption"] == "figures"
    assert tg.calls_to("sendMessage") == []  # no empty text stood in for the file
    assert (await store.outbox.get("file:1:c1")).status == "sent"
    gone = await store.outbox.get("file:1:c2")
    assert gone.status == "failed" and "gone.txt" in gone.error and "no longer exists" in gone.error
    linked = await store.outbox.get("file:1:c3")
    assert "replaced by a link" in linked.error and len(tg.calls_to("sendDocument")) == 1


async def _status(store, key: str) -> str:
    row = await store.outbox.get(key)
    return row.status if row else ""


async def until_async(probe, expected, timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while await probe() != expected:
            await asyncio.sleep(0.05)


async def test_a_closed_sessions_files_are_pruned_after_their_retention(store, llm, tg, tmp_path) -> None:
    """Attachments and MCP results stayed on disk for ever: they are pruned with their
    session (`retention.files_days` after /new closed it); the session in use keeps its own."""
    llm.reply("A photo.")
    llm.reply("Another photo.")
    retention = {"files_days": 2 / 86400, "every_s": 0.1}  # two seconds
    async with running(store, config(llm, tg, tmp_path, retention=retention)) as gateway:
        photo_update(tg, image_bytes(100, 80), 100, 80, caption="first")
        await settle(gateway, lambda: "A photo." in texts(tg, PRIVATE))
        first = saved(tmp_path, "attachments/1/photo-1-1.jpg")
        assert first.is_file()
        (first.parents[2] / "mcp" / "files").mkdir(parents=True)  # an MCP result of that session
        (first.parents[2] / "mcp" / "files" / "chart.png").write_bytes(b"png")
        (first.parents[2] / "notes.md").write_text("written by a tool")  # the agent's own work stays
        tg.private_message(PRIVATE, "/new")
        await until(lambda: len(texts(tg, PRIVATE)) >= 2)
        photo_update(tg, image_bytes(100, 80), 100, 80, caption="second")
        await settle(gateway, lambda: "Another photo." in texts(tg, PRIVATE))
        gone = (first.parents[1], first.parents[2] / "mcp")
        await until(lambda: not any(folder.exists() for folder in gone), timeout=15)
        assert (first.parents[2] / "notes.md").is_file()
        current = sorted((tmp_path / "ws" / "sessions").glob("*/attachments/*/*"))
        assert len(current) == 1 and "photo" in current[0].name  # the second session's, kept
    assert len(await store.sessions.list()) == 2  # the history stays


async def test_a_job_with_a_topic_of_its_own_opens_it_once_and_delivers_there(store, llm, tg, tmp_path) -> None:
    """`topic:` on a job delivering to a private chat of a bot with topics (Bot API 9.4): its
    first delivery opens the topic, later ones go into it, also after a restart; a bot without
    topics gets the delivery in the chat itself."""
    from datetime import UTC, datetime

    job = {"name": "digest", "cron": "0 6 * * *", "prompt": "Summarise the news.",
           "deliver_to": f"telegram:{PRIVATE}", "topic": "Morning digest"}
    sections = {"scheduler": {"enabled": True, "jobs": [job]}}
    for n in (1, 2):
        llm.reply(f"Digest number {n}.")
        async with running(store, config(llm, tg, tmp_path, **sections)) as gateway:
            schedule = await store.schedules.by_name("digest")
            await gateway.scheduler.fire(schedule.id, datetime.now(UTC))
            await settle(gateway, lambda n=n: any(f"Digest number {n}." in t for t in texts(tg, PRIVATE)))
    ((topic, name),) = tg.topics[PRIVATE].items()
    assert name == "Morning digest" and len(tg.calls_to("createForumTopic")) == 1
    assert [m.thread_id for m in tg.bot_messages(PRIVATE)] == [topic, topic]
    state = await store.schedules.state(schedule.id)
    assert state.topic_thread == f"telegram:{PRIVATE}:{topic}"

    tg.bot_settings["has_topics_enabled"] = False  # a bot without topics: the chat itself
    await store.schedules.save_state(schedule.id, topic_thread=None)
    llm.reply("Digest number 3.")
    async with running(store, config(llm, tg, tmp_path, **sections)) as gateway:
        await gateway.scheduler.fire(schedule.id, datetime.now(UTC))
        await settle(gateway, lambda: any("Digest number 3." in t for t in texts(tg, PRIVATE)))
    assert tg.bot_messages(PRIVATE)[-1].thread_id is None and len(tg.calls_to("createForumTopic")) == 1


async def test_a_job_topic_needs_a_telegram_chat_without_a_topic(tmp_path) -> None:
    from datetime import UTC, datetime

    from gateway.config import JobConfig, SchedulerConfig
    from scheduler.definitions import DefinitionError, to_schedule

    for deliver_to in ("slack:C123", f"telegram:{PRIVATE}:7", "none"):
        job = JobConfig(name="j", cron="0 6 * * *", prompt="p", deliver_to=deliver_to, topic="News")
        with pytest.raises(DefinitionError, match="topic: the job opens its topic in a Telegram chat"):
            to_schedule(job, SchedulerConfig(), source="config", now=datetime.now(UTC))
