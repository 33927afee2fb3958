"""What the fault drill checks beyond lost answers and order (see chaos.py): answers matched
exactly to their outbox rows, strangers never answered, every job firing recorded once, a job's
spend within its cap, and no send into a chat Telegram held."""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import timedelta
from typing import Any

MARKER = re.compile(r"\bM\d{5}\b")


async def outbox_by_message(store) -> dict[tuple[str, str], tuple[str, bool]]:  # noqa: ANN001
    """(thread key, platform message id) -> (outbox key, recorded uncertain) for every send."""
    from sqlalchemy import select

    from gateway.store.tables import outbox

    query = select(outbox.c.key, outbox.c.thread_key, outbox.c.message_ids, outbox.c.uncertain)
    rows = await store.db.read(lambda conn: conn.execute(query).all())
    found = {}
    for key, thread_key, message_ids, uncertain in rows:
        for message_id in message_ids or []:
            found[(thread_key, str(message_id))] = (key, uncertain is not None)
    return found


def duplicates(answers: dict[str, list[tuple[str, str]]], rows: dict[tuple[str, str], tuple[str, bool]]) -> dict:
    """`answers`: marker -> [(thread key, platform message id)] of every answer shown to it.
    A marker answered by more than one message is a duplicate; it is explained when one of its
    messages was sent under an outbox row recorded uncertain (a timed-out send, resent once), and
    at most one of them has no row (the timed-out one, whose id was never learnt)."""
    listed, unexplained = [], []
    for marker, shown in answers.items():
        if len(shown) < 2:
            continue
        sent = [rows.get(message) for message in shown]
        uncertain = sum(1 for row in sent if row is not None and row[1])
        unknown = sum(1 for row in sent if row is None)
        entry = {
            "marker": marker,
            "messages": [f"{thread} #{message_id}" for thread, message_id in shown],
            "outbox keys": [row[0] if row else None for row in sent],
        }
        listed.append(entry)
        if not (uncertain and unknown <= uncertain):
            unexplained.append(entry)
    return {"listed": listed, "unexplained": unexplained}


async def job_firings(store, started_at, ended_at) -> dict[str, Any]:  # noqa: ANN001
    """Each minute's firing of the drill's every-minute job: recorded once, none missing."""
    from sqlalchemy import select

    from gateway.store.tables import job_runs

    query = select(job_runs.c.scheduled_for, job_runs.c.status, job_runs.c.origin)
    rows = await store.db.read(lambda conn: conn.execute(query).all())
    per_minute: dict[Any, int] = defaultdict(int)
    statuses: dict[str, int] = defaultdict(int)
    for scheduled_for, status, origin in rows:
        if origin == "schedule":
            per_minute[scheduled_for.replace(second=0, microsecond=0)] += 1
        statuses[status] += 1
    first = started_at.replace(second=0, microsecond=0) + timedelta(minutes=1)
    expected = []
    while first <= ended_at - timedelta(minutes=1):
        expected.append(first)
        first += timedelta(minutes=1)
    return {
        "firings expected": len(expected),
        "recorded": sum(per_minute.values()),
        "missing": [m.isoformat() for m in expected if per_minute.get(m, 0) == 0],
        "recorded twice": [m.isoformat() for m, n in per_minute.items() if n > 1],
        "statuses": dict(statuses),
    }


async def job_spend(store, cap_tokens: int) -> dict[str, Any]:  # noqa: ANN001
    from sqlalchemy import select

    from gateway.store.tables import budget_counters

    query = select(budget_counters.c.subject, budget_counters.c.used_tokens).where(budget_counters.c.scope == "job")
    rows = await store.db.read(lambda conn: conn.execute(query).all())
    used = max((tokens for _, tokens in rows), default=0)
    return {"cap tokens": cap_tokens, "used tokens": used, "over the cap": used > cap_tokens}


def answered_markers(texts: list[str]) -> list[str]:
    return [m for text in texts if text.startswith("Answer to") for m in MARKER.findall(text)]


def delivery_promises(figures: dict[str, Any]) -> dict[str, bool]:
    """The promises every drill checks, each True when it does not hold: nothing lost, a second
    answer only on a recorded ambiguous send, order kept, every approval resolved, every timed-out
    new message recorded uncertain, no stranger answered."""
    approved, approvals = (int(n) for n in figures["approvals resolved"].split("/"))
    return {
        "messages lost": figures["lost"] != 0,
        "answers twice not explained by a recorded ambiguous send": (
            figures["answered twice, not explained by a recorded ambiguous send"] != 0
        ),
        "order broken": figures["order kept"] != "100.0%",
        "approvals unresolved": approved != approvals,
        "timed-out sends not recorded": figures["timed-out new messages not recorded uncertain"] != 0,
        "a stranger answered": figures["strangers' messages answered"] != 0,
    }
