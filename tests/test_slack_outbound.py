"""Outbound Slack: threaded sends, uploads, Block Kit prompts, closing prompts, rate limits."""

from __future__ import annotations

import asyncio

import pytest
from fakes.slack import channel_harness

from channels.slack.blocks import prompt_blocks
from channels.slack.pacing import ChannelPacer
from gateway.events import Button, ChannelError, Outbound, Prompt, ThreadKey

THREAD = ThreadKey("slack", "C1", "1690000000.000100")
DM = ThreadKey("slack", "D1", "")
APPROVAL_BUTTONS = (
    (Button("✅ Approve", "tok-a"), Button("❌ Deny", "tok-d")),
    (Button("⏱ Allow 15 min", "tok-15"), Button("🔄 Allow in this thread", "tok-t")),
)


def approval(arguments: str = '{\n  "command": "ls -la"\n}') -> Prompt:
    return Prompt(kind="approval", thread=THREAD, key="p1", text="Run a shell command", buttons=APPROVAL_BUTTONS,
                  tool_name="shell", arguments=arguments)


async def test_send_goes_into_the_thread_never_the_top_level() -> None:
    async with channel_harness() as h:
        delivered = await h.channel.send(Outbound(THREAD, "**Done.** See `out.txt`", key="k1"))

        [call] = h.fake.calls_to("chat.postMessage")
        assert call.params["thread_ts"] == THREAD.thread
        assert call.params["text"] == "*Done.* See `out.txt`"
        assert h.fake.top_level("C1") == []
        assert [m["ts"] for m in h.fake.thread("C1", THREAD.thread)] == list(delivered.message_ids)


async def test_dm_without_a_thread_posts_to_the_dm() -> None:
    async with channel_harness() as h:
        delivered = await h.channel.send(Outbound(DM, "hello", key="k1"))
        [message] = h.fake.messages["D1"]
        assert "thread_ts" not in message and delivered.message_ids == (message["ts"],)


async def test_long_replies_are_split_in_the_thread_with_code_blocks_closed() -> None:
    async with channel_harness() as h:
        code = "\n".join(f"line {i} < {i + 1}" for i in range(400))
        text = "Intro paragraph.\n\n```python\n" + code + "\n```\n\nThe end."
        delivered = await h.channel.send(Outbound(THREAD, text, key="k1"))

        posted = [c.params for c in h.fake.calls_to("chat.postMessage")]
        assert len(posted) == len(delivered.message_ids) >= 3
        assert all(p["thread_ts"] == THREAD.thread for p in posted)
        assert all(len(p["text"]) <= 3000 for p in posted)
        assert all(p["text"].count("```") % 2 == 0 for p in posted)
        joined = "".join(p["text"] for p in posted)
        assert "line 399 &lt; 400" in joined and joined.endswith("The end.")


async def test_document_is_uploaded_into_the_thread() -> None:
    async with channel_harness() as h:
        await h.channel.send(Outbound(THREAD, "Full log attached.", key="k1", document=("build.log", "x" * 5000)))

        [upload] = h.fake.files.values()
        assert upload["name"] == "build.log" and upload["content"] == b"x" * 5000
        assert upload["channel"] == "C1" and upload["thread_ts"] == THREAD.thread
        assert h.fake.top_level("C1") == []


async def test_empty_message_is_refused_clearly() -> None:
    async with channel_harness() as h:
        with pytest.raises(ChannelError) as caught:
            await h.channel.send(Outbound(THREAD, "   ", key="k1"))
        assert caught.value.permanent
        assert h.fake.calls_to("chat.postMessage") == []


async def test_approval_prompt_blocks() -> None:
    async with channel_harness() as h:
        delivered = await h.channel.send_prompt(approval())

        [call] = h.fake.calls_to("chat.postMessage")
        assert call.params["thread_ts"] == THREAD.thread
        assert delivered.message_ids == (h.fake.thread("C1", THREAD.thread)[0]["ts"],)
        blocks = call.params["blocks"]
        assert "Approval required" in blocks[0]["text"]["text"] and "Run a shell command" in blocks[0]["text"]["text"]
        assert blocks[1]["text"]["text"] == 'Tool: `shell`\n```\n{\n  "command": "ls -la"\n}\n```'
        rows = [b["elements"] for b in blocks if b["type"] == "actions"]
        assert [[(e["text"]["text"], e["value"], e.get("style")) for e in row] for row in rows] == [
            [("✅ Approve", "tok-a", "primary"), ("❌ Deny", "tok-d", "danger")],
            [("⏱ Allow 15 min", "tok-15", None), ("🔄 Allow in this thread", "tok-t", None)],
        ]
        action_ids = [e["action_id"] for row in rows for e in row]
        assert len(set(action_ids)) == 4 and all(a.startswith("gw:") for a in action_ids)
        assert h.fake.files == {}


def test_a_buttons_tone_colours_it_whatever_its_label() -> None:
    # an access request's buttons (a notice) say what they mean by their tone, not their words
    buttons = ((Button("Let in", "t-ok", tone="positive"), Button("Keep out", "t-no", tone="negative")),
               (Button("Later", "t-later"),))
    notice = Prompt("notice", THREAD, "k", "Ann asks to talk to the agent", buttons)
    rows = [b["elements"] for b in prompt_blocks(notice).blocks if b["type"] == "actions"]
    assert [[e.get("style") for e in row] for row in rows] == [["primary", "danger"], [None]]


