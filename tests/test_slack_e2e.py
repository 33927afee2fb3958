"""Slack end to end: SlackEventSender -> the gateway's /slack/events (real bolt app) -> inbox ->
turn -> FakeLLM, and replies through the real slack_sdk client to FakeSlack.

Every test runs the whole gateway (HTTP server, SlackChannel, inbox, turns, prompts, outbox)
on SQLite and PostgreSQL. People's messages are also written into FakeSlack, as Slack holds
them, so reactions and thread reads find them.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import pytest
from fakes.llm import FakeLLM, Reply, user_texts
from fakes.slack import SIGNING_SECRET, FakeSlack, SlackEventSender
from fakes.slack import Reply as HttpReply
from harness import make_config
from helpers import echo, every_api, session_file, tool_results, until

from gateway.app import Gateway
from gateway.approvals.routing import REQUESTERS
from gateway.config import Config
from gateway.llm import LLMClient
from gateway.store import Store

CHANNEL, DM = "C1", "D1"
ANN, BOB = "U1", "U2"  # FakeSlack knows them as Ann and Bob
POSTS = ("chat.postMessage", "chat.startStream", "chat.postEphemeral")



def slack_config(
    llm: FakeLLM,
    slack: FakeSlack,
    tmp_path,
    settings: dict[str, Any] | None = None,
    llm_settings: dict[str, Any] | None = None,
    **sections: Any,
) -> Config:
    values = {"bot_token": slack.token, "signing_secret": SIGNING_SECRET, "api_base_url": slack.base_url,
              "send_interval_s": 0, "stream_interval_s": 0, **(settings or {})}
    sections = {**sections, "llm": {**llm.settings, **(llm_settings or {})}}
    return make_config(llm.base_url, str(tmp_path / "ws"), slack=values, http={"port": 0}, **sections)


@dataclass
class Slackside:
    """A running gateway and the people talking to it through Slack."""

    gateway: Gateway
    fake: FakeSlack
    sender: SlackEventSender

    async def post(self, event: dict[str, Any], **options: Any) -> HttpReply:
        reply = await self.sender.event(event, **options)
        assert reply.status == 200, reply.text
        return reply

    def written(self, channel: str, user: str, text: str, thread_ts: str | None = None) -> str:
        """A message as Slack holds it (its ts is what events and reactions refer to)."""
        return self.fake.post_as_user(channel, user, text, thread_ts)["ts"]

    async def mention(
        self, text: str, *, user: str = ANN, thread_ts: str | None = None, **options: Any
    ) -> dict[str, Any]:
        ts = self.written(CHANNEL, user, f"<@UBOT> {text}", thread_ts)
        event = self.sender.mention(CHANNEL, user, f"<@UBOT> {text}", ts=ts, thread_ts=thread_ts)
        await self.post(event, **options)
        return event

    async def say_in_thread(self, thread_ts: str, text: str, *, user: str = ANN) -> dict[str, Any]:
        ts = self.written(CHANNEL, user, text, thread_ts)
        event = self.sender.message(CHANNEL, user, text, ts=ts, thread_ts=thread_ts)
        await self.post(event)
        return event

    async def dm(self, text: str, *, user: str = ANN) -> dict[str, Any]:
        event = self.sender.dm(DM, user, text, ts=self.written(DM, user, text))
        await self.post(event)
        return event

    async def click(self, prompt: dict[str, Any], label: str, *, user: str = ANN, channel: str = CHANNEL) -> HttpReply:
        button = next(b for b in buttons(prompt) if label in b["text"]["text"])
        reply = await self.sender.block_action(
            user=user,
            channel=channel,
            message_ts=prompt["ts"],
            value=button["value"],
            thread_ts=prompt.get("thread_ts"),
            action_id=button["action_id"],
        )
        assert reply.status == 200, reply.text
        return reply

    async def settle(self, condition: Callable[[], bool]) -> None:
        """Wait for something visible in Slack, then for the gateway to have nothing left to do."""
        await until(condition)
        await self.gateway.inbox.wait_until_idle(10)


@contextlib.asynccontextmanager
async def running(store: Store, config: Config, slack: FakeSlack) -> AsyncIterator[Slackside]:
    llm = LLMClient(config.llm, backoff_base_s=0.01)
    gateway = Gateway(config, store=store, llm=llm, serve_http=True)
    await gateway.start()
    try:
        assert gateway.http is not None and gateway.http.port
        url = f"http://127.0.0.1:{gateway.http.port}/slack/events"
        async with SlackEventSender(url, SIGNING_SECRET, team_id=slack.team_id) as sender:
            yield Slackside(gateway, slack, sender)
    finally:
        await gateway.stop()
        await llm.aclose()


# ---- views of Slack ---------------------------------------------------------------------


def bot_messages(slack: FakeSlack, channel: str = CHANNEL) -> list[dict[str, Any]]:
    return [m for m in slack.messages.get(channel, []) if m.get("user") == slack.bot_user_id]


def texts(slack: FakeSlack, channel: str = CHANNEL) -> list[str]:
    """The agent's answers (not its prompts: an answer's only blocks are its feedback buttons)."""
    return [
        m.get("text", "") for m in bot_messages(slack, channel)
        if all(b.get("block_id") == "gw_feedback" for b in m.get("blocks") or [])
    ]


def buttons(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for b in message.get("blocks") or [] if b["type"] == "actions" for e in b["elements"]]


def prompt_message(slack: FakeSlack, channel: str = CHANNEL) -> dict[str, Any]:
    """A snapshot of the prompt as first shown (the fake updates its copy in place)."""
    return copy.deepcopy(next(m for m in bot_messages(slack, channel) if buttons(m)))


def has_prompt(slack: FakeSlack, channel: str = CHANNEL) -> bool:
    return any(buttons(m) for m in bot_messages(slack, channel))


def outcome(message: dict[str, Any]) -> str:
    return " ".join(
        e["text"] for b in message.get("blocks") or [] if b.get("block_id") == "gw_outcome" for e in b["elements"]
    )


def ephemerals(slack: FakeSlack) -> list[tuple[str, str]]:
    return [(e["user"], e["text"]) for e in slack.ephemerals]


def answered(slack: FakeSlack, text: str) -> bool:
    """A bot message holding `text` whose stream (if any) has stopped."""
    return any(m.get("text") == text and not m.get("streaming") for m in bot_messages(slack))


def assert_threaded(slack: FakeSlack, thread_ts: str, channel: str = CHANNEL) -> None:
    """Nothing the gateway posted into the channel went to its top level."""
    posted = [c for c in slack.calls if c.method in POSTS and c.params.get("channel") == channel]
    assert posted, "nothing was posted"
    assert all(c.params.get("thread_ts") == thread_ts for c in posted), [
        (c.method, c.params.get("thread_ts")) for c in posted
    ]
    assert [m for m in slack.top_level(channel) if m.get("user") == slack.bot_user_id] == []


# ---- conversations ----------------------------------------------------------------------


@every_api
async def test_a_mention_is_answered_in_its_thread(store, llm, slack, tmp_path) -> None:
    llm.reply("Hello **there**")
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        mention = await s.mention("what is &lt;new&gt;?")
        await s.settle(lambda: bool(texts(slack)))
        (reply,) = bot_messages(slack)
        assert reply["thread_ts"] == mention["ts"] and reply["text"] == "Hello **there**"  # native: Slack renders
        assert_threaded(slack, mention["ts"])
        assert user_texts(llm.requests[0]) == ["what is <new>?"]
        item = await store.inbox.get_by_event(f"slack:{CHANNEL}:{mention['ts']}")
        assert item is not None and item.status == "done"
        assert [st["status"] for st in slack.statuses] == ["is thinking…", ""]  # presence on, then off
        assert {st["thread_ts"] for st in slack.statuses} == {mention["ts"]}
        run = (await store.runs.list())[0]
        assert (run.stage, run.end_reason) == ("SUCCESS", "reply")


async def test_a_follow_up_in_the_thread_continues_the_session_without_a_mention(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        mention = await s.mention("first question")
        await s.settle(lambda: len(texts(slack)) == 1)
        await s.say_in_thread(mention["ts"], "and a second one")
        await s.settle(lambda: len(texts(slack)) == 2)
        assert texts(slack) == ["re: first question", "re: and a second one"]
        assert user_texts(llm.requests[1]) == ["first question", "and a second one"]
        assert_threaded(slack, mention["ts"])
        assert len(await store.sessions.list()) == 1
        # Slack also reports the agent's own replies and edits in the thread: never answered.
        reply = bot_messages(slack)[0]
        own = s.sender.message(
            CHANNEL, slack.bot_user_id, reply["text"], ts=reply["ts"], thread_ts=mention["ts"], bot_id=slack.bot_id
        )
        edited = s.sender.message(CHANNEL, None, "", thread_ts=mention["ts"], subtype="message_changed",
                                  message={"user": ANN, "text": "and a second one!", "ts": mention["ts"]})
        for event in (own, edited):
            await s.post(event)
        await s.gateway.inbox.wait_until_idle(10)
        assert len(llm.requests) == 2 and len(texts(slack)) == 2


async def test_chatter_that_does_not_address_the_agent_is_ignored(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        top = s.sender.message(CHANNEL, ANN, "lunch anyone?", ts=s.written(CHANNEL, ANN, "lunch anyone?"))
        root = s.written(CHANNEL, BOB, "a thread the agent is not in")
        aside = s.sender.message(CHANNEL, BOB, "agreed", ts=s.written(CHANNEL, BOB, "agreed", root), thread_ts=root)
        own = s.sender.message(CHANNEL, slack.bot_user_id, "my own words", bot_id=slack.bot_id, thread_ts=root)
        for event in (top, aside, own):
            await s.post(event)
        await s.mention("are you there?")
        await s.settle(lambda: bool(texts(slack)))
        assert texts(slack) == ["re: are you there?"] and len(llm.requests) == 1
        assert user_texts(llm.requests[0]) == ["are you there?"]
        for event in (top, aside, own):
            assert await store.inbox.get_by_event(f"slack:{CHANNEL}:{event['ts']}") is None


async def test_a_dm_is_one_session_answered_in_the_dm(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        first = await s.dm("hello")
        await s.settle(lambda: len(texts(slack, DM)) == 1)
        await s.dm("again")
        await s.settle(lambda: len(texts(slack, DM)) == 2)
        assert texts(slack, DM) == ["re: hello", "re: again"]
        assert user_texts(llm.requests[1]) == ["hello", "again"]
        assert all(not m.get("thread_ts") for m in bot_messages(slack, DM))  # a DM without a thread
        # No thread to show a status in: 👀 on the message while working, removed after.
        added = [c.params for c in slack.calls_to("reactions.add")]
        assert added[0] == {"channel": DM, "timestamp": first["ts"], "name": "eyes"}
        assert len(slack.calls_to("reactions.remove")) == len(added) == 2 and slack.reactions == set()
        assert await store.sessions.current(f"slack:{DM}:") is not None


# ---- no duplicates ----------------------------------------------------------------------


async def test_a_retried_event_gets_one_reply(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        mention = await s.mention("only once", event_id="Ev0RETRY")
        await s.post(mention, event_id="Ev0RETRY", retry_num=1)  # Slack thought the first ack was lost
        await s.settle(lambda: bool(texts(slack)))
        await s.post(mention, event_id="Ev0RETRY", retry_num=2)  # and again, after the reply
        await s.gateway.inbox.wait_until_idle(10)
        assert texts(slack) == ["re: only once"] and len(llm.requests) == 1
        assert len(slack.calls_to("chat.startStream")) == 1


async def test_app_mention_and_message_for_one_mention_start_one_turn(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        mention = await s.mention("just one turn", event_id="Ev0MENTION")
        as_message = s.sender.message(CHANNEL, ANN, mention["text"], ts=mention["ts"])
        await s.post(as_message, event_id="Ev0MESSAGE")
        await s.settle(lambda: bool(texts(slack)))
        assert texts(slack) == ["re: just one turn"] and len(llm.requests) == 1
        assert len(await store.runs.list()) == 1


# ---- the HTTP edge ----------------------------------------------------------------------


async def test_forged_and_stale_signatures_get_401_and_nothing_is_stored(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        event = s.sender.mention(CHANNEL, ANN, "<@UBOT> let me in")
        for forge in ("bad", "stale", "missing"):
            assert (await s.sender.event(event, forge=forge)).status == 401, forge
        click = await s.sender.block_action(user=ANN, channel=CHANNEL, message_ts="1.0", value="x.a", forge="bad")
        assert click.status == 401
        await asyncio.sleep(0.1)  # a worker would have picked up anything stored by now
        assert await store.inbox.get_by_event(f"slack:{CHANNEL}:{event['ts']}") is None
        assert await store.inbox.count_pending() == 0 and not llm.requests
        assert not [c for c in slack.calls if c.method != "auth.test"]
        await s.post(event)  # the same event, correctly signed, is taken
        await s.settle(lambda: bool(texts(slack)))
        assert texts(slack) == ["re: let me in"]


async def test_url_verification_answers_the_challenge(store, llm, slack, tmp_path) -> None:
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        reply = await s.sender.url_verification("3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P")
        assert reply.status == 200
        assert reply.json() == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}
        assert (await s.sender.url_verification("x", forge="stale")).status == 401
        assert (await s.sender.post("{not json")).status == 400
        assert await store.inbox.count_pending() == 0


# ---- approvals --------------------------------------------------------------------------


async def ask_for_write(s: Slackside, llm: FakeLLM) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ann asks for a note; the model calls write_file; the approval prompt is shown."""
    llm.tool_call("write_file", {"path": "note.txt", "content": "hello"}, id="w1")
    llm.reply("Written.")
    mention = await s.mention("write a note")
    await s.settle(lambda: has_prompt(s.fake))
    return mention, prompt_message(s.fake)


