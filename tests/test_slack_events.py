"""Inbound Slack: signed Events API and interactivity requests through the real bolt app."""

from __future__ import annotations

import asyncio
import json

from fakes.slack import channel_harness

from channels.slack.api import NAME_LOOKUP_TIMEOUT_S, NAME_RETRY_AFTER_S
from gateway.events import ButtonPress, Channel, InboundMessage, SubmitResult, ThreadKey


async def test_the_channel_implements_the_protocol_and_serves_one_route() -> None:
    async with channel_harness() as h:
        assert isinstance(h.channel, Channel) and h.channel.name == "slack"
        assert [(method, path) for method, path, _ in h.channel.routes()] == [("POST", "/slack/events")]


async def test_mention_starts_a_thread_on_the_mention_ts() -> None:
    async with channel_harness() as h:
        event = h.events.mention("C1", "U1", "<@UBOT> what is &lt;b&gt; &amp; co?")
        reply = await h.events.event(event)

        assert reply.status == 200
        [message] = h.submit.events
        assert isinstance(message, InboundMessage)
        assert message.thread == ThreadKey("slack", "C1", event["ts"])
        assert message.text == "what is <b> & co?"
        assert message.event_id == f"slack:C1:{event['ts']}"
        assert message.message_id == event["ts"]
        assert message.sender.id == "U1" and message.sender.name == "Ann" and message.sender.username == "ann"


async def test_mention_inside_a_thread_uses_the_thread_ts() -> None:
    async with channel_harness() as h:
        root = h.events.next_ts()
        await h.events.event(h.events.mention("C1", "U2", "<@UBOT> and this?", thread_ts=root))

        [message] = h.submit.events
        assert message.thread == ThreadKey("slack", "C1", root)
        assert message.sender.name == "Bob"


async def test_follow_up_without_mention_continues_a_known_thread() -> None:
    async with channel_harness() as h:
        mention = h.events.mention("C1", "U1", "<@UBOT> start")
        await h.events.event(mention)
        follow = h.events.message("C1", "U1", "and one more thing", thread_ts=mention["ts"])
        reply = await h.events.event(follow)

        assert reply.status == 200
        assert [m.text for m in h.submit.events] == ["start", "and one more thing"]
        assert h.submit.events[1].thread == ThreadKey("slack", "C1", mention["ts"])


async def test_follow_up_in_an_unknown_thread_is_ignored() -> None:
    async with channel_harness() as h:
        reply = await h.events.event(h.events.message("C1", "U1", "chatting", thread_ts=h.events.next_ts()))
        assert reply.status == 200
        assert h.submit.events == []


async def test_follow_ups_can_be_switched_off() -> None:
    async with channel_harness(thread_followups=False) as h:
        mention = h.events.mention("C1", "U1", "<@UBOT> start")
        await h.events.event(mention)
        await h.events.event(h.events.message("C1", "U1", "no mention", thread_ts=mention["ts"]))
        assert [m.text for m in h.submit.events] == ["start"]


async def test_top_level_chatter_is_ignored() -> None:
    async with channel_harness() as h:
        reply = await h.events.event(h.events.message("C1", "U1", "lunch anyone?"))
        assert reply.status == 200
        assert h.submit.calls == []


async def test_dm_is_one_session_per_dm_and_per_thread_when_threaded() -> None:
    async with channel_harness() as h:
        await h.events.event(h.events.dm("D1", "U1", "hi"))
        await h.events.event(h.events.dm("D1", "U1", "again"))
        root = h.events.next_ts()
        await h.events.event(h.events.dm("D1", "U1", "in a thread", thread_ts=root))

        threads = [m.thread for m in h.submit.events]
        assert threads == [ThreadKey("slack", "D1", ""), ThreadKey("slack", "D1", ""), ThreadKey("slack", "D1", root)]


async def test_retry_of_the_same_event_carries_the_same_event_id() -> None:
    async with channel_harness() as h:
        event = h.events.mention("C1", "U1", "<@UBOT> once")
        first = await h.events.event(event, event_id="Ev1")
        again = await h.events.event(event, event_id="Ev1", retry_num=1)

        assert first.status == again.status == 200  # a retry is accepted, never dropped unseen
        assert [[e.event_id for e in call] for call in h.submit.calls] == [[f"slack:C1:{event['ts']}"]] * 2
        assert len(h.submit.events) == 1


async def test_app_mention_and_message_for_one_mention_collapse() -> None:
    async with channel_harness() as h:
        ts = h.events.next_ts()
        await h.events.event(h.events.mention("C1", "U1", "<@UBOT> hello", ts=ts), event_id="EvA")
        await h.events.event(h.events.message("C1", "U1", "<@UBOT> hello", ts=ts), event_id="EvB")

        ids = [call[0].event_id for call in h.submit.calls]
        assert ids == [f"slack:C1:{ts}", f"slack:C1:{ts}"]
        assert len(h.submit.events) == 1


