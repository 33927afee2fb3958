"""`gateway audit [--since 2h|ISO] [--user U] [--tool T] [--kind K] [--limit N] [--json]`: the audit
trail, newest first, as aligned lines or as one JSON object per line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from gateway.config import parse_duration
from gateway.events import utcnow
from gateway.store import AuditRecord, Store

KINDS = ("tool_call", "access", "budget_alert", "console_login", "console_action", "memory")


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """`2h`, `30m`, `7d` (that long ago) or an ISO time (UTC unless it names a zone)."""
    try:
        return (now or utcnow()) - timedelta(seconds=parse_duration(value))
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration like 2h or 7d, or a time like 2026-12-03T09:00, got {value!r}"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def add_parser(subparsers: Any, *, parents: Sequence[argparse.ArgumentParser], handler: Callable[..., Any]) -> None:
    audit = subparsers.add_parser(
        "audit", parents=list(parents), help="the audit trail: tool calls and who decided, access, console"
    )
    audit.add_argument("--since", type=parse_since, default=None, help="2h, 7d or an ISO time")
    audit.add_argument("--user", default=None, help="who asked or who decided (an id, cli, console)")
    audit.add_argument("--tool", default=None)
    audit.add_argument("--kind", choices=KINDS, default=None)
    audit.add_argument("--limit", type=int, default=100)
    audit.add_argument("--json", action="store_true", help="one JSON object per line")
    audit.set_defaults(handler=handler)


def _line(row: AuditRecord) -> str:
    who = row.actor or "-"
    decided = f" decided by {row.decided_by or row.via}" if row.decided_by or row.via else ""
    via = f" ({row.via})" if row.via and row.decided_by else ""
    subject = row.tool or row.detail.get("target") or row.detail.get("subject") or ""
    outcome = f" -> {row.outcome}" if row.outcome else ""
    arguments = f"  {json.dumps(row.arguments, ensure_ascii=False)[:160]}" if row.arguments else ""
    return (
        f"{row.at:%Y-%m-%d %H:%M:%S}  {row.kind:<14} {row.action:<12} {subject:<20} by {who}{decided}{via}"
        f"{outcome}{arguments}"
    )


def _json(row: AuditRecord) -> str:
    data = asdict(row)
    data["at"] = row.at.isoformat()
    return json.dumps(data, ensure_ascii=False, default=str)


async def run(args: argparse.Namespace, store: Store, out: TextIO = sys.stdout) -> int:
    rows = await store.audit.list_audit(
        since=args.since, user=args.user, tool=args.tool, kind=args.kind, limit=args.limit
    )
    for row in rows:
        print(_json(row) if args.json else _line(row), file=out)
    if not rows and not args.json:
        print("no audit entries", file=out)
    return 0
