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

import asyncio
import os
import sys
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
from test_attachments_restart import settings
from test_chat_cli import REPO, child_env
from test_serve import free_port
from test_telegram_e2e import PRIVATE, running, settle, texts, tg_config

from gateway.attachments.documents import PdfLimits, pdf_text
from gateway.attachments.images import ImageParts, data_url
from gateway.config import Config
from gateway.store import Store

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
        attachments={"download_backoff_s": 0.01, "pdf_cpu_s": 1, "pdf_timeout_s": 60, **attachments},
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
    assert f"page {read + 1}" not in text, text
    assert (f"only the first {read} of {pages} pages were read" in text) is (read < pages)
    assert notices(tg) == []


async def test_a_pdf_whose_reading_is_cut_short_twice_by_kill_9_is_not_read_a_third_time(
    llm, tg, tmp_path, database_url  # noqa: F811 - the fixture
):
    """`gateway serve` is killed (SIGKILL) while its PDF child reads, twice; the third start
    records the file as unreadable instead of starting the same parse again."""
    import yaml

    values = settings(llm, tg, tmp_path, database_url, free_port())
    # Limits high enough that the parse is still running when the gateway is killed.
    values["attachments"] = {**values["attachments"], "pdf_cpu_s": 120, "pdf_timeout_s": 120}
    config_path = tmp_path / "config.yml"
    on_disk = {**values, "telegram": {**values["telegram"], "token": "${TELEGRAM_BOT_TOKEN}"}}
    config_path.write_text(yaml.safe_dump(on_disk))
    update = send_document(tg, shared_stream_pdf(pages=40, operators=60_000), "slow.pdf", "application/pdf")
    event = f"tg:{BOT_ID}:{update['update_id']}"
    store = Store(database_url)
    try:
        for reads in (1, 2):
            await _serve_until_reading(config_path, tg, store, event, reads)
        item = await store.inbox.get_by_event(event)
        assert item is not None and item.status == "pending" and "outcome" not in item.payload["attachments"][0]
        llm.responder = echo
        config = make_config(
            llm.base_url, values["agent"]["workspace"], **{k: v for k, v in values.items() if k != "llm"}
        )
        async with running(store, config) as gateway:
            await settle(gateway, lambda: notices(tg))
        [notice] = notices(tg)
        assert "slow.pdf" in notice and "cut short 2 times" in notice
        done = await store.inbox.get_by_event(event)
        assert done is not None and done.status == "done"
        assert done.payload["attachments"][0]["reads"] == 2  # no third read was started
    finally:
        await store.close()


async def _serve_until_reading(config_path: Path, tg: FakeTelegram, store: Store, event: str, reads: int) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config_path),
        cwd=str(REPO), env={**child_env(), "TELEGRAM_BOT_TOKEN": tg.token},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        for _ in range(1200):  # up to a minute on a loaded machine
            assert process.returncode is None, "gateway serve exited"
            try:
                item = await store.inbox.get_by_event(event)
            except Exception:  # noqa: BLE001 - the process has not created its tables yet
                item = None
            if item is not None and item.payload.get("attachments", [{}])[0].get("reads") == reads:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"the gateway never started reading the PDF (read {reads})")
    finally:
        if process.returncode is None:
            process.kill()  # SIGKILL: no shutdown, no cleanup
        await process.wait()


async def test_a_pdf_that_inflates_past_the_memory_limit_ends_its_child_not_the_gateway():
    bomb = shared_stream_pdf(pages=1, operators=1_500_000)  # 160 KB that inflate to 55 MB
    found = await pdf_text(bomb, 1000, PdfLimits(memory_mb=100, cpu_s=60, timeout_s=60))
    assert found.text == "" and found.error == "reading it needed more than 100 MB of memory"
    readable = await pdf_text(shared_stream_pdf(pages=1, operators=10), 1000, PdfLimits(memory_mb=100))
    assert readable.error == "" and "x" in readable.text  # the same reader, under the same limit, reads a small one


async def test_image_parts_are_encoded_by_warm_so_rendering_on_the_loop_decodes_nothing(tmp_path):
    from media import image_bytes

    picture = tmp_path / "attachments" / "1" / "big.jpg"
    picture.parent.mkdir(parents=True)
    picture.write_bytes(image_bytes(1200, 900))
    record = {"path": "attachments/1/big.jpg", "mime": "image/jpeg", "width": 1200, "height": 900}
    parts = ImageParts(tmp_path, 512, 4)
    await parts.warm([record])
    stamp = picture.stat()
    picture.write_bytes(b"not an image any more")  # a decode now would fail...
    os.utime(picture, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    made = parts(record)  # ...but the render uses what warm encoded in its thread
    assert made is not None and made[0]["image_url"]["url"].startswith("data:image/jpeg;base64,")


def test_an_image_over_the_pixel_limit_is_not_decoded_for_the_model(tmp_path):
    path = tmp_path / "bomb.png"
    path.write_bytes(bomb_png(3000, 3000))
    assert data_url(path, "image/png", 512, max_pixels=8_000_000) is None
    assert data_url(path, "image/png", 512, max_pixels=10_000_000) is not None
