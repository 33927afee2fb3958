"""Outbox rows recorded but never sent are delivered by the sweeper, or given up with a reason;
/status and `gateway outbox` show them."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from fakes.channel import FakeChannel
from harness import make_config, running_gateway

from gateway.delivery.outbox import Outbox
from gateway.events import ChannelError, Delivered, Outbound, ThreadKey, utcnow
from gateway.store import Fence

T1 = ThreadKey("fake", "chat1", "")
SWEEP_FAST = {"sweep_after_s": 0.2, "backoff_s": 0.01, "backoff_max_s": 0.02}


class RefusingChannel(FakeChannel):
    """Sends fail (transiently) while `refusing`, permanently for texts containing "forbidden"."""

    def __init__(self) -> None:
        super().__init__(name="fake")
        self.refusing = False
        self.attempts = 0

    async def send(self, message: Outbound) -> Delivered:
        self.attempts += 1
        if "forbidden" in message.text:
            raise ChannelError("bot was blocked by the user", permanent=True)
        if self.refusing:
            raise ChannelError("HTTP 502")
        return await super().send(message)


async def test_an_intent_recorded_but_never_sent_is_delivered_once(store, llm, tmp_path):
    # A crash between the round's commit and the send leaves exactly this behind.
    await store.outbox.record("reply:7", str(T1), "message", {"text": "the lost reply", "reply_to": ""})
    config = make_config(llm.base_url, str(tmp_path), outbox=SWEEP_FAST)
    async with running_gateway(store, config) as h:
        await h.wait_for(lambda: h.channel.messages(T1) == ["the lost reply"], timeout=20)
        await asyncio.sleep(0.5)  # later sweeps find nothing left
        assert h.channel.messages(T1) == ["the lost reply"]
    row = await store.outbox.get("reply:7")
    assert row.status == "sent" and row.message_ids
    # Its sender may have been cut mid-request (the platform carried the send out, nothing was
    # written of it): the resend is listed as possibly a second copy.
    assert row.uncertain and "stopped before recording" in row.uncertain
    assert [r.key for r in await store.outbox.uncertain()] == ["reply:7"]


async def test_retries_exhausted_are_swept_later_and_a_permanent_failure_is_given_up(store, llm, tmp_path):
    channel = RefusingChannel()
    config = make_config(llm.base_url, str(tmp_path), outbox={**SWEEP_FAST, "max_attempts": 2})
    async with running_gateway(store, config, channel) as h:
        channel.refusing = True
        outbox: Outbox = h.gateway.outbox
        for key, text in (("k-retry", "try again later"), ("k-blocked", "forbidden words")):
            try:
                await outbox.send_text(T1, text, key=key)
            except ChannelError:
                pass
        assert (await store.outbox.get("k-retry")).status == "pending"
        assert (await store.outbox.get("k-blocked")).status == "failed"
        channel.refusing = False
        await h.wait_for(lambda: channel.messages(T1) == ["try again later"], timeout=20)
    retried = await store.outbox.get("k-retry")
    assert retried.status == "sent" and retried.uncertain is None  # its sender gave up: no attempt was cut
    blocked = await store.outbox.get("k-blocked")
    assert blocked.status == "failed" and "blocked" in blocked.error


async def test_a_prompt_whose_sender_died_mid_request_is_resent_once_and_listed(store, llm, tmp_path):
    """Killed while the platform carried out its send (a slow answer, a timeout): nothing says
    what became of it. The sweeper sends it again, says so on the row, and a timeout of that
    resend is not sent a third time."""
    prompt = {"kind": "notice", "thread": str(T1), "key": "pairing:1:42", "text": "Access request", "buttons": []}
    await store.outbox.record("pairing:1:42", str(T1), "prompt", prompt)
    channel = TimingOutChannel()
    config = make_config(llm.base_url, str(tmp_path), outbox=SWEEP_FAST)
    async with running_gateway(store, config, channel) as h:
        await h.wait_for(lambda: channel.prompts_tried == 1, timeout=20)
        await asyncio.sleep(0.6)  # later sweeps leave it alone
    row = await store.outbox.get("pairing:1:42")
    assert channel.prompts_tried == 1
    assert row.status == "failed" and "not sent a third time" in row.uncertain


class TimingOutChannel(FakeChannel):
    def __init__(self) -> None:
        super().__init__(name="fake")
        self.prompts_tried = 0

    async def send_prompt(self, prompt):  # noqa: ANN001, ANN201
        self.prompts_tried += 1
        raise ChannelError("Timed out", ambiguous=True)


async def test_a_row_older_than_the_give_up_age_is_given_up_with_the_reason(store, llm, tmp_path):
    channel = RefusingChannel()
    channel.refusing = True
    config = make_config(llm.base_url, str(tmp_path), outbox={**SWEEP_FAST, "max_attempts": 1, "give_up_after_s": 0.5})
    async with running_gateway(store, config, channel) as h:
        try:
            await h.gateway.outbox.send_text(T1, "never", key="k1")
        except ChannelError:
            pass

        async def given_up() -> bool:
            return (await store.outbox.get("k1")).status == "failed"

        for _ in range(200):
            if await given_up():
                break
            await asyncio.sleep(0.05)
    row = await store.outbox.get("k1")
    assert row.status == "failed" and row.error.startswith("given up by the sweeper after")
    assert channel.messages(T1) == []


async def test_status_shows_messages_not_delivered_yet(store, llm, tmp_path):
    await store.outbox.record("reply:9", str(T1), "message", {"text": "stuck", "reply_to": ""})
    config = make_config(llm.base_url, str(tmp_path), outbox={"sweep_after_s": 3600})
    async with running_gateway(store, config) as h:
        await h.say("/status")
        await h.idle()
        (status,) = h.channel.messages(T1)
        assert "Messages not delivered yet: 1" in status


async def test_a_chat_on_hold_says_until_when_in_status(store, llm, tmp_path):
    config = make_config(llm.base_url, str(tmp_path))
    async with running_gateway(store, config) as h:
        await store.outbox.record("reply:9", str(T1), "message", {"text": "held", "reply_to": ""})
        row = await store.outbox.get("reply:9")
        await store.outbox.attempt_failed(row.id, "flood", final=False, retry_at=_in_seconds(90))
        await h.say("/status")
        await h.idle()
        status = h.channel.messages(T1)[-1]
        assert "Messages not delivered yet: 1" in status and "next attempt at" in status


def _in_seconds(seconds: float):  # noqa: ANN202
    from datetime import timedelta

    from gateway.events import utcnow

    return utcnow() + timedelta(seconds=seconds)


async def test_outbox_cli_lists_undelivered_and_uncertain_rows(store, tmp_path, capsys):
    from gateway.cli.outbox import print_outbox

    await store.outbox.record("reply:1", str(T1), "message", {"text": "stuck", "reply_to": ""})
    await store.outbox.record("reply:2", str(T1), "message", {"text": "twice?", "reply_to": ""})
    row = await store.outbox.get("reply:2")
    await store.outbox.attempt_failed(row.id, "timed out", final=False, uncertain="timed out, may have been delivered")
    await store.outbox.mark_sent(row.id, ["5"])
    print_outbox(await store.outbox.undelivered(), await store.outbox.uncertain())
    out = capsys.readouterr().out
    assert "reply:1" in out and "not delivered" in out
    assert "reply:2" in out and "may have been delivered" in out


async def test_the_sweeper_never_frees_a_thread_its_own_instance_is_working_on(store, tmp_path):
    """Under the instance's own name, taking the thread's lease would extend the worker's, and
    releasing it after the sweep would free the thread under the worker's running turn."""
    from gateway.config import OutboxConfig
    from gateway.inbox.sweeper import OutboxSweeper

    await store.outbox.record("reply:8", str(T1), "message", {"text": "left behind", "reply_to": ""})
    worker = await store.inbox.acquire(f"thread:{T1}", "gw1", 30)  # this instance's worker holds it
    channel = FakeChannel()
    sweeper = OutboxSweeper(
        store, Outbox(store, {"fake": channel}), OutboxConfig(sweep_after_s=0.05), instance_id="gw1", lease_ttl_s=30
    )
    await asyncio.sleep(0.1)

    await sweeper.sweep()

    holder = await store.inbox.lease_holder(f"thread:{T1}")
    assert holder is not None and (holder.owner, holder.fence) == ("gw1", worker.fence)
    assert channel.messages(T1) == []  # the worker delivers what its turn recorded