async def test_long_arguments_are_truncated_and_uploaded_in_full() -> None:
    async with channel_harness() as h:
        arguments = '{"content": "' + "<tag> & " * 1000 + '"}'
        await h.channel.send_prompt(approval(arguments))

        section = h.fake.calls_to("chat.postMessage")[0].params["blocks"][1]["text"]["text"]
        assert len(section) <= 3000
        assert "&lt;tag&gt; &amp;" in section and "<tag>" not in section
        assert "more characters; the full arguments are attached" in section
        omitted = int(section.split("_… ")[1].split(" more")[0].replace(",", ""))
        assert 0 < omitted < len(arguments)
        [snippet] = h.fake.files.values()
        assert snippet["content"] == arguments.encode()
        assert snippet["snippet_type"] == "json" and snippet["thread_ts"] == THREAD.thread


async def test_question_prompt_has_a_button_per_choice_and_the_hint() -> None:
    async with channel_harness() as h:
        prompt = Prompt(
            kind="question",
            thread=THREAD,
            key="q1",
            text="Which *environment*?",
            buttons=((Button("staging", "q-0"),), (Button("production", "q-1"),)),
            hint="or type your answer",
        )
        await h.channel.send_prompt(prompt)

        blocks = h.fake.calls_to("chat.postMessage")[0].params["blocks"]
        assert blocks[0]["text"]["text"].endswith("Which _environment_?")
        values = [e["value"] for b in blocks if b["type"] == "actions" for e in b["elements"]]
        assert values == ["q-0", "q-1"]
        assert all("style" not in e for b in blocks if b["type"] == "actions" for e in b["elements"])
        assert blocks[-1] == {"type": "context", "block_id": "gw_hint",
                              "elements": [{"type": "mrkdwn", "text": "or type your answer"}]}


async def test_close_prompt_replaces_the_buttons_with_the_outcome() -> None:
    async with channel_harness() as h:
        delivered = await h.channel.send_prompt(approval())
        await h.channel.close_prompt(THREAD, delivered.message_ids, "✅ Approved by Ann")

        message = h.fake.message("C1", delivered.message_ids[0])
        kinds = [b["type"] for b in message["blocks"]]
        assert "actions" not in kinds
        assert kinds == ["section", "section", "context"]
        assert message["blocks"][-1]["elements"][0]["text"] == "✅ Approved by Ann"
        assert 'ls -la' in message["blocks"][1]["text"]["text"]  # the request itself stays readable
        assert message["text"] == "✅ Approved by Ann"


async def test_close_prompt_still_works_when_the_message_cannot_be_read() -> None:
    async with channel_harness() as h:
        h.fake.fail_always("conversations.replies", "missing_scope")
        delivered = await h.channel.send_prompt(approval())  # sent by this process: its blocks are known
        await h.channel.close_prompt(THREAD, delivered.message_ids, "✅ Approved by Ann")
        kept = h.fake.message("C1", delivered.message_ids[0])["blocks"]
        assert [b["type"] for b in kept][-1] == "context" and len(kept) > 1
        assert h.fake.calls_to("conversations.replies") == []

        # A prompt another instance sent (this one never saw its blocks), and it cannot be read.
        other = approval()
        posted = await h.channel._web("chat_postMessage", channel="C1", thread_ts=THREAD.thread, text=other.text,
                                      blocks=prompt_blocks(other).blocks)
        await h.channel.close_prompt(THREAD, [posted["ts"]], "❌ Denied by Bob")
        blocks = h.fake.message("C1", posted["ts"])["blocks"]
        assert [b["type"] for b in blocks] == ["context"]
        assert blocks[0]["elements"][0]["text"] == "❌ Denied by Bob"


async def test_a_429_is_handed_back_at_once_with_retry_after() -> None:
    async with channel_harness() as h:
        h.fake.fail_next("chat.postMessage", retry_after=7)
        with pytest.raises(ChannelError) as caught:
            await h.channel.send(Outbound(THREAD, "too fast", key="k1"))
        assert caught.value.retry_after == 7.0 and not caught.value.permanent
        assert h.fake.messages == {} and len(h.fake.calls_to("chat.postMessage")) == 1


async def test_platform_errors_become_permanent_channel_errors() -> None:
    async with channel_harness() as h:
        h.fake.fail_always("chat.postMessage", "channel_not_found")
        with pytest.raises(ChannelError) as caught:
            await h.channel.send(Outbound(THREAD, "hello", key="k1"))
        assert caught.value.permanent and "channel_not_found" in str(caught.value)


class _Sleeps:
    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.slept: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock[0] += seconds


async def test_pacer_spaces_sends_per_channel_and_honours_retry_after() -> None:
    now = [100.0]
    sleeps = _Sleeps(now)
    pacer = ChannelPacer(1.0, clock=lambda: now[0], sleep=sleeps)

    await pacer.wait("C1")
    await pacer.wait("C2")  # another channel is not held back
    await pacer.wait("C1")
    assert sleeps.slept == [1.0]

    pacer.defer("C1", 30)
    await pacer.wait("C1")
    assert sleeps.slept == [1.0, 30.0]


async def test_concurrent_sends_to_one_channel_queue_up_in_order() -> None:
    now = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    pacer = ChannelPacer(1.0, clock=lambda: now[0], sleep=sleep)
    await asyncio.gather(*(pacer.wait("C1") for _ in range(4)))
    assert sorted(slept) == [1.0, 2.0, 3.0]