async def test_own_bot_and_edited_or_deleted_messages_are_ignored() -> None:
    async with channel_harness() as h:
        mention = h.events.mention("C1", "U1", "<@UBOT> start")
        await h.events.event(mention)
        thread = mention["ts"]
        ignored = [
            h.events.message("C1", "UBOT", "my own reply", thread_ts=thread),
            h.events.message("C1", None, "a bot", thread_ts=thread, subtype="bot_message", bot_id="B9"),
            h.events.message("C1", "U1", "x", thread_ts=thread, subtype="message_changed"),
            h.events.message("C1", None, "x", thread_ts=thread, subtype="message_deleted"),
            h.events.message("C1", "U9", "via our bot id", thread_ts=thread, bot_id="BBOT"),
        ]
        for event in ignored:
            assert (await h.events.event(event)).status == 200
        assert [m.text for m in h.submit.events] == ["start"]


async def test_bad_stale_and_missing_signatures_are_refused() -> None:
    async with channel_harness() as h:
        event = h.events.mention("C1", "U1", "<@UBOT> forged")
        for forge in ("bad", "stale", "missing"):
            reply = await h.events.event(event, forge=forge)
            assert reply.status == 401, forge
        assert h.submit.calls == []


async def test_without_a_signing_secret_nothing_is_accepted_over_http() -> None:
    async with channel_harness(signing_secret="") as h:
        reply = await h.events.event(h.events.mention("C1", "U1", "<@UBOT> hi"))
        assert reply.status == 401
        assert h.submit.calls == []


async def test_url_verification_answers_the_challenge() -> None:
    async with channel_harness() as h:
        reply = await h.events.url_verification("3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P")
        assert reply.status == 200
        assert reply.json() == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}
        assert (await h.events.url_verification("x", forge="bad")).status == 401


async def test_malformed_bodies_get_400() -> None:
    async with channel_harness() as h:
        for body, content_type in (
            ("{not json", "application/json"),
            ("payload=%7Bbroken", "application/x-www-form-urlencoded"),
            ("", "application/json"),
            ("[1, 2]", "application/json"),
        ):
            reply = await h.events.post(body, content_type=content_type)
            assert reply.status == 400, body
        assert h.submit.calls == []


async def test_a_failing_submit_is_not_acknowledged() -> None:
    async with channel_harness() as h:
        h.submit.failure = RuntimeError("database is down")
        reply = await h.events.event(h.events.mention("C1", "U1", "<@UBOT> hello"))
        assert reply.status == 500  # Slack will deliver it again
        h.submit.failure = None
        assert h.submit.events == []


async def test_users_not_allowed_get_an_ephemeral_refusal_and_no_submit() -> None:
    async with channel_harness(allowed_users=["U1"]) as h:
        event = h.events.mention("C1", "U2", "<@UBOT> let me in")
        reply = await h.events.event(event)

        assert reply.status == 200
        assert h.submit.calls == []
        [call] = await h.fake.wait_for_call("chat.postEphemeral")
        assert call.params["user"] == "U2" and call.params["channel"] == "C1"
        assert call.params["thread_ts"] == event["ts"]
        assert "not allowed" in call.params["text"]


async def test_channels_not_allowed_are_refused_but_dms_are_not() -> None:
    async with channel_harness(allowed_channels=["C1"]) as h:
        await h.events.event(h.events.mention("C2", "U1", "<@UBOT> here?"))
        await h.events.event(h.events.dm("D7", "U1", "private"))

        [call] = await h.fake.wait_for_call("chat.postEphemeral")
        assert call.params["channel"] == "C2" and "not enabled in this channel" in call.params["text"]
        assert [m.thread.chat for m in h.submit.events] == ["D7"]


async def test_thread_chatter_by_someone_not_allowed_is_refused_once() -> None:
    async with channel_harness(allowed_users=["U1"]) as h:
        mention = h.events.mention("C1", "U1", "<@UBOT> start")
        await h.events.event(mention)
        for text in ("one", "two", "three"):
            await h.events.event(h.events.message("C1", "U2", text, thread_ts=mention["ts"]))
        await h.fake.wait_for_call("chat.postEphemeral")
        await h.channel.stop()  # waits for background notes

        assert len(h.fake.ephemerals) == 1
        assert [m.text for m in h.submit.events] == ["start"]


async def test_files_become_attachments_with_their_urls() -> None:
    async with channel_harness() as h:
        files = [
            {
                "id": "F1",
                "name": "plot.png",
                "mimetype": "image/png",
                "size": 2048,
                "original_w": 640,
                "original_h": 480,
                "url_private": "https://files.slack.com/files-pri/T1-F1/plot.png",
            },
            {
                "id": "F2",
                "name": "notes.txt",
                "mimetype": "text/plain",
                "size": 12,
                "url_private_download": "https://files.slack.com/files-pri/T1-F2/download/notes.txt",
            },
            {"id": "F3", "mode": "hosted", "file_access": "check_file_info"},  # still processing
            {"id": "F4", "mode": "tombstone"},  # deleted
        ]
        event = h.events.message("D1", "U1", "have a look", channel_type="im", subtype="file_share", files=files)
        await h.events.event(event)

        [message] = h.submit.events
        assert [(a.kind, a.file_id, a.name, a.mime, a.size, a.width, a.height) for a in message.attachments] == [
            ("photo", "F1", "plot.png", "image/png", 2048, 640, 480),
            ("document", "F2", "notes.txt", "text/plain", 12, 0, 0),
            ("document", "F3", "", "", 0, 0, 0),
        ]
        assert [a.url for a in message.attachments] == [
            "https://files.slack.com/files-pri/T1-F1/plot.png",
            "https://files.slack.com/files-pri/T1-F2/download/notes.txt",
            "",
        ]
        assert message.text == "have a look"  # the core says what the files are once it has them


