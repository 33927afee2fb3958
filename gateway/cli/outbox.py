"""`gateway outbox`: sends not delivered yet (waiting, retried or stuck) and the sends that
failed ambiguously (a new message that timed out: it may be in the chat twice, or not at all)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.events import utcnow
from gateway.store import OutboxRecord


def _when(row: OutboxRecord) -> str:
    if row.created_at is None:
        return "-"
    return f"{(utcnow() - row.created_at).total_seconds():.0f}s ago"


def print_outbox(undelivered: Sequence[OutboxRecord], uncertain: Sequence[OutboxRecord]) -> None:
    print(f"not delivered yet: {len(undelivered)}")
    now = utcnow()
    for row in undelivered:
        due = f"next attempt {row.retry_at:%H:%M:%S}" if row.retry_at and row.retry_at > now else "stuck"
        print(f"  {row.id:>6}  {row.key:<32} {row.thread_key:<36} {row.attempts:>3} tries  {_when(row):>10}  {due}")
        if row.error:
            print(f"          last error: {row.error[:200]}")
    print(f"failed ambiguously (may have been delivered): {len(uncertain)}")
    for row in uncertain:
        print(f"  {row.id:>6}  {row.key:<32} {row.thread_key:<36} {row.status:<8} {row.uncertain}")