async def test_a_reply_left_in_a_flood_wait_by_an_earlier_holder_goes_before_the_next_answer(store, llm, tmp_path):
    """An instance stopped while its reply waited out the chat's flood wait left the row pending;
    the next message is answered by another holder of the thread. Both wait for the same hold,
    and the earlier reply arrives first (the sweeper would take it only long after)."""
    earlier = await store.inbox.acquire(f"thread:{T1}", "stopped-instance", 30)
    fence = Fence(earlier.name, earlier.owner, earlier.fence)
    await store.outbox.record("reply:earlier", str(T1), "message", {"text": "the first answer", "reply_to": ""},
                              fence=fence)
    elsewhere = ThreadKey("fake", "admin-dm", "")  # an approval card into another chat, under that lease
    await store.outbox.record("prompt:elsewhere", str(elsewhere), "message", {"text": "card", "reply_to": ""},
                              fence=fence)
    await store.inbox.release(earlier)  # a graceful stop hands the thread back
    held_until = utcnow() + timedelta(seconds=3)  # still held when the worker starts, even on a busy machine
    await store.holds.hold("fake:chat1", held_until)
    llm.reply("the second answer")
    config = make_config(llm.base_url, str(tmp_path), outbox={"sweep_after_s": 3600})
    async with running_gateway(store, config) as h:
        await h.say("and then?")
        await h.wait_for(lambda: len(h.channel.messages(T1)) == 2, timeout=20)
        await h.idle()
        assert utcnow() >= held_until
    assert h.channel.messages(T1) == ["the first answer", "the second answer"]
    assert (await store.outbox.get("reply:earlier")).status == "sent"
    assert h.channel.messages(elsewhere) == []  # not this thread's to send
    assert (await store.outbox.get("prompt:elsewhere")).status == "pending"


