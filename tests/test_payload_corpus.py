"""Real payloads through both ingest paths of each channel: every Telegram update kind through
long polling and the webhook, every Slack body through the Events API and Socket Mode. Each
one becomes an event, or is ignored with a logged reason, or is refused with a reply; none
raises (tests/payloads/README.md says where they come from)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from fakes.slack import channel_harness
from fakes.telegram import FakeTelegram
from fakes.telegram_core import RecordingCore
from test_telegram_ingest import SECRET, ingest

from channels.telegram import TelegramChannel
from channels.telegram.inbound import ALLOWED_UPDATES
from gateway.config import TelegramConfig

PAYLOADS = Path(__file__).parent / "payloads"
TELEGRAM = json.loads((PAYLOADS / "telegram_updates.json").read_text())
SLACK = json.loads((PAYLOADS / "slack_events.json").read_text())
INTERACTIVE = {
    "block_actions", "block_suggestion", "dialog_cancellation", "dialog_submission", "dialog_suggestion",
    "interactive_message", "message_action", "shortcut", "view_closed", "view_submission", "workflow_step_edit",
}


@pytest.fixture
async def telegram():  # noqa: ANN201
    """(fake Bot API, recording core, start(**settings) -> a started channel)."""
    core, channels = RecordingCore(), []
    async with FakeTelegram() as fake:

        async def start(**settings: Any) -> TelegramChannel:
            config = TelegramConfig(token=fake.token, api_base_url=fake.base_url, poll_timeout_s=1, **settings)
            channels.append(TelegramChannel(config, core))
            await channels[-1].start(core.submit)
            return channels[-1]

        yield fake, core, start
        for channel in channels:
            await channel.stop()


def crashes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def telegram_outcomes(core, caplog: pytest.LogCaptureFixture) -> dict[int, str]:  # noqa: ANN001
    """update id -> "event" or the reason it was ignored (from the channel's log)."""
    found = {int(e.event_id.rsplit(":", 1)[1]): "event" for e in core.events}
    for record in caplog.records:
        message = record.getMessage()
        if record.name == "channels.telegram" and " ignored: " in message:
            update_id = int(message.split("update ", 1)[1].split(" ", 1)[0])
            found.setdefault(update_id, message.split(" ignored: ", 1)[1])
    return found


async def test_every_telegram_update_kind_through_long_polling(telegram, caplog) -> None:
    fake, core, start = telegram
    caplog.set_level(logging.DEBUG, "channels.telegram")
    channel = await start()
    asked = [e for e in TELEGRAM if set(e["update"]) & set(ALLOWED_UPDATES)]  # Telegram drops the other kinds
    for entry in asked:
        fake.enqueue(entry["update"])
    await ingest(channel, core, fake)
    assert crashes(caplog) == []
    outcomes = telegram_outcomes(core, caplog)
    missing = [e["name"] for e in asked if e["update"]["update_id"] not in outcomes]
    assert missing == []
    assert all(reason and reason != "unreadable" for reason in outcomes.values()), outcomes
    assert {"event"} < set(outcomes.values())  # some became events, the others say why not


async def test_every_telegram_update_kind_through_the_webhook(telegram, caplog) -> None:
    fake, core, start = telegram
    caplog.set_level(logging.DEBUG, "channels.telegram")
    channel = await start(mode="webhook", webhook_secret=SECRET, webhook_url="https://gw.example/telegram/webhook")
    app = web.Application()
    for method, path, handler in channel.routes():
        app.router.add_route(method, path, handler)
    async with TestServer(app) as server, aiohttp.ClientSession() as http:
        url = str(server.make_url("/telegram/webhook"))
        for entry in TELEGRAM:
            headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
            async with http.post(url, json=entry["update"], headers=headers) as response:
                assert response.status == 200, entry["name"]
    assert crashes(caplog) == []
    outcomes = telegram_outcomes(core, caplog)
    assert [e["name"] for e in TELEGRAM if e["update"]["update_id"] not in outcomes] == []


def slack_body(entry: dict[str, Any]) -> tuple[str, str]:
    payload = entry["payload"]
    if payload.get("type") in INTERACTIVE:
        return urlencode({"payload": json.dumps(payload)}), "application/x-www-form-urlencoded"
    return json.dumps(payload), "application/json"


def slack_outcome(h, caplog: pytest.LogCaptureFixture, before: tuple[int, int, int]) -> str:  # noqa: ANN001
    """What became of the body just delivered: an event, a refusal, or the logged reason."""
    submitted, records, refusals = before
    if len(h.submit.calls) > submitted:  # an event (stored once per event id: a repeat is a no-op)
        return "event"
    if len(h.fake.calls_to("chat.postEphemeral")) > refusals:
        return "refused"
    said = [r.getMessage() for r in caplog.records[records:] if " ignored" in r.getMessage()]
    return said[0] if said else ""


def counts(h, caplog: pytest.LogCaptureFixture) -> tuple[int, int, int]:  # noqa: ANN001
    return len(h.submit.calls), len(caplog.records), len(h.fake.calls_to("chat.postEphemeral"))


async def test_every_slack_body_through_the_events_api(caplog) -> None:
    caplog.set_level(logging.DEBUG, "channels.slack")
    outcomes = {}
    async with channel_harness() as h:
        for entry in SLACK:
            body, content_type = slack_body(entry)
            before = counts(h, caplog)
            reply = await h.events.post(body, content_type=content_type)
            assert reply.status == 200, (entry["name"], reply)
            if entry["payload"].get("type") == "url_verification":  # answered by the library itself
                assert entry["payload"]["challenge"] in reply.text
                continue
            await asyncio.sleep(0.05)  # a refusal is sent just after the ack
            outcomes[entry["name"]] = slack_outcome(h, caplog, before)
    assert crashes(caplog) == []
    assert [name for name, outcome in outcomes.items() if not outcome] == []


async def test_every_slack_body_through_socket_mode(caplog) -> None:
    caplog.set_level(logging.DEBUG, "channels.slack")
    async with channel_harness(app_token="xapp-test", signing_secret="") as h:
        await h.fake.wait_socket()
        for entry in SLACK:
            payload = entry["payload"]
            kind = "interactive" if payload.get("type") in INTERACTIVE else "events_api"
            before = counts(h, caplog)
            envelope_id = await h.fake.push_envelope(kind, payload)
            try:
                await asyncio.wait_for(h.fake.wait_ack(envelope_id), 10)
            except TimeoutError:
                raise AssertionError(f"{entry['name']} was never acknowledged") from None
            await asyncio.sleep(0.05)
            if payload.get("type") != "url_verification":
                assert slack_outcome(h, caplog, before), entry["name"]
    assert crashes(caplog) == []