async def test_unknown_user_names_fall_back_to_the_id() -> None:
    async with channel_harness() as h:
        await h.events.event(h.events.dm("D1", "U404", "who am I"))
        [message] = h.submit.events
        assert message.sender.id == "U404" and message.sender.name == ""


async def test_block_action_becomes_a_button_press_in_the_prompt_thread() -> None:
    async with channel_harness() as h:
        root, prompt_ts = h.events.next_ts(), h.events.next_ts()
        reply = await h.events.block_action(
            user="U1",
            channel="C1",
            message_ts=prompt_ts,
            thread_ts=root,
            value="tok-approve",
            action_ts="1700000000.123456",
        )
        assert reply.status == 200
        [press] = h.submit.events
        assert isinstance(press, ButtonPress)
        assert press.thread == ThreadKey("slack", "C1", root)
        assert press.token == "tok-approve"
        assert press.message_id == prompt_ts
        assert press.event_id == "slack:action:1700000000.123456"
        assert press.sender.name == "Ann"
        await h.channel.stop()
        assert h.fake.ephemerals == []  # a plain success needs no note


async def test_block_action_alert_is_shown_to_the_tapper_only() -> None:
    async with channel_harness() as h:
        h.submit.answers["tok-foreign"] = SubmitResult("x", answer="You can't decide this request.", alert=True)
        root = h.events.next_ts()
        await h.events.block_action(
            user="U2", channel="C1", message_ts=h.events.next_ts(), thread_ts=root, value="tok-foreign"
        )
        [call] = await h.fake.wait_for_call("chat.postEphemeral")
        assert call.params == {
            "channel": "C1",
            "user": "U2",
            "text": "You can't decide this request.",
            "thread_ts": root,
        }


async def test_block_action_on_a_dm_prompt_and_forged_actions() -> None:
    async with channel_harness() as h:
        await h.events.block_action(user="U1", channel="D1", message_ts=h.events.next_ts(), value="t1")
        assert h.submit.events[0].thread == ThreadKey("slack", "D1", "")
        forged = await h.events.block_action(user="U1", channel="D1", message_ts="1.0", value="t2", forge="bad")
        assert forged.status == 401
        assert [e.token for e in h.submit.events] == ["t1"]


async def test_foreign_buttons_are_acknowledged_without_submit() -> None:
    async with channel_harness() as h:
        payload = h.events.block_actions(user="U1", channel="C1", message_ts="1.0", value="v")
        payload["actions"][0]["action_id"] = "gw:0:0"
        payload["actions"][0]["value"] = ""
        from urllib.parse import urlencode

        reply = await h.events.post(
            urlencode({"payload": json.dumps(payload)}), content_type="application/x-www-form-urlencoded"
        )
        assert reply.status == 200
        assert h.submit.calls == []


async def test_a_slow_name_lookup_never_holds_the_ack_and_names_the_next_event() -> None:
    async with channel_harness() as h:
        h.fake.slow_down("users.info", NAME_LOOKUP_TIMEOUT_S + 0.5)  # past the lookup's budget before the ack
        reply = await h.events.block_action(user="U1", channel="C1", message_ts=h.events.next_ts(), value="tok")
        assert reply.status == 200
        [press] = h.submit.events
        assert press.sender.name == "ann"  # the username Slack put in the payload, for now
        await asyncio.sleep(2.0)   # the lookup answers 0.5 s after the ack; a margin for load
        await h.events.event(h.events.dm("D1", "U1", "hello"))
        assert h.submit.events[-1].sender.name == "Ann"
        assert len(h.fake.calls_to("users.info")) == 1


async def test_a_failed_name_lookup_is_asked_again_later_not_pinned_until_a_restart() -> None:
    async with channel_harness() as h:
        h.fake.fail_always("users.info", "ratelimited")
        await h.events.event(h.events.dm("D1", "U1", "one"))
        h.fake.heal("users.info")
        await h.events.event(h.events.dm("D1", "U1", "two"))
        assert [e.sender.name for e in h.submit.events] == ["", ""]
        assert len(h.fake.calls_to("users.info")) == 1  # not asked on every event while it fails
        h.clock.advance(NAME_RETRY_AFTER_S)
        await h.events.event(h.events.dm("D1", "U1", "three"))
        assert h.submit.events[-1].sender.name == "Ann"
