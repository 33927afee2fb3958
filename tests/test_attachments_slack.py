"""Files people share on Slack reach the model; files the agent sends land in the thread.

End to end: signed events -> the gateway's /slack/events -> inbox -> downloads from FakeSlack's
`url_private` (which answers its sign-in page without the bot token) -> FakeLLM; uploads with
files_upload_v2 into the thread. SQLite and PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.llm import FakeLLM
from fakes.slack import FakeSlack
from harness import make_config
from media import decoded_image, image_bytes, image_parts, noise_png, pdf_bytes, text_of, user_message
from test_slack_e2e import ANN, CHANNEL, DM, running, slack_config, texts

from gateway.config import Config


def config(model: FakeLLM, slack: FakeSlack, tmp_path: Path, **sections: Any) -> Config:
    attachments = {"download_backoff_s": 0.01, "image_max_side": 256, **sections.pop("attachments", {})}
    rules = {"rules": [{"tool": "send_file", "action": "allow"}]}
    base = slack_config(model, slack, tmp_path)
    return make_config(
        model.base_url,
        str(tmp_path / "ws"),
        slack=base.slack.model_dump(),
        http={"port": 0},
        attachments=attachments,
        approvals=rules,
        **sections,
    )


async def share_in_dm(side, text: str, files: list[dict[str, Any]]) -> dict[str, Any]:
    ts = side.written(DM, ANN, text)
    event = side.sender.dm(DM, ANN, text, ts=ts, subtype="file_share", files=files)
    await side.post(event)
    return event


async def test_a_mentioned_image_reaches_a_vision_model_fetched_with_the_bot_token(store, llm, slack, tmp_path) -> None:
    picture = image_bytes(1024, 768, fmt="PNG")
    llm.reply("A chart.")
    async with running(store, config(llm, slack, tmp_path, llm={"vision": True}), slack) as side:
        file = slack.shared.share(picture, "chart.png", "image/png")
        ts = side.written(CHANNEL, ANN, "<@UBOT> what does this show?")
        event = side.sender.mention(CHANNEL, ANN, "<@UBOT> what does this show?", ts=ts)
        await side.post({**event, "files": [file]})
        await side.settle(lambda: "A chart." in texts(slack))
    assert slack.shared.downloads == [(file["id"], f"Bearer {slack.token}")]
    message = user_message(llm.requests[0])
    assert text_of(message).startswith("what does this show?")
    assert '[photo "chart.png" saved at attachments/1/chart.png (image/png, 1024x768,' in text_of(message)
    [url] = image_parts(message)
    assert decoded_image(url).size == (256, 192)
    assert (tmp_path / "ws" / "sessions/1/attachments/1/chart.png").read_bytes() == picture
    reply = next(m for m in slack.messages[CHANNEL] if m.get("text") == "A chart.")
    assert reply["thread_ts"] == ts  # answered in the thread of the mention


async def test_a_file_still_processing_is_looked_up_with_files_info(store, llm, slack, tmp_path) -> None:
    llm.reply("Read it.")
    async with running(store, config(llm, slack, tmp_path), slack) as side:
        file = slack.shared.share(pdf_bytes("Invoice total 42 EUR"), "invoice.pdf", "application/pdf", processing=True)
        await share_in_dm(side, "", [file])
        await side.settle(lambda: "Read it." in texts(slack, DM))
    assert [c.params["file"] for c in slack.calls_to("files.info")] == [file["id"]]
    text = text_of(user_message(llm.requests[0]))
    assert "saved at attachments/1/invoice.pdf (application/pdf, 1 page," in text
    assert "Invoice total 42 EUR" in text


async def test_file_shared_before_its_message_is_one_turn_with_the_file(store, llm, slack, tmp_path, caplog) -> None:
    """Slack may send `file_shared` before the message that shares the file (and the file can
    still be processing): the event is passed over with its reason, the message brings the file."""
    import logging

    caplog.set_level(logging.DEBUG, "channels.slack")
    llm.reply("Got the notes.")
    async with running(store, config(llm, slack, tmp_path), slack) as side:
        file = slack.shared.share(b"# Notes\n- ship it\n", "notes.md", "text/markdown", processing=True)
        shared = {"type": "file_shared", "file_id": file["id"], "user_id": ANN, "file": {"id": file["id"]},
                  "channel_id": DM, "event_ts": side.sender.next_ts()}
        await side.post(shared)
        await share_in_dm(side, "my notes", [file])
        await side.settle(lambda: "Got the notes." in texts(slack, DM))
    assert len(llm.requests) == 1 and "- ship it" in text_of(user_message(llm.requests[0]))
    assert any("file_shared: not a message" in r.getMessage() for r in caplog.records)


async def test_a_download_that_fails_twice_then_succeeds(store, llm, slack, tmp_path) -> None:
    slack.shared.fail_downloads(2)
    llm.reply("Thanks.")
    async with running(store, config(llm, slack, tmp_path), slack) as side:
        file = slack.shared.share(b"# Plan\n- ship it\n", "plan.md", "text/markdown")
        await share_in_dm(side, "the plan", [file])
        await side.settle(lambda: "Thanks." in texts(slack, DM))
    assert len(slack.shared.downloads) == 3 and len(llm.requests) == 1
    assert "Content:\n<<<\n# Plan\n- ship it\n\n>>>" in text_of(user_message(llm.requests[0]))


async def test_an_oversize_file_is_skipped_and_the_rest_answered(store, llm, slack, tmp_path) -> None:
    llm.reply("Answered the text.")
    async with running(store, config(llm, slack, tmp_path, attachments={"max_bytes": 10_000}), slack) as side:
        file = slack.shared.share(b"x" * 100, "dump.tar", "application/x-tar", size=3_000_000)
        await share_in_dm(side, "also a question", [file])
        await side.settle(lambda: "Answered the text." in texts(slack, DM))
    assert slack.shared.downloads == []
    assert texts(slack, DM)[0] == "⚠️ Your document dump.tar (3.0 MB) is over the 10 KB limit, so I did not download it."
    assert "was not downloaded: too large" in text_of(user_message(llm.requests[0]))


async def test_the_bot_token_never_goes_to_another_host(store, llm, slack, tmp_path) -> None:
    llm.reply("ok")
    async with running(store, config(llm, slack, tmp_path), slack) as side:
        file = {
            **slack.shared.share(b"secret", "a.txt", "text/plain"),
            "url_private": "http://127.0.0.2:9/a.txt",
            "url_private_download": "http://127.0.0.2:9/a.txt",
        }
        await share_in_dm(side, "look", [file])
        await side.settle(lambda: "ok" in texts(slack, DM))
    assert slack.shared.downloads == []
    assert "not a Slack file URL" in text_of(user_message(llm.requests[0]))


async def test_send_file_uploads_into_the_thread_once(store, llm, slack, tmp_path) -> None:
    workspace = tmp_path / "ws" / "sessions" / "1"  # the first session's own directory
    workspace.mkdir(parents=True)
    (workspace / "summary.csv").write_text("a,b\n1,2\n")
    llm.tool_call("send_file", {"path": "summary.csv", "caption": "as asked"}, id="up1")
    llm.reply("Uploaded.")
    async with running(store, config(llm, slack, tmp_path), slack) as side:
        event = await side.mention("send me the summary")
        await side.settle(lambda: "Uploaded." in texts(slack))
    [complete] = slack.calls_to("files.completeUploadExternal")
    assert complete.params["channel_id"] == CHANNEL and complete.params["thread_ts"] == event["ts"]
    assert complete.params["initial_comment"] == "as asked"
    [upload] = [f for f in slack.files.values() if f.get("name") == "summary.csv"]
    assert upload["content"] == b"a,b\n1,2\n" and upload["shared"]
    session = (await store.sessions.list())[0]
    record = await store.outbox.get(f"file:{session.id}:up1")
    assert record is not None and record.status == "sent"


async def test_multi_megabyte_files_streamed_in_chunks_arrive_whole(store, llm, slack, tmp_path) -> None:
    """Slack's file servers stream a large file in many writes: the download reads to the end
    (a single read returned only what was buffered: a 3 MB file came back as 100 KB)."""
    document = pdf_bytes("Quarterly report", padding=3_000_000)
    photo = noise_png(1000, 1000)
    assert len(document) > 3_000_000 and len(photo) > 2_900_000
    llm.reply("Both read.")
    async with running(store, config(llm, slack, tmp_path, llm={"vision": True}), slack) as side:
        files = [
            slack.shared.share(document, "report.pdf", "application/pdf"),
            slack.shared.share(photo, "shot.png", "image/png"),
        ]
        await share_in_dm(side, "two files", files)
        await side.settle(lambda: "Both read." in texts(slack, DM))
    saved = tmp_path / "ws" / "sessions" / "1" / "attachments" / "1"
    assert (saved / "report.pdf").read_bytes() == document
    assert (saved / "shot.png").read_bytes() == photo
    text = text_of(user_message(llm.requests[0]))
    assert "Quarterly report" in text and "1000x1000" in text


async def test_a_chunked_body_without_a_length_arrives_whole(store, llm, slack, tmp_path) -> None:
    document = pdf_bytes("Chunked transfer", padding=1_500_000)
    slack.shared.declare_length = False
    llm.reply("Read.")
    async with running(store, config(llm, slack, tmp_path), slack) as side:
        await share_in_dm(side, "", [slack.shared.share(document, "big.pdf", "application/pdf")])
        await side.settle(lambda: "Read." in texts(slack, DM))
    assert (tmp_path / "ws" / "sessions" / "1" / "attachments" / "1" / "big.pdf").read_bytes() == document
    assert "Chunked transfer" in text_of(user_message(llm.requests[0]))


async def test_a_chunked_body_over_the_limit_is_refused_without_reading_it_all(store, llm, slack, tmp_path) -> None:
    slack.shared.declare_length = False
    llm.reply("Noted.")
    sections = {"attachments": {"max_bytes": 200_000}}
    async with running(store, config(llm, slack, tmp_path, **sections), slack) as side:
        # Slack's file object may understate the size: the limit holds on the bytes that arrive
        big = slack.shared.share(pdf_bytes("x", padding=1_000_000), "big.pdf", "application/pdf", size=1000)
        await share_in_dm(side, "", [big])
        await side.settle(lambda: "Noted." in texts(slack, DM))
    assert not (tmp_path / "ws" / "sessions" / "1" / "attachments" / "1" / "big.pdf").exists()
    assert "was not downloaded: too large" in text_of(user_message(llm.requests[0]))