@every_api
async def test_an_approver_click_runs_the_tool_and_updates_the_prompt(store, llm, slack, tmp_path) -> None:
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        mention, prompt = await ask_for_write(s, llm)
        assert prompt["thread_ts"] == mention["ts"]
        assert [b["text"]["text"] for b in buttons(prompt)] == [
            "✅ Approve",
            "❌ Deny",
            "⏱ Allow 15 min",
            "🔁 Allow in this chat",
        ]
        arguments = next(b for b in prompt["blocks"] if b.get("block_id") == "gw_arguments")["text"]["text"]
        assert "write_file" in arguments and '"path": "note.txt"' in arguments
        assert not session_file(tmp_path / "ws", "note.txt").exists()
        await s.click(prompt, "Approve")
        await s.settle(lambda: "Written." in texts(slack))
        assert session_file(tmp_path / "ws", "note.txt").read_text() == "hello"
        closed = slack.message(CHANNEL, prompt["ts"])
        assert buttons(closed) == [] and outcome(closed) == "✅ Approved by Ann"
        assert "note.txt" in tool_results(llm.requests[1])[0]
        assert ephemerals(slack) == []
        assert_threaded(slack, mention["ts"])


async def test_a_click_by_someone_else_is_refused_and_changes_nothing(store, llm, slack, tmp_path) -> None:
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        _, prompt = await ask_for_write(s, llm)
        await s.click(prompt, "Approve", user=BOB)
        await s.settle(lambda: bool(slack.ephemerals))
        assert ephemerals(slack) == [(BOB, REQUESTERS)]  # who decides instead
        assert slack.message(CHANNEL, prompt["ts"])["blocks"] == prompt["blocks"] and not slack.calls_to("chat.update")
        assert not session_file(tmp_path / "ws", "note.txt").exists() and len(llm.requests) == 1
        (pending,) = await store.prompts.pending(thread_key=f"slack:{CHANNEL}:{prompt['thread_ts']}")
        assert pending.status == "pending"
        await s.click(prompt, "Approve")  # Ann, who asked, still can
        await s.settle(lambda: "Written." in texts(slack))
        assert session_file(tmp_path / "ws", "note.txt").exists()


