"""The audit trail's table: appended, redacted before it is written, queried newest first."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import insert, select

from gateway.events import utcnow
from gateway.store import AuditEntry, redact, redact_arguments
from gateway.store.audit import AuditRepo
from gateway.store.tables import audit, cursors


def entry(action: str = "run", **values) -> AuditEntry:  # noqa: ANN003
    return AuditEntry(kind=values.pop("kind", "tool_call"), action=action, **values)


async def test_rows_come_back_newest_first_and_filtered(store):
    await store.audit.record(
        entry("run", actor="telegram:1", tool="shell", outcome="ok"),
        entry("approved", actor="telegram:1", decided_by="telegram:2", via="button", tool="write_file"),
        entry("grant", kind="access", actor="cli", detail={"subject": "telegram:9"}),
    )
    everything = await store.audit.list_audit()
    assert [r.action for r in everything] == ["grant", "approved", "run"]
    assert everything[0].detail == {"subject": "telegram:9"} and everything[0].at <= utcnow()

    assert [r.action for r in await store.audit.list_audit(user="telegram:2")] == ["approved"]  # who decided
    assert [r.action for r in await store.audit.list_audit(user="telegram:1")] == ["approved", "run"]
    assert [r.action for r in await store.audit.list_audit(tool="shell")] == ["run"]
    assert [r.action for r in await store.audit.list_audit(kind="access")] == ["grant"]
    assert await store.audit.list_audit(since=utcnow() + timedelta(minutes=1)) == []
    newest = await store.audit.list_audit(limit=2)
    assert [r.action for r in newest] == ["grant", "approved"]
    assert [r.action for r in await store.audit.list_audit(before_id=newest[-1].id)] == ["run"]


async def test_secrets_never_reach_the_table(store):
    arguments = (
        '{"url": "https://api.example.com", "headers": {"Authorization": "Bearer abcdefghijkl"},'
        ' "api_key": "k-123", "max_tokens": 50, "command": "curl -H \'Authorization: Bearer s3cr3tvalue99\''
        ' https://x?token=hunter2&page=2", "note": "key sk-abcdefghijklmnopqrstu"}'
    )
    await store.audit.record(entry(tool="http_get", arguments=arguments, detail={"password": "pw", "who": "ann"}))

    raw = await store.db.read(lambda conn: conn.execute(select(audit.c.arguments, audit.c.detail)).one())
    text = repr(tuple(raw))
    for secret in ("abcdefghijkl", "k-123", "s3cr3tvalue99", "hunter2", "sk-abcdefghijklmnopqrstu", "'pw'"):
        assert secret not in text
    arguments_written, detail = raw
    assert arguments_written["headers"] == {"Authorization": "[redacted]"}
    assert arguments_written["max_tokens"] == 50 and arguments_written["url"] == "https://api.example.com"
    assert arguments_written["command"] == (
        "curl -H 'Authorization: Bearer [redacted]' https://x?token=[redacted]&page=2"
    )
    assert detail == {"password": "[redacted]", "who": "ann"}


def test_redaction_of_odd_arguments():
    assert redact_arguments("not json, password=letmein") == {"unparsed": "not json, password=[redacted]"}
    assert redact_arguments("") == {}
    assert redact({"bot_token": "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawq"}) == {"bot_token": "[redacted]"}
    assert redact(["tok 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawq"]) == ["tok [redacted]"]
    assert redact({"token": None, "secret": ""}) == {"token": None, "secret": ""}  # nothing to hide
    long = redact("x" * 5000)
    assert len(long) < 2100 and long.endswith("[3000 more characters]")


async def test_a_row_recorded_in_a_transaction_is_written_with_it_or_not_at_all(store):
    def decide(conn, fail: bool) -> None:  # noqa: ANN001
        conn.execute(insert(cursors).values(name=f"c{fail}", value="v", updated_at=utcnow()))
        AuditRepo.record_in(conn, entry("approved", tool="shell"))
        if fail:
            raise RuntimeError("the decision failed")

    await store.db.write(lambda conn: decide(conn, False))
    try:
        await store.db.write(lambda conn: decide(conn, True))
    except RuntimeError:
        pass
    assert len(await store.audit.list_audit()) == 1


async def test_console_logins_and_actions(store):
    await store.audit.record_console_action(user="admin", action="login", outcome="refused", detail={"ip": "1.2.3.4"})
    await store.audit.record_console_action(user="admin", action="approve", target="prompt:7")
    logins = await store.audit.list_audit(kind="console_login")
    assert [(r.actor, r.outcome, r.detail, r.via) for r in logins] == [
        ("admin", "refused", {"ip": "1.2.3.4"}, "console")
    ]
    (action,) = await store.audit.list_audit(kind="console_action")
    assert (action.action, action.detail, action.outcome) == ("approve", {"target": "prompt:7"}, "ok")
