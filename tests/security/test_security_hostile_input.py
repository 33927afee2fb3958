"""Parsers under limits (docs/security.md, "Hostile input").

Anyone who may message the bot can send a file that is cheap to send and costly, broken or
lying once a parser opens it (tests/security/hostile_files.py makes them). Each goes through
the real Telegram channel (getFile and the download from FakeTelegram, real PTB), and each
must end the same way: the item completes, the model gets a note saying the file could not be
read, the person gets a one-line notice, and the gateway goes on answering. A PDF that costs
more than its limits is read in a child process that is killed, and that verdict is recorded,
so a restart does not parse it again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.llm import FakeLLM
from fakes.telegram import BOT_ID, FakeTelegram
from harness import make_config
from helpers import echo
from hostile_files import (
    bomb_png,
    broken_xref_pdf,
    encrypted_pdf,
    shared_stream_pdf,
    truncated_jpeg,
    zip_named_pdf,
)
from media import text_of, user_message
from test_telegram_e2e import PRIVATE, running, settle, texts, tg_config

from gateway.config import Config

OTHER = 77  # another person's private chat
CORPUS = [
    ("shared-stream.pdf", "application/pdf", shared_stream_pdf, "CPU time"),
    ("broken-xref.pdf", "application/pdf", broken_xref_pdf, "not a readable PDF"),
    ("locked.pdf", "application/pdf", encrypted_pdf, "the PDF is encrypted"),
    ("bomb.png", "image/png", bomb_png, "11000x11000 pixels, over the limit"),
    ("cut.jpg", "image/jpeg", truncated_jpeg, "could not be decoded"),
    ("report.pdf", "application/pdf", zip_named_pdf, "called a PDF but its content is application/zip"),
]


def config(llm: FakeLLM, tg: FakeTelegram, tmp_path: Path, **attachments: Any) -> Config:
    base = tg_config(llm, tg, tmp_path, telegram={"api_file_url": f"{tg.url}/file/bot"})
    return make_config(
        llm.base_url,
        str(tmp_path / "ws"),
        telegram=base.telegram.model_dump(),
        http={"port": 0},
        llm={"max_retries": 1, "retry_budget_s": 5, "vision": True},
        # One CPU second for a PDF keeps the test short; the wall clock is generous for a loaded machine.
        attachments={"download_backoff_s": 0.01},
    )


def send_document(tg: FakeTelegram, data: bytes, name: str, mime: str) -> dict[str, Any]:
    document = tg.files.document(data, name, mime)
    return tg.enqueue(tg.message_update(PRIVATE, f"read {name}", user_id=PRIVATE, media={"document": document}))


def notices(tg: FakeTelegram) -> list[str]:
    return [t for t in texts(tg, PRIVATE) if t.startswith("⚠️") and "could not be read" in t]


async def test_every_hostile_file_ends_in_a_note_and_a_notice_and_the_gateway_goes_on(store, llm, tg, tmp_path):
    llm.responder = echo
    updates = {}
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        for name, mime, make, _reason in CORPUS:
            updates[name] = send_document(tg, make(), name, mime)
            await settle(gateway, lambda name=name: any(name in t for t in notices(tg)))
        tg.private_message(OTHER, "still there?")
        await settle(gateway, lambda: texts(tg, OTHER))
        assert texts(tg, OTHER) == ["re: still there?"]  # the loop and the workers are alive
        assert await store.inbox.count_pending() == 0
    model_saw = "\n".join(text_of(user_message(r)) for r in llm.requests)
    for name, _mime, _make, reason in CORPUS:
        [notice] = [t for t in notices(tg) if name in t]
        assert "\n" not in notice and "that file could not be read: " in notice and reason in notice, notice
        item = await store.inbox.get_by_event(f"tg:{BOT_ID}:{updates[name]['update_id']}")
        assert item is not None and item.status == "done"
        [entry] = item.payload["attachments"]
        assert reason in entry["outcome"]["error"] and entry["outcome"]["status"] == "saved"
        assert f'"{name}" saved at' in model_saw
    assert model_saw.count("[that file could not be read: ") == len(CORPUS)
    # No image part was made of the bomb or the truncated JPEG.
    assert not any(
        isinstance(m.get("content"), list) and any(p.get("type") == "image_url" for p in m["content"])
        for r in llm.requests
        for m in r["messages"]
    )


async def test_a_pdf_killed_for_its_limits_is_not_parsed_again_after_a_restart(store, llm, tg, tmp_path):
    llm.responder = echo
    settings = config(llm, tg, tmp_path)
    async with running(store, settings) as gateway:
        update = send_document(tg, shared_stream_pdf(), "shared-stream.pdf", "application/pdf")
        await settle(gateway, lambda: notices(tg))
    item = await store.inbox.get_by_event(f"tg:{BOT_ID}:{update['update_id']}")
    assert item is not None and item.status == "done"
    assert "CPU time" in item.payload["attachments"][0]["outcome"]["error"]
    downloads, requests = len(tg.files.download_attempts), len(llm.requests)
    async with running(store, settings) as gateway:
        tg.private_message(PRIVATE, "and now?")
        await settle(gateway, lambda: "re: and now?" in texts(tg, PRIVATE))
    assert len(tg.files.download_attempts) == downloads  # neither fetched nor read again
    assert len(llm.requests) == requests + 1
    assert len(notices(tg)) == 1


@pytest.mark.parametrize("pages, read", [(3, 3), (5, 2)])
async def test_only_the_first_pdf_max_pages_are_read(store, llm, tg, tmp_path, pages, read):
    from media import pdf_bytes

    llm.responder = echo
    async with running(store, config(llm, tg, tmp_path, pdf_max_pages=2 if pages == 5 else 10)) as gateway:
        send_document(tg, pdf_bytes(*(f"page {n}" for n in range(1, pages + 1))), "long.pdf", "application/pdf")
        await settle(gateway, lambda: texts(tg, PRIVATE))
    text = text_of(user_message(llm.requests[0]))
    assert all(f"page {n}" in text for n in range(1, read + 1))
    assert f"page {read + 1}" not in text
    assert (f"only the first {read} of {pages} pages were read" in text) is (read < pages)
    assert notices(tg) == []