async def test_a_stale_click_is_told_the_request_is_no_longer_pending(store, llm, slack, tmp_path) -> None:
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        _, prompt = await ask_for_write(s, llm)
        await s.click(prompt, "Approve")
        await s.settle(lambda: "Written." in texts(slack))
        await s.click(prompt, "Deny")
        await s.settle(lambda: bool(slack.ephemerals))
        assert ephemerals(slack) == [(ANN, "This request is no longer pending.")]
        assert outcome(slack.message(CHANNEL, prompt["ts"])) == "✅ Approved by Ann"
        assert session_file(tmp_path / "ws", "note.txt").exists() and len(llm.requests) == 2


async def test_a_message_typed_while_approval_waits_becomes_the_deny_reason(store, llm, slack, tmp_path) -> None:
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        mention, prompt = await ask_for_write(s, llm)
        await s.say_in_thread(mention["ts"], "not in my home folder")
        await s.settle(lambda: any(t.startswith("⏳") for t in texts(slack)))
        assert len(llm.requests) == 1  # held, not a new turn
        await s.click(prompt, "Deny")
        await s.settle(lambda: "Written." in texts(slack))
        assert not session_file(tmp_path / "ws", "note.txt").exists()
        assert "not in my home folder" in tool_results(llm.requests[1])[0]
        assert outcome(slack.message(CHANNEL, prompt["ts"])) == "❌ Denied by Ann: not in my home folder"
        assert_threaded(slack, mention["ts"])


