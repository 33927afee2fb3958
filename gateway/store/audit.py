"""The audit trail: one append-only table of who asked for what, who (or which rule) decided, and
what came of it: tool calls, pairing and access changes, budget alerts, console logins and actions.

The application only inserts rows (retention deletes the old ones, gateway/store/retention.py).
Arguments and details are redacted here, before anything is written, so no caller can forget:
values under secret-looking keys and strings that look like credentials never reach the table.
`record_in` writes a row inside the caller's transaction, next to the decision it records.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import insert, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from gateway.events import utcnow
from gateway.store.base import Repo, to_record
from gateway.store.tables import audit

AuditKind = Literal[
    "tool_call", "access", "budget_alert", "console_login", "console_action", "memory", "preference"
]
# How a decision was made: a person's button, the console, the CLI, the automatic denial of an
# unattended call, a policy rule, a human-granted bypass, the owner's claim code.
Via = Literal["button", "console", "cli", "auto", "policy", "bypass", "expiry", "claim"]

REDACTED = "[redacted]"
MAX_STRING = 2000  # longer argument strings (file contents, scripts) are cut: the trail is not a copy
# "max_tokens" and other counts of tokens are not secrets; "token", "bot_token", "tokens_file" are.
_SECRET_KEY = re.compile(
    r"token(?!s$)|secret|passw(or)?d|api[_-]?key|authori[sz]ation|cookie|credential|private[_-]?key", re.IGNORECASE
)
# Credentials inside free text: "Bearer x", "token=x" / "password: x", and well-known token shapes
# (OpenAI/Anthropic sk-, Slack xox?-, GitHub ghp_/github_pat_, Telegram bot tokens, AWS keys).
_SECRET_TEXT = (
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {REDACTED}"),
    (re.compile(r"(?i)\b(token|secret|passw(?:or)?d|api[_-]?key)([\"']?\s*[:=]\s*[\"']?)[^\s\"'&,;]+"),
     rf"\1\2{REDACTED}"),
    (re.compile(r"\b(?:sk-[A-Za-z0-9_-]{16,}|xox[abposr]-[A-Za-z0-9-]{10,}|gh[pousr]_[A-Za-z0-9]{20,})"), REDACTED),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}|\bAKIA[0-9A-Z]{16}\b|\b\d{6,12}:[A-Za-z0-9_-]{30,}\b"), REDACTED),
)


def _redact_text(value: str) -> str:
    for pattern, replacement in _SECRET_TEXT:
        value = pattern.sub(replacement, value)
    if len(value) > MAX_STRING:
        value = f"{value[:MAX_STRING]}… [{len(value) - MAX_STRING} more characters]"
    return value


def redact(value: Any) -> Any:
    """`value` (JSON-like) with secrets replaced by "[redacted]" and long strings cut."""
    if isinstance(value, dict):
        return {
            str(k): REDACTED if _SECRET_KEY.search(str(k)) and v not in (None, "") else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return _redact_text(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    return _redact_text(str(value))


def redact_arguments(arguments: Any) -> Any:
    """A tool call's arguments, given as the model's JSON text or already parsed, redacted."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return {"unparsed": _redact_text(arguments)}
    return redact(arguments)


def via_of(decided_by: str | None) -> Via | None:
    """How a prompt or a pairing request was decided, from who decided it: the CLI decides as
    "cli", the console as "console" or "console:<user>", a button or a typed answer as the
    person's id; an expiry has no one."""
    if not decided_by:
        return "expiry"
    if decided_by == "cli":
        return "cli"
    if decided_by == "console" or decided_by.startswith("console:"):
        return "console"
    return "button"


def person(channel: str, ident: str | None) -> str | None:
    """A person as the trail names them, "<channel>:<id>" (ids that name their origin already,
    like "cli" or "console:ann" or "telegram:42", are kept)."""
    if not ident:
        return None
    return ident if ":" in ident or ident in ("cli", "console") else f"{channel}:{ident}"


@dataclass(frozen=True)
class AuditEntry:
    """One row to append. `arguments` and `detail` are redacted when written."""

    kind: AuditKind
    action: str
    actor: str | None = None
    decided_by: str | None = None
    via: Via | None = None
    tool: str | None = None
    thread_key: str | None = None
    run_id: int | None = None
    arguments: Any = None
    outcome: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditRecord:
    id: int
    at: datetime
    kind: str
    action: str
    actor: str | None
    decided_by: str | None
    via: str | None
    tool: str | None
    thread_key: str | None
    run_id: int | None
    arguments: Any
    outcome: str | None
    detail: dict[str, Any]


_INSERT = insert(audit)


def _values(entry: AuditEntry, at: datetime) -> dict[str, Any]:
    return {
        "at": at,
        "kind": entry.kind,
        "action": entry.action[:64],
        "actor": entry.actor[:128] if entry.actor else entry.actor,
        "decided_by": entry.decided_by[:128] if entry.decided_by else entry.decided_by,
        "via": entry.via,
        "tool": entry.tool,
        "thread_key": entry.thread_key,
        "run_id": entry.run_id,
        "arguments": None if entry.arguments is None else redact_arguments(entry.arguments),
        "outcome": entry.outcome,
        "detail": redact(entry.detail),
    }


def _is_user(user: str) -> ColumnElement[bool]:
    exact = or_(audit.c.actor == user, audit.c.decided_by == user)
    if ":" in user:
        return exact
    pattern = "%:" + user.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return or_(exact, audit.c.actor.like(pattern, escape="\\"), audit.c.decided_by.like(pattern, escape="\\"))


class AuditRepo(Repo):
    @staticmethod
    def record_in(conn: Connection, *entries: AuditEntry) -> None:
        """Append `entries` inside the caller's transaction (one statement for all of them)."""
        if entries:
            now = utcnow()
            conn.execute(_INSERT, [_values(entry, now) for entry in entries])

    async def record(self, *entries: AuditEntry) -> None:
        """Append `entries` in a transaction of their own."""
        if entries:
            await self.db.write(lambda conn: self.record_in(conn, *entries))

    async def record_console_action(
        self,
        *,
        user: str,
        action: str,
        target: str | None = None,
        outcome: str | None = "ok",
        detail: dict[str, Any] | None = None,
    ) -> None:
        """A console login (`action="login"`, outcome "ok" or "refused") or a console action
        ("approve", "run_job", ...) by `user` on `target` (a prompt, a job, a request)."""
        kind: AuditKind = "console_login" if action in ("login", "logout") else "console_action"
        extra = {**(detail or {}), **({"target": target} if target is not None else {})}
        await self.record(
            AuditEntry(kind=kind, action=action, actor=user, via="console", outcome=outcome, detail=extra)
        )

    async def list_audit(
        self,
        since: datetime | None = None,
        user: str | None = None,
        tool: str | None = None,
        kind: str | None = None,
        limit: int = 200,
        before_id: int | None = None,
    ) -> list[AuditRecord]:
        """The newest rows first, at most `limit`; `user` matches who asked or who decided,
        as "telegram:42" or as the bare id "42". `before_id` pages further back (the smallest
        id of the previous page)."""
        query = select(audit).order_by(audit.c.id.desc()).limit(max(1, limit))
        if since is not None:
            query = query.where(audit.c.at >= since)
        if user is not None:
            query = query.where(_is_user(user))
        if tool is not None:
            query = query.where(audit.c.tool == tool)
        if kind is not None:
            query = query.where(audit.c.kind == kind)
        if before_id is not None:
            query = query.where(audit.c.id < before_id)
        rows = await self.db.read(lambda conn: conn.execute(query).all())
        return [to_record(AuditRecord, row) for row in rows]
