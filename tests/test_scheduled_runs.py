"""Scheduled runs end to end: a firing runs a headless turn whose result reaches the chat;
approvals are auto-denied, and "Run again with approval" runs the job interactively."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fakes.channel import FakeChannel
from harness import make_config, running_gateway
from helpers import session_file

from gateway.events import ThreadKey

CHAT = ThreadKey("telegram", "900", "")
JOB = {
    "name": "nightly",
    "kind": "cron",
    "cron": "0 3 * * *",
    "prompt": "Write the nightly report.",
    "deliver_to": "telegram:900",
}


def scheduled_config(llm, tmp_path, **job):  # noqa: ANN001, ANN201
    return make_config(llm.base_url, str(tmp_path / "ws"), scheduler={"enabled": True, "jobs": [{**JOB, **job}]})


async def fire(h, name: str = "nightly"):  # noqa: ANN001, ANN201
    schedule = await h.store.schedules.by_name(name)
    run = await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
    await h.idle()
    return schedule, run


async def test_a_firing_runs_a_headless_session_and_delivers_the_result(store, llm, tmp_path):
    llm.reply("All systems nominal.")
    async with running_gateway(store, scheduled_config(llm, tmp_path), FakeChannel(name="telegram")) as h:
        schedule, job_run = await fire(h)
        await h.wait_for(lambda: bool(h.channel.messages(CHAT)))
        delivered = h.channel.messages(CHAT)
        assert delivered == ["⏰ **nightly**\n\nAll systems nominal."]
        session = await store.sessions.get((await store.runs.list())[0].session_id)
        assert (session.kind, session.interactive, session.ephemeral) == ("cron", False, True)
        await h.wait_for(lambda: True)
        recorded = (await store.schedules.recent_runs(schedule.id))[0]
        assert recorded.id == job_run.id and recorded.status == "success" and recorded.delivered


async def test_auto_denied_calls_are_listed_and_run_again_with_approval(store, llm, tmp_path):
    def report() -> Path:  # each run is a session of its own, with its own directory
        return session_file(tmp_path / "ws", "report.txt")

    llm.tool_call("write_file", {"path": "report.txt", "content": "night"}, id="w1")
    llm.reply("I could not write the report.")
    # Nobody has talked in the target chat: "Run again" is for its admins (or approvers).
    config = scheduled_config(llm, tmp_path)
    config.approvals.admins["telegram"] = ["100"]
    async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
        await fire(h)
        await h.wait_for(lambda: bool(h.channel.prompts(CHAT)))
        assert not report().exists()  # the side-effecting tool never ran
        notice = h.channel.prompts(CHAT)[0]
        assert notice.kind == "notice" and "write_file" in notice.text
        rerun = notice.buttons[0][0]
        assert rerun.label == "🔁 Run again with approval"
        # Tapping it runs the job once, interactively, in that chat: now the approval can be given.
        llm.tool_call("write_file", {"path": "report.txt", "content": "night"}, id="w2")
        llm.reply("Report written.")
        await h.tap(rerun.token, thread=CHAT)
        await h.idle()
        approval = [p for p in h.channel.prompts(CHAT) if p.kind == "approval"]
        assert approval and approval[0].tool_name == "write_file"
        await h.tap(approval[0].buttons[0][0].token, thread=CHAT)
        await h.idle()
        assert report().read_text() == "night"
        assert h.channel.messages(CHAT)[-1] == "Report written."
        again = await h.tap(rerun.token, thread=CHAT)
        assert again.alert  # one tap, one rerun


async def test_a_quiet_tick_delivers_nothing(store, llm, tmp_path):
    llm.reply("NOTHING_TO_REPORT")
    config = scheduled_config(llm, tmp_path, kind="tick", cron=None, every="30m", name="watch")
    async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
        await fire(h, "watch")
        assert h.channel.messages(CHAT) == []
        assert "NOTHING_TO_REPORT" in llm.requests[0]["messages"][-2]["content"] or any(
            "NOTHING_TO_REPORT" in (m.get("content") or "") for m in llm.requests[0]["messages"]
        )
        run = (await store.runs.list())[0]
        assert run.stage == "SUCCESS"


async def test_a_run_just_claimed_elsewhere_is_not_taken_for_a_crashed_one(store, llm, tmp_path):
    """A leader's start-up recovery must not fail a run another claimer is still handing over."""
    async with running_gateway(store, scheduled_config(llm, tmp_path), FakeChannel(name="telegram")) as h:
        schedule = await store.schedules.by_name("nightly")
        claimed = await store.schedules.claim(schedule.id, datetime.now(UTC))  # no prompt queued yet
        assert await h.gateway.scheduler.close_abandoned_runs() == []
        assert (await store.schedules.get_run(claimed.id)).status == "running"