async def test_buttons_keep_working_after_a_restart(store, llm, slack, tmp_path) -> None:
    config = slack_config(llm, slack, tmp_path)
    async with running(store, config, slack) as s:
        mention, prompt = await ask_for_write(s, llm)
    async with running(store, config, slack) as s:  # a new process: nothing kept in memory
        await s.click(prompt, "Approve")
        await s.settle(lambda: "Written." in texts(slack))
        assert session_file(tmp_path / "ws", "note.txt").read_text() == "hello"
        closed = slack.message(CHANNEL, prompt["ts"])
        assert buttons(closed) == [] and outcome(closed) == "✅ Approved by Ann"
        assert "write_file" in json.dumps(closed["blocks"])  # the request itself stays readable
        assert texts(slack).count("Written.") == 1
        assert_threaded(slack, mention["ts"])


async def test_a_turn_resumed_by_another_process_still_streams_natively(store, llm, slack, tmp_path) -> None:
    config = slack_config(llm, slack, tmp_path, {"streaming": "native"})
    async with running(store, config, slack) as s:
        mention, prompt = await ask_for_write(s, llm)
    async with running(store, config, slack) as s:  # it never saw the mention: who is the reply for?
        await s.click(prompt, "Approve")
        await s.settle(lambda: any(m.get("text") == "Written." and not m.get("streaming") for m in bot_messages(slack)))
        (start,) = [c.params for c in slack.calls_to("chat.startStream")]
        assert (start["recipient_user_id"], start["recipient_team_id"]) == (ANN, slack.team_id)
        assert start["thread_ts"] == mention["ts"]
        assert not [c for c in slack.calls_to("chat.postMessage") if c.params.get("text") == "Written."]


async def test_long_arguments_are_attached_in_the_thread_and_the_prompt_still_closes(
    store, llm, slack, tmp_path
) -> None:
    content = "\n".join(f"line {n}" for n in range(400))
    llm.tool_call("write_file", {"path": "big.txt", "content": content}, id="w2")
    llm.reply("Written.")
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        mention = await s.mention("write a big file")
        await s.settle(lambda: has_prompt(slack) and bool(slack.files))
        prompt = prompt_message(slack)
        assert "more characters" in json.dumps(prompt["blocks"])
        (snippet,) = slack.files.values()
        assert (snippet["channel"], snippet["thread_ts"]) == (CHANNEL, mention["ts"])
        assert json.loads(snippet["content"]) == {"path": "big.txt", "content": content}
        await s.click(prompt, "Approve")
        await s.settle(lambda: "Written." in texts(slack))
        assert session_file(tmp_path / "ws", "big.txt").read_text() == content
        assert buttons(slack.message(CHANNEL, prompt["ts"])) == []


