"""Socket Mode wiring: apps.connections.open, a websocket from the fake, envelopes acked after
the event is committed."""

from __future__ import annotations

import asyncio

import pytest
from fakes.slack import FakeSlack, MemoryState, RecordingSubmit, channel_harness, slack_config

from channels.slack.channel import SlackChannel
from gateway.events import ButtonPress, ChannelError, ThreadKey


async def test_events_arrive_over_the_socket_and_are_acked_after_submit() -> None:
    async with channel_harness(app_token="xapp-test", signing_secret="") as h:
        await h.fake.wait_socket()
        [opened] = h.fake.calls_to("apps.connections.open")
        assert opened.token == "xapp-test"

        event = h.events.mention("C1", "U1", "<@UBOT> over the socket")
        envelope_id = await h.fake.push_envelope("events_api", h.events.envelope(event))
        ack = await h.fake.wait_ack(envelope_id)

        assert ack == {"envelope_id": envelope_id}
        [message] = h.submit.events
        assert message.thread == ThreadKey("slack", "C1", event["ts"])
        assert message.text == "over the socket"


async def test_interactive_envelopes_become_button_presses() -> None:
    async with channel_harness(app_token="xapp-test") as h:
        await h.fake.wait_socket()
        root = h.events.next_ts()
        payload = h.events.block_actions(user="U1", channel="C1", message_ts=h.events.next_ts(), thread_ts=root,
                                         value="tok-1")
        envelope_id = await h.fake.push_envelope("interactive", payload)
        await h.fake.wait_ack(envelope_id)

        [press] = h.submit.events
        assert isinstance(press, ButtonPress) and press.token == "tok-1"
        assert press.thread == ThreadKey("slack", "C1", root)


async def test_an_event_that_could_not_be_committed_is_not_acked() -> None:
    async with channel_harness(app_token="xapp-test") as h:
        await h.fake.wait_socket()
        h.submit.failure = RuntimeError("database is down")
        envelope_id = await h.fake.push_envelope(
            "events_api", h.events.envelope(h.events.mention("C1", "U1", "<@UBOT> x"))
        )
        for _ in range(100):
            if h.submit.calls:
                break
            await asyncio.sleep(0.02)
        assert len(h.submit.calls) == 1
        await asyncio.sleep(0.2)  # give a wrong ack the chance to arrive
        assert all(a.get("envelope_id") != envelope_id for a in h.fake.acks)


async def test_a_bad_app_token_fails_start_clearly() -> None:
    async with FakeSlack() as fake:
        channel = SlackChannel(slack_config(fake, app_token="xapp-wrong"), MemoryState())
        with pytest.raises(ChannelError) as caught:
            await channel.start(RecordingSubmit())
        await channel.stop()
        assert "invalid_auth" in str(caught.value)
