"""The audit trail through the real paths: every tool call with who asked, who or which rule
decided and how (button, CLI, auto-deny, policy, expiry, /stop), redacted arguments, the outcome;
and `gateway audit` reading it back."""

from __future__ import annotations

import io
import json

from harness import ALICE, make_config, running_gateway
from helpers import session_file

from gateway.__main__ import build_parser
from gateway.cli import approvals as approvals_cli
from gateway.cli import audit as audit_cli
from gateway.events import InboundMessage, Sender, ThreadKey, utcnow

T1 = ThreadKey("fake", "chat1", "")


async def audit_cli_run(store, *argv: str) -> str:  # noqa: ANN001
    out = io.StringIO()
    assert await audit_cli.run(build_parser().parse_args(["audit", *argv]), store, out) == 0
    return out.getvalue()


async def test_a_call_approved_by_button_and_one_allowed_by_the_defaults(store, llm, tmp_path):
    llm.tool_call("clock", {}, id="c1")
    llm.tool_call("write_file", {"path": "n.txt", "content": "Authorization: Bearer abcdefghijklmnop"}, id="w1")
    llm.reply("Written.")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("what time is it, then write a note")
        await h.idle()
        assert await store.audit.list_audit(tool="write_file") == []  # parked: nothing decided yet
        await h.tap(h.token(0, "✅"))
        await h.idle()

    write, clock = await store.audit.list_audit(kind="tool_call")
    assert (clock.tool, clock.action, clock.decided_by, clock.via, clock.outcome) == (
        "clock", "allowed", "approvals defaults", "policy", "done"
    )
    assert clock.actor == "fake:100" and clock.thread_key == str(T1) and clock.run_id is not None
    assert (write.action, write.decided_by, write.via, write.outcome) == ("approved", "fake:100", "button", "done")
    assert write.arguments == {"path": "n.txt", "content": "Authorization: Bearer [redacted]"}
    written = session_file(tmp_path / "ws", "n.txt")
    assert written.read_text() == "Authorization: Bearer abcdefghijklmnop"  # only the trail


async def test_a_denial_by_the_cli_and_an_expiry(store, llm, tmp_path, clock):
    llm.tool_call("write_file", {"path": "a.txt", "content": "a"}, id="w1")
    llm.reply("Denied, fine.")
    llm.tool_call("write_file", {"path": "b.txt", "content": "b"}, id="w2")
    llm.reply("Expired, fine.")
    config = make_config(llm.base_url, str(tmp_path / "ws"), approvals={"expire_after": "1h"})
    async with running_gateway(store, config, clock=clock) as h:
        await h.say("write a")
        await h.idle()
        (pending,) = await store.prompts.pending(kind="approval")
        out = io.StringIO()
        args = build_parser().parse_args(["approvals", "deny", str(pending.id)])
        assert await approvals_cli.run(args, store, out) == 0 and "decided" in out.getvalue()
        await h.idle()
        await h.say("write b")
        await h.idle()
        clock.advance(3600)
        assert await h.gateway.prompts.expire_due() == 1
        await h.idle()

    expired, denied = await store.audit.list_audit(tool="write_file")
    assert (denied.action, denied.decided_by, denied.via, denied.outcome) == ("rejected", "cli", "cli", "rejected")
    assert (expired.action, expired.decided_by, expired.via, expired.outcome) == (
        "expired", None, "expiry", "rejected"
    )


async def test_an_unattended_session_auto_denies_and_a_stop_cancels(store, llm, tmp_path):
    llm.tool_call("write_file", {"path": "cron.txt", "content": "password=hunter2"}, id="w1")
    llm.reply("Could not write.")
    llm.tool_call("write_file", {"path": "later.txt", "content": "y"}, id="w2")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        thread = ThreadKey("cron", "nightly", "1")
        await store.sessions.open(
            str(thread), source="cron", kind="cron", interactive=False, ephemeral=True, fresh=True
        )
        await h.gateway.submit([InboundMessage(thread, Sender("scheduler", "scheduler"), "write it", "job:1")])
        await h.idle()
        await h.say("write later")
        await h.idle()
        await h.say("/stop")
        await h.idle()

    canceled, denied = await store.audit.list_audit(tool="write_file")
    assert (denied.action, denied.decided_by, denied.via, denied.outcome) == (
        "auto_denied", "auto-deny", "auto", "rejected"
    )
    assert denied.actor == "cron:scheduler" and denied.arguments["content"] == "password=[redacted]"
    assert (canceled.action, canceled.outcome, canceled.detail["reason"]) == ("canceled", "cancelled", "/stop")


async def test_gateway_audit_filters_and_prints(store, llm, tmp_path):
    llm.tool_call("clock", {}, id="c1")
    llm.reply("Noon.")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("time?")
        await h.idle()
    await store.audit.record_console_action(user="console:ann", action="login")

    text = await audit_cli_run(store, "--since", "1h")
    lines = text.splitlines()
    assert len(lines) == 2 and "console_login" in lines[0] and "clock" in lines[1] and "by fake:100" in lines[1]
    assert "decided by approvals defaults (policy) -> done" in lines[1]
    assert (await audit_cli_run(store, "--user", ALICE.id)).count("clock") == 1  # the bare id matches too
    assert await audit_cli_run(store, "--tool", "shell") == "no audit entries\n"
    assert await audit_cli_run(store, "--since", (utcnow().replace(year=2099)).isoformat()) == "no audit entries\n"
    (row,) = [json.loads(line) for line in (await audit_cli_run(store, "--json", "--kind", "tool_call")).splitlines()]
    assert row["tool"] == "clock" and row["actor"] == "fake:100" and row["at"].startswith(str(utcnow().year))


def test_gateway_audit_refuses_a_bad_since(capsys):
    try:
        build_parser().parse_args(["audit", "--since", "yesterday"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "expected a duration like 2h or 7d, or a time like" in capsys.readouterr().err