async def test_someone_not_allowed_gets_an_ephemeral_refusal_and_no_model_call(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    config = slack_config(llm, slack, tmp_path, {"allowed_users": [ANN]})
    async with running(store, config, slack) as s:
        stranger = await s.mention("let me in", user=BOB)
        await s.settle(lambda: bool(slack.ephemerals))
        assert ephemerals(slack) == [(BOB, "Sorry, you are not allowed to use this assistant.")]
        assert slack.ephemerals[0]["thread_ts"] == stranger["ts"]
        assert not llm.requests and await store.inbox.get_by_event(f"slack:{CHANNEL}:{stranger['ts']}") is None
        await s.mention("and me?")
        await s.settle(lambda: bool(texts(slack)))
        assert texts(slack) == ["re: and me?"] and len(llm.requests) == 1


# ---- questions --------------------------------------------------------------------------


async def ask_color(s: Slackside, llm: FakeLLM) -> tuple[dict[str, Any], dict[str, Any]]:
    llm.tool_call("ask_user", {"question": "Which colour?", "choices": ["red", "blue"]}, id="q1")
    llm.responder = lambda request: Reply(f"picked: {tool_results(request)[-1]}")
    mention = await s.mention("paint it")
    await s.settle(lambda: has_prompt(s.fake))
    return mention, prompt_message(s.fake)


def picked(slack: FakeSlack) -> list[str]:
    return [t for t in texts(slack) if t.startswith("picked")]


@every_api
async def test_a_question_answered_by_button(store, llm, slack, tmp_path) -> None:
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        mention, prompt = await ask_color(s, llm)
        assert "Which colour?" in prompt["text"] and [b["text"]["text"] for b in buttons(prompt)] == ["red", "blue"]
        await s.click(prompt, "blue")
        await s.settle(lambda: bool(picked(slack)))
        assert picked(slack) == ["picked: The user answered: blue"]
        closed = slack.message(CHANNEL, prompt["ts"])
        assert buttons(closed) == [] and outcome(closed) == "💬 Answered by Ann: blue"
        assert_threaded(slack, mention["ts"])


async def test_a_question_answered_by_a_typed_reply_in_the_thread(store, llm, slack, tmp_path) -> None:
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        mention, prompt = await ask_color(s, llm)
        await s.say_in_thread(mention["ts"], "green, please")
        await s.settle(lambda: bool(picked(slack)))
        assert picked(slack) == ["picked: The user answered: green, please"]
        assert len(llm.requests) == 2  # the typed answer resumed the turn; it started no other
        closed = slack.message(CHANNEL, prompt["ts"])
        assert buttons(closed) == [] and outcome(closed) == "💬 Answered by Ann: green, please"


# ---- streaming, presence, rate limits ---------------------------------------------------

LONG_REPLY = "Here is **the answer**: " + " ".join(f"word{n}" for n in range(40))


@every_api
async def test_native_streaming_through_a_turn(store, llm, slack, tmp_path) -> None:
    llm.reply(LONG_REPLY)
    config = slack_config(llm, slack, tmp_path, {"streaming": "native"})
    async with running(store, config, slack) as s:
        mention = await s.mention("tell me a lot")
        await s.settle(lambda: bool(bot_messages(slack)) and not bot_messages(slack)[0].get("streaming"))
        (start,) = [c.params for c in slack.calls_to("chat.startStream")]
        assert start["thread_ts"] == mention["ts"] and start["recipient_user_id"] == ANN
        appended = [c.params["markdown_text"] for c in slack.calls_to("chat.appendStream")]
        assert len(appended) >= 3  # shown while it was written
        stop = slack.calls_to("chat.stopStream")[0].params
        assert start.get("markdown_text", "") + "".join(appended) + stop.get("markdown_text", "") == LONG_REPLY
        (message,) = bot_messages(slack)
        assert message["text"] == LONG_REPLY and message["thread_ts"] == mention["ts"]
        assert not slack.calls_to("chat.postMessage") and not slack.calls_to("chat.update")


@pytest.mark.parametrize("mode", ["edit", "auto-refused"])
async def test_edit_streaming_through_a_turn(store, llm, slack, tmp_path, mode) -> None:
    llm.reply(LONG_REPLY)
    if mode == "auto-refused":
        slack.fail_always("chat.startStream", "missing_scope")  # the workspace cannot stream: edit
    config = slack_config(llm, slack, tmp_path, {"streaming": "edit" if mode == "edit" else "auto"})
    async with running(store, config, slack) as s:
        mention = await s.mention("tell me a lot")
        rendered = LONG_REPLY.replace("**the answer**", "*the answer*")
        await s.settle(lambda: texts(slack) == [rendered])
        (first,) = [c.params for c in slack.calls_to("chat.postMessage")]
        assert first["thread_ts"] == mention["ts"] and rendered.startswith(first["text"]) and first["text"] != rendered
        (message,) = bot_messages(slack)
        updates = slack.calls_to("chat.update")
        assert len(updates) >= 3 and {c.params["ts"] for c in updates} == {message["ts"]}
        assert updates[-1].params["text"] == rendered
        assert not slack.calls_to("chat.appendStream")
        assert_threaded(slack, mention["ts"])


async def test_a_429_on_post_message_is_waited_out(store, llm, slack, tmp_path) -> None:
    llm.reply("after the wait")
    slack.fail_next("chat.postMessage", retry_after=1)
    config = slack_config(llm, slack, tmp_path, {"streaming": "off"})
    async with running(store, config, slack) as s:
        mention = await s.mention("hi")
        await s.settle(lambda: bool(texts(slack)))
        assert texts(slack) == ["after the wait"]
        first, second = slack.calls_to("chat.postMessage")
        assert second.at - first.at >= 0.95  # retried only after Retry-After
        assert second.params["thread_ts"] == mention["ts"]
        run = (await store.runs.list())[0]
        assert run.stage == "SUCCESS"


async def test_the_eyes_reaction_stands_in_when_no_status_may_be_set(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    slack.fail_always("assistant.threads.setStatus", "missing_scope")
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        mention = await s.mention("first")
        await s.settle(lambda: len(texts(slack)) == 1)
        reactions = [
            (c.method, c.params["timestamp"], c.params["name"])
            for c in slack.calls
            if c.method.startswith("reactions.")
        ]
        assert reactions == [("reactions.add", mention["ts"], "eyes"), ("reactions.remove", mention["ts"], "eyes")]
        assert slack.reactions == set() and texts(slack) == ["re: first"]
        second = await s.say_in_thread(mention["ts"], "second")
        await s.settle(lambda: len(texts(slack)) == 2)
        assert len(slack.calls_to("assistant.threads.setStatus")) == 1  # refused once, not asked again
        assert (CHANNEL, second["ts"], "eyes") not in slack.reactions
        assert [c.params["timestamp"] for c in slack.calls_to("reactions.add")] == [mention["ts"], second["ts"]]


async def test_socket_mode_events_are_answered_in_their_thread(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    config = slack_config(llm, slack, tmp_path, {"app_token": slack.app_token, "signing_secret": ""})
    async with running(store, config, slack) as s:
        await slack.wait_socket()
        ts = s.written(CHANNEL, ANN, "<@UBOT> over the socket")
        event = s.sender.mention(CHANNEL, ANN, "<@UBOT> over the socket", ts=ts)
        envelope_id = await slack.push_envelope("events_api", s.sender.envelope(event))
        assert await slack.wait_ack(envelope_id) == {"envelope_id": envelope_id}
        assert await store.inbox.get_by_event(f"slack:{CHANNEL}:{ts}") is not None  # committed before the ack
        await s.settle(lambda: bool(texts(slack)))
        again = await slack.push_envelope("events_api", s.sender.envelope(event), retry_attempt=1)
        await slack.wait_ack(again)
        await s.gateway.inbox.wait_until_idle(10)
        assert texts(slack) == ["re: over the socket"] and len(llm.requests) == 1
        assert_threaded(slack, ts)


# ---- core behaviour seen from Slack -----------------------------------------------------


async def test_a_follow_up_sent_while_the_mention_waits_for_a_worker_is_kept(store, llm, slack, tmp_path) -> None:
    llm.stall("busy elsewhere")
    llm.responder = echo
    config = slack_config(llm, slack, tmp_path, inbox={"max_concurrent_turns": 1})
    async with running(store, config, slack) as s:
        await s.dm("keep the only turn slot busy")
        await asyncio.wait_for(llm.stalled.wait(), 20)
        mention = await s.mention("queued question")
        assert await store.sessions.current(f"slack:{CHANNEL}:{mention['ts']}") is None  # no worker took it yet
        follow = await s.say_in_thread(mention["ts"], "and a detail")
        assert await store.inbox.get_by_event(f"slack:{CHANNEL}:{follow['ts']}") is not None
        await s.dm("/stop")  # frees the slot: the thread's turn runs and sees both messages
        await s.settle(lambda: len(texts(slack)) == 1)
        said = [text for r in llm.requests[1:] for text in user_texts(r)]
        assert said == ["queued question\n\nand a detail"]  # one turn, both messages (coalesced)
        assert_threaded(slack, mention["ts"])


# ---- scheduled jobs ---------------------------------------------------------------------


async def test_a_scheduled_job_delivers_its_result_into_a_slack_thread(store, llm, slack, tmp_path) -> None:
    from datetime import datetime

    job = {
        "name": "standup",
        "cron": "0 9 * * 1-5",
        "prompt": "Summarise yesterday.",
        "deliver_to": f"slack:{CHANNEL}:1700000000.000100",
    }
    llm.reply("Yesterday: three deploys, no incidents.")
    async with running(
        store, slack_config(llm, slack, tmp_path, scheduler={"enabled": True, "jobs": [job]}), slack
    ) as s:
        schedule = await store.schedules.by_name("standup")
        await s.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
        await s.settle(lambda: any("three deploys" in t for t in texts(slack)))
        delivered = next(m for m in bot_messages(slack) if "three deploys" in m.get("text", ""))
        assert "standup" in delivered["text"] and delivered.get("thread_ts") == "1700000000.000100"


# ---- task cards, feedback, status --------------------------------------------------------


@every_api
async def test_tool_calls_show_as_task_cards_above_the_streamed_answer(store, llm, slack, tmp_path) -> None:
    llm.tool_call("clock", {}, id="c1")
    llm.tool_call("no_such_tool", {"x": 1}, id="c2")
    llm.reply("It is late.")
    async with running(store, slack_config(llm, slack, tmp_path, {"streaming": "native"}), slack) as s:
        mention = await s.mention("what time is it?")
        await s.settle(lambda: answered(slack, "It is late."))
        (start,) = [c.params for c in slack.calls_to("chat.startStream")]  # one stream: cards, then the answer
        assert start["task_display_mode"] == "timeline" and start["thread_ts"] == mention["ts"]
        assert start["chunks"] == [
            {"type": "task_update", "id": "c1", "title": "clock", "status": "in_progress", "details": "{}"}
        ]
        (message,) = bot_messages(slack)
        assert message["tasks"]["c1"]["status"] == "complete"
        assert "c2" not in message["tasks"]  # an unknown tool never ran: no card
        assert message["text"] == "It is late."
        assert not slack.calls_to("chat.postMessage")
        assert_threaded(slack, mention["ts"])


async def test_task_cards_of_a_turn_that_parks_are_stopped_and_plan_mode_groups_them(
    store, llm, slack, tmp_path
) -> None:
    config = slack_config(llm, slack, tmp_path, {"streaming": "native", "task_cards": "plan"})
    llm.tool_call("clock", {}, id="c1")
    llm.tool_call("write_file", {"path": "note.txt", "content": "hello"}, id="w1")
    llm.reply("Written.")
    async with running(store, config, slack) as s:
        await s.mention("note the time")
        await s.settle(lambda: has_prompt(slack))
        cards = next(m for m in bot_messages(slack) if m.get("tasks"))
        assert cards["streaming"] is False  # stopped when the turn parked on the approval
        assert cards["task_display_mode"] == "plan" and cards["plan_title"]
        assert cards["tasks"]["c1"]["status"] == "complete"
        await s.click(prompt_message(slack), "Approve")
        await s.settle(lambda: answered(slack, "Written."))
        written = next(m for m in bot_messages(slack) if m.get("text") == "Written.")
        assert written["tasks"]["w1"]["status"] == "complete" and written["ts"] != cards["ts"]


async def test_no_task_cards_when_off_or_editing(store, llm, slack, tmp_path) -> None:
    for settings in ({"streaming": "native", "task_cards": "off"}, {"streaming": "edit"}):
        llm.tool_call("clock", {}, id="c1")
        llm.reply("It is late.")
        async with running(store, slack_config(llm, slack, tmp_path, settings), slack) as s:
            await s.mention("what time is it?")
            await s.settle(lambda: any(m.get("text") == "It is late." for m in bot_messages(slack)))
        assert not [c for c in slack.calls if c.params.get("chunks")]
        slack.messages.clear()


@every_api
async def test_feedback_buttons_under_the_answer_are_recorded_on_its_run(store, llm, slack, tmp_path) -> None:
    from gateway.serving.metrics import FEEDBACK

    llm.reply("Here you go.")
    before = FEEDBACK.labels("slack", "up", "added")._value.get()
    async with running(store, slack_config(llm, slack, tmp_path, {"streaming": "native"}), slack) as s:
        mention = await s.mention("help me")
        await s.settle(lambda: answered(slack, "Here you go."))
        (answer,) = bot_messages(slack)
        (block,) = answer["blocks"]
        assert block["type"] == "context_actions" and block["elements"][0]["type"] == "feedback_buttons"
        press = {"channel": CHANNEL, "message_ts": answer["ts"], "thread_ts": mention["ts"]}
        for user, value in ((ANN, "up"), (BOB, "down"), ("U9", "down")):
            reply = await s.sender.feedback(user=user, value=value, **press)
            assert reply.status == 200, reply.text
        await s.sender.feedback(user=ANN, value="sideways", **press)  # not a value of ours: ignored
        await s.gateway.inbox.wait_until_idle(10)
        (run,) = await store.runs.list(limit=5)
        events = [e for e in await store.runs.events(run.id) if e.kind == "FEEDBACK"]
    assert [(e.payload["added"], e.payload["by"], e.payload["message_id"]) for e in events] == [
        (["up"], ANN, answer["ts"]), (["down"], BOB, answer["ts"]), (["down"], "U9", answer["ts"])
    ]
    assert FEEDBACK.labels("slack", "up", "added")._value.get() == before + 1
    assert len(llm.requests) == 1 and ephemerals(slack) == []


async def test_feedback_buttons_follow_the_setting_and_need_a_native_stream(store, llm, slack, tmp_path) -> None:
    for settings in ({"streaming": "native", "feedback_buttons": False}, {"streaming": "edit"}):
        llm.reply("Here you go.")
        async with running(store, slack_config(llm, slack, tmp_path, settings), slack) as s:
            await s.mention("help me")
            await s.settle(lambda: answered(slack, "Here you go."))
        assert not [m for m in bot_messages(slack) if m.get("blocks")]
        slack.messages.clear()


async def test_feedback_from_someone_not_allowed_is_not_recorded(store, llm, slack, tmp_path) -> None:
    llm.reply("Here you go.")
    config = slack_config(llm, slack, tmp_path, {"streaming": "native", "allowed_users": [ANN]})
    async with running(store, config, slack) as s:
        mention = await s.mention("help me")
        await s.settle(lambda: answered(slack, "Here you go."))
        (answer,) = bot_messages(slack)
        await s.sender.feedback(user=BOB, value="down", channel=CHANNEL, message_ts=answer["ts"],
                                thread_ts=mention["ts"])
        await s.gateway.inbox.wait_until_idle(10)
        (run,) = await store.runs.list(limit=5)
        assert not [e for e in await store.runs.events(run.id) if e.kind == "FEEDBACK"]


@every_api
async def test_slack_stop_button_cancels_the_run_like_stop(store, llm, slack, tmp_path) -> None:
    llm.stall("Let me think")
    config = slack_config(llm, slack, tmp_path, {"streaming": "native"})
    async with running(store, config, slack) as s:
        mention = await s.mention("think hard")
        await asyncio.wait_for(llm.stalled.wait(), 20)
        thread = (CHANNEL, mention["ts"])
        assert slack.sessions[thread] == "processing"  # Slack shows its stop button
        (status, *_) = slack.statuses
        assert status["status"] == "is thinking…" and status["loading_messages"]
        streaming = tuple(m["ts"] for m in bot_messages(slack) if m.get("streaming"))
        await s.post(s.sender.session_stopped(CHANNEL, mention["ts"], ANN, streaming))
        await s.settle(lambda: slack.sessions[thread] == "active")
        (run,) = await store.runs.list(limit=5)
        assert run.stage == "CANCELED"
        await asyncio.wait_for(llm.disconnected.wait(), 5)  # the model call was dropped
        assert len(llm.requests) == 1 and llm.disconnects == 1  # and none made after
        assert_threaded(slack, mention["ts"])


async def test_a_stop_by_someone_else_or_not_allowed_does_not_cancel(store, llm, slack, tmp_path) -> None:
    llm.stall("Let me think")
    config = slack_config(llm, slack, tmp_path, {"streaming": "native", "allowed_users": [ANN, BOB]})
    async with running(store, config, slack) as s:
        mention = await s.mention("think hard")
        await asyncio.wait_for(llm.stalled.wait(), 20)
        await s.post(s.sender.session_stopped(CHANNEL, mention["ts"], "U9"))  # not allowed at all: never stored
        await s.post(s.sender.session_stopped(CHANNEL, mention["ts"], BOB))  # allowed, not the asker
        await until(lambda: len(bot_messages(slack)) == 2)
        refusal = next(m for m in bot_messages(slack) if not m.get("streaming"))
        assert "stop" in refusal["text"].lower() and refusal["thread_ts"] == mention["ts"]
        (run,) = await store.runs.list(limit=5)
        assert run.stage == "RUNNING" and slack.sessions[(CHANNEL, mention["ts"])] == "processing"


# ---- the agent view and the assistant view -----------------------------------------------

PROMPTS = [{"title": "Summarise", "message": "Summarise my unread threads"}, {"title": "Plan", "message": "Plan it"}]


@every_api
async def test_in_the_agent_view_each_dm_message_is_its_own_thread(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    slack.agent_view = True
    config = slack_config(llm, slack, tmp_path, {"app_view": "agent", "streaming": "auto"})
    async with running(store, config, slack) as s:
        first = await s.dm("hello")
        await s.settle(lambda: "re: hello" in texts(slack, DM))
        second = await s.dm("something else")
        await s.settle(lambda: "re: something else" in texts(slack, DM))
        await s.post(s.sender.dm(DM, ANN, "more on hello", ts=s.written(DM, ANN, "more on hello", first["ts"]),
                                 thread_ts=first["ts"]))
        await s.settle(lambda: "re: more on hello" in texts(slack, DM))
        answers = {m["text"]: m for m in bot_messages(slack, DM)}
        assert answers["re: hello"]["thread_ts"] == first["ts"]
        assert answers["re: something else"]["thread_ts"] == second["ts"]
        assert answers["re: more on hello"]["thread_ts"] == first["ts"]
        assert user_texts(llm.requests[1]) == ["something else"]  # a new thread: a new session
        assert user_texts(llm.requests[2]) == ["hello", "more on hello"]
        assert all(c.params["thread_ts"] in (first["ts"], second["ts"]) for c in slack.calls_to("chat.startStream"))
        assert {s["thread_ts"] for s in slack.statuses} == {first["ts"], second["ts"]}  # a status line, no 👀
        assert not slack.calls_to("reactions.add")


async def test_opening_the_messages_tab_shows_the_suggested_prompts(store, llm, slack, tmp_path) -> None:
    slack.agent_view = True
    settings = {"app_view": "agent", "suggested_prompts": PROMPTS, "suggested_prompts_title": "Try"}
    async with running(store, slack_config(llm, slack, tmp_path, settings), slack) as s:
        await s.post(s.sender.home_opened(ANN, DM, tab="home"))  # the Home tab: nothing
        await s.post(s.sender.home_opened(ANN, DM))
        await s.post(s.sender.context_changed(CHANNEL))  # what Ann looks at: acknowledged, not used
        await until(lambda: bool(slack.suggested))
        await s.gateway.inbox.wait_until_idle(10)
    (shown,) = slack.suggested
    assert shown == {"channel_id": DM, "title": "Try", "prompts": PROMPTS}  # no thread_ts: an agent app's call
    assert not llm.requests and not bot_messages(slack, DM)


async def test_an_assistant_view_app_keeps_its_prompts_per_thread_and_dms_as_one_session(
    store, llm, slack, tmp_path
) -> None:
    llm.responder = echo
    settings = {"suggested_prompts": PROMPTS}  # app_view: assistant (the default)
    async with running(store, slack_config(llm, slack, tmp_path, settings), slack) as s:
        await s.post(s.sender.home_opened(ANN, DM))  # not an agent app: the tab gets no prompts
        thread_ts = s.written(DM, ANN, "")  # the assistant thread Slack opened
        await s.post(s.sender.assistant_thread_started(ANN, DM, thread_ts))
        await until(lambda: bool(slack.suggested))
        await s.dm("hello")
        await s.settle(lambda: "re: hello" in texts(slack, DM))
        await s.dm("again")
        await s.settle(lambda: "re: again" in texts(slack, DM))
    assert slack.suggested == [{"channel_id": DM, "thread_ts": thread_ts, "prompts": PROMPTS}]
    assert user_texts(llm.requests[1]) == ["hello", "again"]  # one session, as before
    assert all(not m.get("thread_ts") for m in bot_messages(slack, DM) if m.get("text", "").startswith("re:"))


async def test_suggested_prompts_are_not_shown_to_someone_not_allowed(store, llm, slack, tmp_path) -> None:
    settings = {"app_view": "agent", "suggested_prompts": PROMPTS, "allowed_users": [ANN]}
    async with running(store, slack_config(llm, slack, tmp_path, settings), slack) as s:
        await s.post(s.sender.home_opened(BOB, "D2"))
        await s.post(s.sender.home_opened(ANN, DM))
        await until(lambda: bool(slack.suggested))
    assert [shown["channel_id"] for shown in slack.suggested] == [DM]


# ---- thread history under conversations.replies' rate limit ------------------------------


@every_api
async def test_thread_history_reads_stay_few_under_a_one_a_minute_limit(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    slack.rate_limit("conversations.replies", per_s=60)
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        roots = [s.written(CHANNEL, BOB, f"topic {n}") for n in range(3)]
        for root in roots:
            s.written(CHANNEL, ANN, "a reply before the agent came", root)
        for n, root in enumerate(roots):
            await s.mention(f"about topic {n}?", thread_ts=root)
            await s.settle(lambda n=n: len(texts(slack)) == n + 1)
        await s.say_in_thread(roots[0], "and more")  # a thread it is in: its history is the session's
        await s.settle(lambda: len(texts(slack)) == 4)
        said = [user_texts(r)[-1] for r in llm.requests]
    reads = slack.calls_to("conversations.replies")
    assert len(reads) == 2  # the first read, the one the 429 answered; none while it holds
    assert said[0].startswith("[earlier in this thread") and "Bob: topic 0" in said[0]
    assert said[1:] == ["about topic 1?", "about topic 2?", "and more"]  # answered without the thread's start
    assert len(texts(slack)) == 4


async def test_a_decided_prompt_closes_without_reading_the_thread(store, llm, slack, tmp_path) -> None:
    slack.rate_limit("conversations.replies", per_s=60)
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        _, prompt = await ask_for_write(s, llm)
        await s.click(prompt, "Approve")
        await s.settle(lambda: "Written." in texts(slack))
        closed = slack.message(CHANNEL, prompt["ts"])
        assert outcome(closed) == "✅ Approved by Ann" and "write_file" in json.dumps(closed["blocks"])
    assert slack.calls_to("conversations.replies") == []


async def test_a_thread_is_read_once_even_when_its_mention_comes_again_before_the_session(
    store, llm, slack, tmp_path
) -> None:
    llm.stall("busy elsewhere")
    llm.responder = echo
    config = slack_config(llm, slack, tmp_path, inbox={"max_concurrent_turns": 1})
    async with running(store, config, slack) as s:
        await s.dm("keep the only turn slot busy")
        await asyncio.wait_for(llm.stalled.wait(), 20)
        root = s.written(CHANNEL, BOB, "the deploy broke")
        mention = await s.mention("what broke?", thread_ts=root, event_id="Ev0EARLY")
        await s.post(mention, event_id="Ev0EARLY", retry_num=1)  # Slack retries: no session there yet
        await s.mention("and why?", thread_ts=root)  # a second mention, still before the session
        assert await store.sessions.current(f"slack:{CHANNEL}:{root}") is None
        assert len(slack.calls_to("conversations.replies")) == 1
        await s.dm("/stop")
        await s.settle(lambda: any("what broke?" in t for t in texts(slack)))
    assert len(slack.calls_to("conversations.replies")) == 1
