"""Strangers' commands (docs/security.md, "Who may run what" 4): `/stop`, `/new` and, in
`interrupt` mode, any message from someone not admitted are refused like any message; in a
group a member's `/stop` stops their own turn, an admin's stops anyone's."""

from __future__ import annotations

import asyncio

from fakes.llm import FakeLLM
from harness import ALICE, BOB, make_config, running_gateway

from gateway.events import Sender

CAROL = Sender("300", "Carol", "carol")
# A group nobody approved: only the people the configuration lists (here Alice, an admin) are
# answered in it; anyone else there is a stranger.
UNAPPROVED = {"dm_policy": "pairing", "group_policy": "allowlist"}


async def _stalled_turn(h, llm) -> None:  # noqa: ANN001
    await h.say("first", sender=ALICE)
    await asyncio.wait_for(llm.stalled.wait(), 20)


async def _handled(h, result) -> None:  # noqa: ANN001
    """Until the item of `result` is no longer waiting in the inbox."""
    async def done() -> bool:
        item = await h.store.inbox.get_by_event(result.event_id)
        return item is not None and item.status not in ("pending",)

    for _ in range(500):
        if await done():
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("the item was not handled")


async def test_a_strangers_stop_and_new_do_not_stop_an_admins_turn(store, tmp_path) -> None:
    async with FakeLLM() as llm:
        llm.stall()
        config = make_config(llm.base_url, str(tmp_path), access=UNAPPROVED, approvals={"admins": {"fake": ["100"]}})
        async with running_gateway(store, config) as h:
            await _stalled_turn(h, llm)
            for text in ("/stop", "/new"):
                await _handled(h, await h.say(text, sender=BOB))
            (run,) = await store.runs.list()
            assert run.stage == "RUNNING" and llm.disconnects == 0
            await h.say("/stop", sender=ALICE)  # the one who asked may
            await h.idle()
            assert h.channel.messages() == ["Stopped."]
            assert [r.stage for r in await store.runs.list()] == ["CANCELED"]


async def test_a_strangers_message_does_not_interrupt_in_interrupt_mode(store, tmp_path) -> None:
    async with FakeLLM() as llm:
        llm.stall()
        config = make_config(
            llm.base_url, str(tmp_path), access=UNAPPROVED, approvals={"admins": {"fake": ["100"]}},
            inbox={"busy_mode": "interrupt"},
        )
        async with running_gateway(store, config) as h:
            await _stalled_turn(h, llm)
            await _handled(h, await h.say("stop what you are doing", sender=BOB))
            (run,) = await store.runs.list()
            assert run.stage == "RUNNING" and llm.disconnects == 0


async def test_in_a_group_a_members_stop_stops_only_their_own_turn(store, tmp_path) -> None:
    async with FakeLLM() as llm:
        llm.stall()
        config = make_config(llm.base_url, str(tmp_path), approvals={"admins": {"fake": [CAROL.id]}})
        async with running_gateway(store, config) as h:
            await _stalled_turn(h, llm)  # Alice, a member, asked
            await _handled(h, await h.say("/stop", sender=BOB))  # another member
            await h.wait_for(lambda: bool(h.channel.messages()))
            assert "someone else" in h.channel.messages()[0]
            (run,) = await store.runs.list()
            assert run.stage == "RUNNING" and llm.disconnects == 0
            await h.say("/stop", sender=CAROL)  # an admin stops anyone's
            await h.idle()
            assert h.channel.messages()[-1] == "Stopped."
            assert [r.stage for r in await store.runs.list()] == ["CANCELED"]