async def test_a_swept_copy_of_an_approval_in_a_deciders_dm_is_noted_among_its_copies(store, llm, tmp_path):
    """A copy's row is keyed prompt:<id>:<person>: delivered by the sweeper, it joins the prompt's
    copies (so deciding closes it too) instead of failing on its key."""
    session = await store.sessions.open(str(T1), source="fake")
    prompt, _ = await store.prompts.create(
        kind="approval", session_id=session.id, thread_key=str(T1), payload={"copies": [["fake:other:", ["5"]]]},
        requested_by="", expires_at=None,
    )
    dm = ThreadKey("fake", "admin", "")
    card = {"kind": "approval", "thread": str(dm), "key": f"prompt:{prompt.id}:admin", "text": "Allow?", "buttons": []}
    await store.outbox.record(f"prompt:{prompt.id}:admin", str(dm), "prompt", card)
    config = make_config(llm.base_url, str(tmp_path), outbox=SWEEP_FAST)
    async with running_gateway(store, config) as h:
        await h.wait_for(lambda: len(h.channel.prompts(dm)) == 1, timeout=20)
        for _ in range(100):  # the sweep notes the copy once its send is recorded
            copies = (await store.prompts.get(prompt.id)).payload["copies"]
            if len(copies) == 2:
                break
            await asyncio.sleep(0.05)
    assert (await store.outbox.get(f"prompt:{prompt.id}:admin")).status == "sent"
    assert copies[0] == ["fake:other:", ["5"]] and copies[1][0] == str(dm) and copies[1][1]


async def test_swept_cards_of_two_deciders_in_one_group_are_both_noted_with_their_receiver(store, llm, tmp_path):
    """Cards only one person sees in the group (`Prompt.receiver`, keyed prompt:<id>:in-chat:<person>)
    share the group's thread key: each keeps its place among the copies, the DM copy its own."""
    session = await store.sessions.open(str(T1), source="fake")
    prompt, _ = await store.prompts.create(
        kind="approval", session_id=session.id, thread_key=str(T1), payload={"copies": [["fake:admin:", ["5"], ""]]},
        requested_by="", expires_at=None,
    )
    for person in ("admin", "other"):
        key = f"prompt:{prompt.id}:in-chat:{person}"
        card = {"kind": "approval", "thread": str(T1), "key": key, "text": "Allow?", "buttons": [], "receiver": person}
        await store.outbox.record(key, str(T1), "prompt", card)
    config = make_config(llm.base_url, str(tmp_path), outbox=SWEEP_FAST)
    async with running_gateway(store, config) as h:
        await h.wait_for(lambda: len(h.channel.prompts(T1)) == 2, timeout=20)
        for _ in range(100):
            copies = (await store.prompts.get(prompt.id)).payload["copies"]
            if len(copies) == 3:
                break
            await asyncio.sleep(0.05)
    assert [p.receiver for p in h.channel.prompts(T1)] == ["admin", "other"]
    assert copies[0] == ["fake:admin:", ["5"], ""]
    assert sorted((c[0], c[2]) for c in copies[1:]) == [(str(T1), "admin"), (str(T1), "other")]
