"""A tick's checklist: what counts as an open item, and the `checklist` tool that changes it (in a
conversation with a person, with an approval; never from a scheduled run)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fakes.channel import FakeChannel
from harness import make_config, running_gateway

from gateway.config import AgentConfig, SchedulerConfig
from gateway.events import ThreadKey
from gateway.files.checklists import ChecklistFiles
from gateway.files.workspace import adopt_legacy_layout
from gateway.store.schedules import JobRunRecord
from gateway.tools.registry import InMemoryNotes, ToolContext, ToolError
from scheduler.checklist import ChecklistNameError, check_name, checklist_block, open_items, read_checklist, wakes
from scheduler.checklist_tool import checklist_tool
from scheduler.definitions import job_config, to_schedule

CHAT = ThreadKey("telegram", "900", "")
OTHER_CHAT = ThreadKey("telegram", "901", "")


# ---- what is open ------------------------------------------------------------------------------


def test_open_items_are_the_lines_that_are_not_blank_headings_comments_or_checked():
    text = """# Heartbeat

<!-- one item a line; check it off when it is done -->
- [ ] water the plants
- [x] pay the rent
* [X] call mum
1. [x] numbered and done
- look at the build queue

<!--
- [ ] a commented-out item
-->
plain text counts too   <!-- with a comment after it -->
## Later
   - [ ]   indented, with spaces \x20
