"""Use against the caps: the lines of `/cost` and the table of `gateway budgets`."""

from __future__ import annotations

from datetime import UTC, datetime

from gateway.budgets.caps import PERIOD_WORDS, Caps, Payer, limit_text, period_key, usd_text
from gateway.config import CapConfig, Config
from gateway.store import CounterRecord, Store

WHOSE = {"user": "you", "chat": "this chat", "job": "this job", "global": "everyone"}


def used_text(cap: CapConfig, counter: CounterRecord | None) -> str:
    parts = []
    if cap.usd is not None:
        parts.append(usd_text(counter.used_nano_usd if counter else 0))
    if cap.tokens is not None:
        parts.append(f"{counter.used_tokens if counter else 0:,} tokens")
    reserved = (
        f" (+{usd_text(counter.reserved_nano_usd)} reserved by running calls)"
        if counter and counter.reserved_nano_usd and cap.usd is not None
        else ""
    )
    return f"{', '.join(parts)} of {limit_text(cap)}{reserved}"


async def cost_lines(store: Store, config: Config, payer: Payer, now: datetime | None = None) -> list[str]:
    """The person's and the chat's (and everyone's) use against each cap that names them."""
    caps = Caps(config)
    applied = [a for a in caps.applied(payer, now or datetime.now(UTC)) if a.cap.scope != "job"]
    counters = await store.budgets.counters([a.key for a in applied])
    return [
        f"{PERIOD_WORDS[a.cap.period]} budget for {WHOSE[a.cap.scope]}: {used_text(a.cap, counters.get(a.key))}"
        for a in applied
    ]


async def budgets_report(store: Store, config: Config, now: datetime | None = None) -> list[str]:
    caps = Caps(config)
    moment = now or datetime.now(UTC)
    if not config.budgets.caps:
        return ["no spend caps (budgets.caps is empty)"]
    counters = await store.budgets.current({p: period_key(p, moment, caps.zone) for p in PERIOD_WORDS})
    jobs = {str(s.id): s.name for s in await store.schedules.list()} if any(c.scope == "job" for c in counters) else {}
    lines = []
    for cap in config.budgets.caps:
        key = period_key(cap.period, moment, caps.zone)
        lines.append(f"{cap.scope} / {cap.period} ({key}, {config.scheduler.timezone}): {limit_text(cap)}")
        mine = [c for c in counters if c.scope == cap.scope and c.period == cap.period and c.period_key == key]
        for counter in mine:
            who = jobs.get(counter.subject, f"job #{counter.subject}") if cap.scope == "job" else counter.subject
            lines.append(f"    {who or '(all)':<32} {used_text(cap, counter)}")
        if not mine:
            lines.append("    nothing spent yet")
    return lines
