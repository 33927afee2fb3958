"""Streaming replies (native / edit / auto fallback / off) and presence (status or reaction)."""

from __future__ import annotations

import pytest
from fakes.slack import Harness, channel_harness

from channels.slack.stream import SlackCallError
from gateway.events import ThreadKey

STREAM_METHODS = ("chat.startStream", "chat.appendStream", "chat.stopStream")


async def _mention(h: Harness) -> ThreadKey:
    """A mention from U1, so the channel knows who the streamed answer is for."""
    event = h.events.mention("C1", "U1", "<@UBOT> explain")
    await h.events.event(event)
    return h.submit.events[-1].thread


def _methods(h: Harness) -> list[str]:
    return [c.method for c in h.fake.calls if c.method.startswith(("chat.", "assistant.", "reactions."))]


async def test_native_stream_starts_appends_deltas_and_stops() -> None:
    async with channel_harness(streaming="native") as h:
        thread = await _mention(h)
        stream = h.channel.open_stream(thread, reply_to=thread.thread)
        await stream.update("Hello")
        await stream.update("Hello, wor")  # within the second: held back
        h.clock.advance(1.0)
        await stream.update("Hello, world")
        delivered = await stream.finish("Hello, world. **Done.**")

        assert _methods(h) == ["chat.startStream", "chat.appendStream", "chat.stopStream"]
        start = h.fake.calls_to("chat.startStream")[0].params
        assert start["thread_ts"] == thread.thread
        assert (start["recipient_user_id"], start["recipient_team_id"]) == ("U1", "T1")
        assert [c.params["markdown_text"] for c in h.fake.calls_to("chat.appendStream")] == [", world"]
        assert h.fake.calls_to("chat.stopStream")[0].params["markdown_text"] == ". **Done.**"
        [message] = h.fake.thread("C1", thread.thread)
        assert message["text"] == "Hello, world. **Done.**" and message["streaming"] is False
        assert delivered.message_ids == (message["ts"],)


async def test_native_stream_rewritten_text_is_laid_out_at_the_end() -> None:
    async with channel_harness(streaming="native") as h:
        thread = await _mention(h)
        stream = h.channel.open_stream(thread)
        await stream.update("Draft answer")
        delivered = await stream.finish("A *different* final answer")

        [message] = h.fake.thread("C1", thread.thread)
        assert message["text"] == "A _different_ final answer"  # replaced by chat.update, as mrkdwn
        assert delivered.message_ids == (message["ts"],)


async def test_native_abort_stops_the_stream() -> None:
    async with channel_harness(streaming="native") as h:
        thread = await _mention(h)
        stream = h.channel.open_stream(thread)
        await stream.update("Working on it")
        await stream.abort()
        assert _methods(h)[-1] == "chat.stopStream"
        assert h.fake.thread("C1", thread.thread)[0]["streaming"] is False


async def test_edit_stream_posts_then_updates_at_most_once_a_second() -> None:
    async with channel_harness(streaming="edit") as h:
        thread = await _mention(h)
        stream = h.channel.open_stream(thread)
        await stream.update("First")
        await stream.update("First words")  # same second: no call
        h.clock.advance(0.5)
        await stream.update("First words and")  # still within the second
        h.clock.advance(0.6)
        await stream.update("First words and more")
        delivered = await stream.finish("First words and more. **End**")

        assert _methods(h) == ["chat.postMessage", "chat.update", "chat.update"]
        updates = [c.params["text"] for c in h.fake.calls_to("chat.update")]
        assert updates == ["First words and more", "First words and more. *End*"]
        [message] = h.fake.thread("C1", thread.thread)
        assert message["text"] == "First words and more. *End*"
        assert delivered.message_ids == (message["ts"],)
        assert h.fake.calls_to("chat.startStream") == []


async def test_edit_stream_spills_long_replies_into_more_messages_in_the_thread() -> None:
    async with channel_harness(streaming="edit") as h:
        thread = await _mention(h)
        stream = h.channel.open_stream(thread)
        paragraph = "word " * 500
        await stream.update(paragraph)
        h.clock.advance(1)
        final = "\n\n".join([paragraph] * 4)
        delivered = await stream.finish(final)

        posted = h.fake.thread("C1", thread.thread)
        assert len(delivered.message_ids) == len(posted) >= 2
        assert all(len(m["text"]) <= 3000 for m in posted)
        assert sum(m["text"].count("word") for m in posted) == 2000
        assert h.fake.top_level("C1") == []


async def test_edit_stream_drops_messages_the_final_text_no_longer_needs() -> None:
    async with channel_harness(streaming="edit") as h:
        thread = await _mention(h)
        stream = h.channel.open_stream(thread)
        await stream.update("word " * 1500)  # three chunks
        assert len(h.fake.thread("C1", thread.thread)) >= 2
        delivered = await stream.finish("Short after all.")

        [message] = h.fake.thread("C1", thread.thread)
        assert message["text"] == "Short after all." and delivered.message_ids == (message["ts"],)
        assert h.fake.calls_to("chat.delete")