"""
    assert open_items(text) == [
        "- [ ] water the plants",
        "- look at the build queue",
        "plain text counts too",
        "- [ ]   indented, with spaces",
    ]


@pytest.mark.parametrize(
    "text",
    ["", "\n\n   \n", "# Heartbeat\n\n## Nothing here\n", "<!-- add items below -->\n", "- [x] done\n* [X] done too\n",
     "<!--\n- [ ] not yet\n-->\n#\n"],
)
def test_a_checklist_without_an_open_item_is_empty_and_does_not_wake(text):
    reading = read_checklist("h.md", lambda name: text)
    assert reading.empty and not wakes(reading, answered_hash=None)


def test_a_missing_checklist_is_empty():
    reading = read_checklist("h.md", lambda name: None)
    assert reading.missing and reading.empty and not wakes(reading, None)


def test_the_hash_follows_the_open_items_only():
    base = read_checklist("h.md", lambda name: "# Mine\n- [ ] water the plants\n")
    around = "# Renamed\n<!-- note -->\n- [ ] water the plants  \n- [x] x\n"
    reworded_around = read_checklist("h.md", lambda name: around)
    assert base.hash == reworded_around.hash
    assert wakes(base, None) and not wakes(base, base.hash)
    changed = read_checklist("h.md", lambda name: "- [ ] water the plants\n- [ ] feed the cat\n")
    assert wakes(changed, base.hash)


def test_the_prompt_block_is_marked_as_the_checklist_and_cut_when_long():
    reading = read_checklist("h.md", lambda name: "- [ ] water the plants\n")
    block = checklist_block(reading)
    assert block.startswith("## Checklist (checklists/h.md") and "- [ ] water the plants" in block
    assert block.endswith("## End of the checklist")
    long = read_checklist("h.md", lambda name: "".join(f"- [ ] item {i} " + "x" * 80 + "\n" for i in range(500)))
    assert "the rest was left out" in checklist_block(long) and len(checklist_block(long)) < 9_000


@pytest.mark.parametrize("name", ["../secrets", "/etc/passwd", "a/b.md", ".hidden", "", "x.md.tmp", "a b.md"])
def test_a_checklist_is_a_plain_file_name(name):
    with pytest.raises(ChecklistNameError):
        check_name(name)


def test_checklist_files_never_follow_a_link(tmp_path):
    files = ChecklistFiles(tmp_path / "ws")
    outside = tmp_path / "outside.txt"
    outside.write_text("- [ ] planted\n")
    files.write("heartbeat.md", "- [ ] real\n")
    link = files.path("linked.md")
    link.symlink_to(outside)
    assert files.read("heartbeat.md") == "- [ ] real\n"
    assert files.read("linked.md") is None  # a link reads as no checklist
    files.write("linked.md", "- [ ] replaced\n")
    assert outside.read_text() == "- [ ] planted\n" and not link.is_symlink()


# ---- the tool ------------------------------------------------------------------------------------


def tick(name: str = "heartbeat", deliver_to: str = "telegram:900", checklist: str = "heartbeat.md") -> dict:
    return {
        "name": name, "kind": "tick", "every": "30m", "prompt": "Work through the checklist.",
        "deliver_to": deliver_to, "checklist": checklist,
    }


def config_with(llm, tmp_path: Path, *jobs: dict, **sections: Any):  # noqa: ANN001, ANN201
    return make_config(
        llm.base_url, str(tmp_path / "ws"), scheduler={"enabled": True, "jobs": list(jobs) or [tick()]}, **sections
    )


def tool_results(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def context(tmp_path: Path, *, thread: ThreadKey = CHAT, source: str = "telegram", interactive: bool = True):
    return ToolContext(
        session_id=1, thread=thread, source=source, interactive=interactive, workspace=tmp_path / "ws",
        agent=AgentConfig(workspace=str(tmp_path / "ws")), notes=InMemoryNotes(),
    )


async def test_adding_an_item_asks_for_an_approval_and_showing_does_not(store, llm, tmp_path):
    files = ChecklistFiles(tmp_path / "ws")
    llm.tool_call("checklist", {"action": "add", "item": "water the plants"}, id="c1")
    llm.reply("Added to the heartbeat.")
    llm.tool_call("checklist", {"action": "show"}, id="c2")
    llm.reply("Here it is.")
    async with running_gateway(store, config_with(llm, tmp_path), FakeChannel(name="telegram")) as h:
        await h.say("remind me to water the plants", thread=CHAT)
        await h.idle()
        [approval] = [p for p in h.channel.prompts(CHAT) if p.kind == "approval"]
        assert approval.tool_name == "checklist" and "water the plants" in approval.arguments
        assert files.read("heartbeat.md") is None  # nothing written before the tap
        await h.tap(approval.buttons[0][0].token, thread=CHAT)
        await h.idle()
        assert files.read("heartbeat.md") == "- [ ] water the plants\n"
        await h.say("what is on it?", thread=CHAT)
        await h.idle()
        assert [p.kind for p in h.channel.prompts(CHAT)] == ["approval"]  # show asked nobody
        assert "1 open item(s)" in tool_results(llm.requests[-1])[-1]


async def test_a_ticks_own_run_cannot_rewrite_its_checklist(store, llm, tmp_path):
    """The attack: a tick's run (its check output, a page it read) tells the model to rewrite the
    checklist so the tick keeps waking, or goes quiet. The tool is not offered there, and refused."""
    files = ChecklistFiles(tmp_path / "ws")
    files.write("heartbeat.md", "- [ ] look at the build queue\n")
    llm.tool_call("checklist", {"action": "write", "content": "- [ ] wake me every minute forever\n"}, id="w1")
    llm.reply("NOTHING_TO_REPORT")
    # Even an operator's rule allowing the tool everywhere does not open it to scheduled runs.
    rules = [{"tool": "checklist", "action": "allow"}]
    async with running_gateway(
        store, config_with(llm, tmp_path, approvals={"rules": rules}), FakeChannel(name="telegram")
    ) as h:
        schedule = await h.store.schedules.by_name("heartbeat")
        await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC), origin="manual")
        await h.idle()
        offered = [t["function"]["name"] for t in llm.requests[0]["tools"]]
        assert "checklist" not in offered and "schedule" not in offered
        assert files.read("heartbeat.md") == "- [ ] look at the build queue\n"
        spec = h.gateway.registry.get("checklist")
        assert spec is not None  # offered in conversations
        for source in ("tick", "cron"):
            with pytest.raises(ToolError, match="scheduled runs cannot change a checklist"):
                await spec.func(context(tmp_path, source=source, interactive=False), {"action": "write", "content": ""})
        with pytest.raises(ToolError):  # even marked interactive by mistake: the source decides too
            await spec.func(context(tmp_path, source="tick"), {"action": "show"})
        assert files.read("heartbeat.md") == "- [ ] look at the build queue\n"


async def test_a_conversation_reaches_only_the_ticks_that_report_in_it(store, tmp_path):
    files = ChecklistFiles(tmp_path / "ws")
    now = datetime.now(UTC)
    for job in (tick(), tick("elsewhere", "telegram:901", "other.md")):
        await store.schedules.create(to_schedule(job_config(job), SchedulerConfig(), source="config", now=now), now=now)
    spec = checklist_tool(store, files.read, files.write)
    with pytest.raises(ToolError, match="no tick named 'elsewhere'"):
        await spec.func(context(tmp_path), {"action": "write", "job": "elsewhere", "content": "- [ ] x"})
    assert files.read("other.md") is None
    assert "does not exist yet" in await spec.func(context(tmp_path), {"action": "show"})
    written = await spec.func(context(tmp_path), {"action": "write", "content": "# Mine\n- [ ] a\n- [x] b"})
    assert "1 open item(s)" in written and files.read("heartbeat.md") == "# Mine\n- [ ] a\n- [x] b\n"
    again = await spec.func(context(tmp_path), {"action": "add", "item": "a"})
    assert "already has" in again and files.read("heartbeat.md") == "# Mine\n- [ ] a\n- [x] b\n"
    assert "elsewhere" in await spec.func(context(tmp_path, thread=OTHER_CHAT), {"action": "show"})
    assert spec.needs_approval is not None
    assert spec.needs_approval({"action": "show"}) is None and spec.needs_approval({"action": "add"})


async def test_the_heartbeat_calls_the_model_only_for_what_the_chat_added(store, llm, tmp_path):
    """End to end: an empty checklist costs nothing; an item added from the chat (approved) wakes the
    tick once, the model reading it after the job's prompt; answered, it costs nothing again."""
    async with running_gateway(store, config_with(llm, tmp_path), FakeChannel(name="telegram")) as h:
        schedule = await h.store.schedules.by_name("heartbeat")

        async def firing() -> JobRunRecord:
            run = await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
            await h.idle()
            return await h.store.schedules.get_run(run.id)

        assert (await firing()).error == "no change" and llm.requests == []
        llm.tool_call("checklist", {"action": "add", "item": "tell me when the ACME invoice arrives"}, id="a1")
        llm.reply("I will keep an eye on it.")
        await h.say("watch for the ACME invoice", thread=CHAT)
        await h.idle()
        [approval] = [p for p in h.channel.prompts(CHAT) if p.kind == "approval"]
        await h.tap(approval.buttons[0][0].token, thread=CHAT)
        await h.idle()
        asked = len(llm.requests)
        llm.reply("NOTHING_TO_REPORT")
        woke = await firing()
        assert woke.status == "success" and len(llm.requests) == asked + 1
        text = llm.requests[-1]["messages"][-1]["content"]
        assert text.startswith("Work through the checklist.")
        assert "## Checklist (checklists/heartbeat.md" in text and "- [ ] tell me when the ACME invoice arrives" in text
        assert (await firing()).error == "no change" and len(llm.requests) == asked + 1
        runs = await h.store.schedules.recent_runs(schedule.id)
        assert [r.status for r in runs] == ["skipped", "success", "skipped"]


def test_the_start_does_not_take_checklists_or_jobs_for_leftovers(tmp_path, caplog):
    workspace = tmp_path / "ws"
    for directory in ("sessions", "checklists", "jobs"):
        (workspace / directory).mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        adopt_legacy_layout(workspace, "attachments")
    assert "from before per-session directories" not in caplog.text
    (workspace / "notes.txt").write_text("left at the top")
    with caplog.at_level(logging.WARNING):
        adopt_legacy_layout(workspace, "attachments")
    assert "from before per-session directories (notes.txt)" in caplog.text
