"""The caps of `budgets.caps` applied to one payer: calendar periods in `scheduler.timezone`,
the counters they name, and the words for a reached cap."""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from gateway.config import CapConfig, Config, ModelPrice
from gateway.llm.pricing import NANO_PER_USD, minutes_cost, worst_case_cost
from gateway.store import CounterKey, Limit

PERIOD_WORDS = {"day": "Daily", "week": "Weekly", "month": "Monthly"}
AUDIO_BYTES_PER_S = 1000  # 8 kbit/s: voice notes (Opus) run at 16 kbit/s and more


@dataclass(frozen=True)
class Payer:
    """Who an LLM call is spent for. Ids are `<channel>:<id>`; None when not applicable."""

    user: str | None = None  # "telegram:123456789"
    chat: str | None = None  # "telegram:-1001234", "slack:C0123"
    job: str | None = None  # the schedule's name


current_payer: ContextVar[Payer | None] = ContextVar("current_payer", default=None)  # None: nobody in particular


def cap_nano_usd(cap: CapConfig) -> int | None:
    return None if cap.usd is None else round(cap.usd * NANO_PER_USD)


def subject_of(cap: CapConfig, payer: Payer) -> str | None:
    if cap.scope == "global":
        return ""
    return {"user": payer.user, "chat": payer.chat, "job": payer.job}[cap.scope]


def period_key(period: str, now: datetime, zone: ZoneInfo) -> str:
    local = now.astimezone(zone)
    if period == "day":
        return local.date().isoformat()
    if period == "week":
        year, week, _ = local.isocalendar()
        return f"{year}-W{week:02d}"
    return f"{local.year}-{local.month:02d}"


def period_keys(now: datetime, zone: ZoneInfo) -> dict[str, str]:
    return {period: period_key(period, now, zone) for period in PERIOD_WORDS}


def resets_at(period: str, now: datetime, zone: ZoneInfo) -> datetime:
    local = now.astimezone(zone).date()
    if period == "day":
        start = local + timedelta(days=1)
    elif period == "week":
        start = local + timedelta(days=7 - local.weekday())
    else:
        start = date(local.year + (local.month == 12), local.month % 12 + 1, 1)
    return datetime.combine(start, time(0, 0), tzinfo=zone)


@dataclass(frozen=True)
class AppliedCap:
    cap: CapConfig
    limit: Limit

    @property
    def key(self) -> CounterKey:
        return self.limit.key


class Caps:
    def __init__(self, config: Config):
        self.config = config
        self.zone = ZoneInfo(config.scheduler.timezone)

    @property
    def any(self) -> bool:
        return bool(self.config.budgets.caps)

    def applied(self, payer: Payer, now: datetime, *, usd: bool = True) -> list[AppliedCap]:
        """The caps that apply to this payer now, each with its counter; `usd=False` leaves
        the USD part out (a model without a price under `unpriced: allow`)."""
        found = []
        for cap in self.config.budgets.caps:
            subject = subject_of(cap, payer)
            nano = cap_nano_usd(cap) if usd else None
            if subject is None or (nano is None and cap.tokens is None):
                continue
            key = CounterKey(cap.scope, subject, cap.period, period_key(cap.period, now, self.zone))
            found.append(AppliedCap(cap, Limit(key, nano, cap.tokens)))
        return found

    def merged(self, applied: list[AppliedCap]) -> list[Limit]:
        """One limit per counter (a USD cap and a token cap of one scope and period share it)."""
        by_key: dict[CounterKey, Limit] = {}
        for item in applied:
            old = by_key.get(item.key)
            if old is None:
                by_key[item.key] = item.limit
                continue
            by_key[item.key] = Limit(
                item.key, _tighter(old.nano_usd, item.limit.nano_usd), _tighter(old.tokens, item.limit.tokens)
            )
        return list(by_key.values())

    def price(self, model: str) -> ModelPrice | None:
        return self.config.llm.price_of(model)

    def worst_case(self, model: str, request_bytes: int, reply_tokens: int) -> tuple[int, int]:
        """(tokens, nano-USD) a call can cost at most: its prompt bound plus the whole reply."""
        prompt = math.ceil(request_bytes / self.config.budgets.prompt_bytes_per_token)
        return prompt + reply_tokens, worst_case_cost(self.price(model), prompt, reply_tokens)

    def worst_minutes(self, model: str, seconds: float | None, audio_bytes: int) -> int:
        """Nano-USD a transcription can cost at most: its length, else the longest audio of that
        size (at AUDIO_BYTES_PER_S, below any speech codec's rate)."""
        bound = seconds if seconds else audio_bytes / AUDIO_BYTES_PER_S
        return math.ceil(minutes_cost(self.price(model), bound) or 0)

    def reached_text(self, cap: CapConfig, now: datetime) -> str:
        whose = {"user": "you", "chat": "this chat", "job": "this job", "global": "the assistant"}[cap.scope]
        when = resets_at(cap.period, now, self.zone)
        zone = self.config.scheduler.timezone
        moment = f"at {when:%H:%M} {zone}" if cap.period == "day" else f"on {when:%Y-%m-%d} at {when:%H:%M} {zone}"
        return f"{PERIOD_WORDS[cap.period]} budget for {whose} reached ({limit_text(cap)}); it resets {moment}."


def limit_text(cap: CapConfig) -> str:
    parts = []
    if cap.usd is not None:
        parts.append(usd_text(cap_nano_usd(cap) or 0))
    if cap.tokens is not None:
        parts.append(f"{cap.tokens:,} tokens")
    return ", ".join(parts)


def _tighter(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def usd_text(nano_usd: int) -> str:
    """$2.00, $0.42; small amounts keep their digits ($0.0031)."""
    usd = nano_usd / NANO_PER_USD
    if usd == 0 or usd >= 0.01:
        return f"${usd:,.2f}"
    return f"${usd:.6f}".rstrip("0")