async def test_auto_falls_back_to_edit_when_the_workspace_refuses_and_remembers() -> None:
    async with channel_harness(streaming="auto") as h:
        h.fake.fail_always("chat.startStream", "unknown_method")
        thread = await _mention(h)
        first = h.channel.open_stream(thread)
        await first.update("Partial")
        await first.finish("Partial and final")
        second = h.channel.open_stream(thread)
        await second.update("Another")
        await second.finish("Another answer")

        assert len(h.fake.calls_to("chat.startStream")) == 1  # not tried again for this team
        texts = [m["text"] for m in h.fake.thread("C1", thread.thread)]
        assert texts == ["Partial and final", "Another answer"]


async def test_native_mode_falls_back_per_stream_without_remembering() -> None:
    async with channel_harness(streaming="native") as h:
        h.fake.fail_always("chat.startStream", "missing_scope")
        thread = await _mention(h)
        for text in ("one", "two"):
            stream = h.channel.open_stream(thread)
            await stream.finish(text)
        assert len(h.fake.calls_to("chat.startStream")) == 2
        assert [m["text"] for m in h.fake.thread("C1", thread.thread)] == ["one", "two"]


async def test_native_streams_need_a_thread_so_a_top_level_dm_edits() -> None:
    async with channel_harness(streaming="native") as h:
        stream = h.channel.open_stream(ThreadKey("slack", "D1", ""))
        await stream.update("Hi")
        await stream.finish("Hi there")
        assert _methods(h) == ["chat.postMessage", "chat.update"]


async def test_off_posts_once_at_the_end() -> None:
    async with channel_harness(streaming="off") as h:
        thread = await _mention(h)
        stream = h.channel.open_stream(thread)
        await stream.update("a")
        h.clock.advance(5)
        await stream.update("ab")
        await stream.finish("abc")
        assert _methods(h) == ["chat.postMessage"]
        assert h.fake.thread("C1", thread.thread)[0]["text"] == "abc"


async def test_busy_sets_the_thread_status_and_clears_it() -> None:
    async with channel_harness() as h:
        thread = await _mention(h)
        await h.channel.set_busy(thread, True, reply_to=thread.thread)
        await h.channel.set_busy(thread, False, reply_to=thread.thread)
        assert [s["status"] for s in h.fake.statuses] == ["is thinking…", ""]
        assert h.fake.calls_to("reactions.add") == []


async def test_busy_falls_back_to_a_reaction_when_status_is_refused() -> None:
    async with channel_harness() as h:
        h.fake.fail_always("assistant.threads.setStatus", "missing_scope")
        root = h.fake.post_as_user("C1", "U1", "<@UBOT> please")
        thread = ThreadKey("slack", "C1", root["ts"])

        await h.channel.set_busy(thread, True, reply_to=root["ts"])
        assert h.fake.reactions == {("C1", root["ts"], "eyes")}
        await h.channel.set_busy(thread, False, reply_to=root["ts"])
        assert h.fake.reactions == set()
        await h.channel.set_busy(thread, True, reply_to=root["ts"])

        assert len(h.fake.calls_to("assistant.threads.setStatus")) == 1  # remembered
        assert h.fake.reactions == {("C1", root["ts"], "eyes")}


async def test_busy_in_a_top_level_dm_uses_a_reaction_and_never_raises() -> None:
    async with channel_harness() as h:
        message = h.fake.post_as_user("D1", "U1", "hi")
        await h.channel.set_busy(ThreadKey("slack", "D1", ""), True, reply_to=message["ts"])
        await h.channel.set_busy(ThreadKey("slack", "D1", ""), True, reply_to=message["ts"])  # already_reacted
        assert h.fake.reactions == {("D1", message["ts"], "eyes")}
        h.fake.fail_always("reactions.remove", "channel_not_found")
        await h.channel.set_busy(ThreadKey("slack", "D1", ""), False, reply_to=message["ts"])  # logged only
        assert h.fake.calls_to("assistant.threads.setStatus") == []


