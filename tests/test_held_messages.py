"""A message that arrives while an approval is pending is held, and goes back to the queue when
the approval is decided, also when the decision lands between reading the pending prompts and
holding the message (another instance handled the button): it is never held for a decided prompt."""

from __future__ import annotations

import pytest
from fakes.llm import FakeLLM
from harness import make_config, running_gateway

from gateway.events import ThreadKey
from gateway.store import Fence, LeaseLost, NewItem

THREAD = "slack:C1:1700000000.000001"


async def waiting_prompt_and_message(store):  # noqa: ANN001, ANN201
    session = await store.sessions.open(THREAD, source="fake")
    prompt, _ = await store.prompts.create(
        kind="approval", session_id=session.id, thread_key=THREAD, payload={}, requested_by="U1", expires_at=None
    )
    await store.inbox.add([NewItem("e1", THREAD, "message", {"text": "next question"})])
    return prompt, (await store.inbox.pending(THREAD))[0]


async def approve(store, prompt_id: int) -> None:  # noqa: ANN001
    decision = await store.prompts.decide(prompt_id, status="approved", decision="a", decided_by="U1")
    assert decision.outcome == "decided"


async def test_a_message_held_for_a_pending_approval_goes_back_to_the_queue_when_it_is_decided(store):
    prompt, item = await waiting_prompt_and_message(store)

    assert await store.inbox.hold_while_waiting(item.id, [prompt.id])
    assert (await store.inbox.get_by_event("e1")).status == "held"
    await approve(store, prompt.id)

    assert (await store.inbox.get_by_event("e1")).status == "pending"


async def test_a_message_is_not_held_for_an_approval_decided_after_the_worker_read_it(store):
    prompt, item = await waiting_prompt_and_message(store)
    seen = await store.prompts.pending(thread_key=THREAD)  # the worker sees the approval pending ...
    await approve(store, prompt.id)  # ... the button is handled meanwhile (it releases nothing yet)

    held = await store.inbox.hold_while_waiting(item.id, [p.id for p in seen])

    assert not held  # so the worker handles the message now
    assert (await store.inbox.get_by_event("e1")).status == "pending"


async def test_a_message_read_before_the_decision_is_answered_after_the_resumed_turn(store, tmp_path):
    """The worker picked the message while the approval was pending; the tap was taken (on any
    instance) before it looked at the prompts: the message waits for the resumed turn, or it
    would be answered ahead of it, from a history that lacks the decided call's result."""
    async with FakeLLM() as llm:
        llm.tool_call("write_file", {"path": "a.txt", "content": "a"}, id="w1")
        llm.reply("written")
        llm.reply("the second answer")
        config = make_config(llm.base_url, str(tmp_path / "ws"), inbox={"busy_mode": "queue"})
        async with running_gateway(store, config) as h:
            thread = ThreadKey("fake", "chat1", "")
            await h.say("write it")
            await h.idle()  # parked on the approval
            lease = await store.inbox.acquire(f"thread:{thread}", "elsewhere", 30)  # the dispatcher keeps off
            await h.say("next question")
            (item,) = await store.inbox.pending(str(thread))  # the worker has read it ...
            assert not (await h.tap(h.token(0, "✅"))).alert  # ... the tap lands before it reads the prompts
            await h.gateway.inbox.worker.handle(thread, item, Fence(lease.name, lease.owner, lease.fence))
            assert len(await store.runs.list()) == 1 and len(llm.requests) == 1  # no turn for it yet
            await store.inbox.release(lease)
            await h.wait_for(lambda: len(h.channel.messages()) == 2)
            await h.idle()
            assert h.channel.messages() == ["written", "the second answer"]


async def test_a_message_is_held_for_a_pairing_only_under_its_threads_lease_and_while_pending(store):
    """Like the other writes of a worker, fenced (a holder that lost the thread holds nothing);
    and conditional on the request: once decided, the message is not held (it would stay held)."""
    outcome = await store.access.request(
        kind="user", channel="slack", subject="U9", name="Sam", thread_key=THREAD, ttl_s=600, max_pending=10
    )
    await store.inbox.add([NewItem("e9", THREAD, "message", {"text": "hi"})])
    (item,) = await store.inbox.pending(THREAD)
    old = await store.inbox.acquire(f"thread:{THREAD}", "a", 30)
    await store.inbox.release(old)
    new = await store.inbox.acquire(f"thread:{THREAD}", "b", 30)

    with pytest.raises(LeaseLost):
        await store.inbox.hold_for_access(item.id, outcome.request.id, fence=Fence(old.name, old.owner, old.fence))
    assert (await store.inbox.get_by_event("e9")).status == "pending"
    fence = Fence(new.name, new.owner, new.fence)
    assert await store.inbox.hold_for_access(item.id, outcome.request.id, fence=fence) == "held"
    await store.access.decide(outcome.request.id, approve=True, decided_by="cli")
    assert (await store.inbox.get_by_event("e9")).status == "pending"  # the approval released it
    assert await store.inbox.hold_for_access(item.id, outcome.request.id, fence=fence) == "approved"
    assert (await store.inbox.get_by_event("e9")).status == "pending"