async def test_task_cards_start_a_stream_update_in_place_and_the_reply_continues_it() -> None:
    async with channel_harness(streaming="native") as h:
        thread = await _mention(h)
        await h.channel.show_task(thread, "c1", "shell", "in_progress", '{"command": "ls -la"}')
        await h.channel.show_task(thread, "c1", "shell", "error", '{"command": "ls -la"}')
        stream = h.channel.open_stream(thread, reply_to=thread.thread)
        await stream.update("It failed")
        await stream.finish("It failed: no such file.")
        await h.channel.set_busy(thread, False, reply_to=thread.thread)

        assert [c.method for c in h.fake.calls if c.method in STREAM_METHODS] == [
            "chat.startStream", "chat.appendStream", "chat.appendStream", "chat.stopStream"
        ]
        start = h.fake.calls_to("chat.startStream")[0].params
        assert (start["recipient_user_id"], start["task_display_mode"]) == ("U1", "timeline")
        [message] = h.fake.thread("C1", thread.thread)
        assert message["tasks"]["c1"]["status"] == "error" and message["text"] == "It failed: no such file."
        assert message["streaming"] is False
        assert all("markdown_text" not in c.params for c in h.fake.calls if c.method in STREAM_METHODS)


async def test_task_cards_stop_for_the_turn_after_a_failure_and_for_the_team_when_refused() -> None:
    async with channel_harness() as h:
        thread = await _mention(h)
        h.fake.fail_always("chat.startStream", "unknown_method")
        await h.channel.show_task(thread, "c1", "clock", "in_progress")
        await h.channel.show_task(thread, "c1", "clock", "complete")
        assert len(h.fake.calls_to("chat.startStream")) == 1
        await h.channel.set_busy(thread, False, reply_to=thread.thread)
        await h.channel.show_task(thread, "c2", "clock", "in_progress")  # the workspace cannot stream
        assert len(h.fake.calls_to("chat.startStream")) == 1
        stream = h.channel.open_stream(thread, reply_to=thread.thread)
        await stream.finish("ok")
        assert h.fake.calls_to("chat.postMessage")  # and replies are edited from now on


async def test_the_fake_refuses_a_malformed_task_chunk() -> None:
    async with channel_harness(streaming="native") as h:
        thread = await _mention(h)
        await h.channel.show_task(thread, "c1", "clock", "in_progress")
        ts = h.fake.thread("C1", thread.thread)[0]["ts"]
        bad = {"type": "task_update", "id": "c1", "title": "clock", "status": "done"}
        with pytest.raises(SlackCallError) as refused:
            await h.channel._web("chat_appendStream", channel="C1", ts=ts, chunks=[bad])
        assert refused.value.code == "invalid_chunks"


async def test_busy_marks_the_agent_session_processing_and_a_tool_names_itself_in_the_status() -> None:
    async with channel_harness() as h:
        thread = await _mention(h)
        await h.channel.set_busy(thread, True, reply_to=thread.thread)
        assert h.fake.sessions == {("C1", thread.thread): "processing"}
        await h.channel.show_task(thread, "c1", "shell", "in_progress")
        await h.channel.show_task(thread, "c1", "shell", "complete")
        await h.channel.set_busy(thread, False, reply_to=thread.thread)
        assert [(s["status"], s.get("loading_messages")) for s in h.fake.statuses] == [
            ("is thinking…", ["Thinking…", "Reading the conversation…", "Working on an answer…"]),
            ("is running shell…", ["Running shell…"]),
            ("is thinking…", ["Thinking…", "Reading the conversation…", "Working on an answer…"]),
            ("", None),
        ]
        assert h.fake.sessions == {("C1", thread.thread): "active"}


async def test_an_app_that_is_not_an_agent_keeps_its_status_line_without_sessions() -> None:
    async with channel_harness() as h:
        h.fake.fail_always("agents.sessions.setStatus", "not_allowed")
        thread = await _mention(h)
        for busy in (True, False, True, False):
            await h.channel.set_busy(thread, busy, reply_to=thread.thread)
        assert len(h.fake.calls_to("agents.sessions.setStatus")) == 1  # refused once: not asked again
        assert [s["status"] for s in h.fake.statuses] == ["is thinking…", "", "is thinking…", ""]


async def test_after_a_429_thread_reads_wait_out_retry_after_instead_of_asking_again() -> None:
    async with channel_harness(streaming="native") as h:
        h.fake.rate_limit("conversations.replies", per_s=60)
        roots = [h.fake.post_as_user("C1", "U1", f"<@UBOT> q{n}")["ts"] for n in range(4)]
        for n, root in enumerate(roots[:3]):  # a restart: this process saw none of the requests
            stream = h.channel.open_stream(ThreadKey("slack", "C1", root), reply_to=root)
            await stream.finish(f"answer {n}")
        assert len(h.fake.calls_to("conversations.replies")) == 2  # the read, the 429; then held
        assert [c.params.get("recipient_user_id") for c in h.fake.calls_to("chat.startStream")] == ["U1", None, None]
        h.clock.advance(61)  # Retry-After has passed: asked again (the fake still refuses)
        await h.channel.open_stream(ThreadKey("slack", "C1", roots[3]), reply_to=roots[3]).finish("answer 3")
        assert len(h.fake.calls_to("conversations.replies")) == 3
        assert len(h.fake.calls_to("chat.postMessage")) == 3  # no recipient: those replies were edited
