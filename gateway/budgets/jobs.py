"""What each scheduled job spent today, this week and this month (calendar periods in
`scheduler.timezone`), the firings its check skipped and the calls they saved, and a forecast at
the last 7 days' rate: for `gateway jobs show`, `gateway budgets`, `/cost` and the console.

Every model call of a job counts, quiet ones (a tick answering its sentinel) and its sub-agents'
included: the figures are the job's runs (gateway/store/job_spend.py), the same as the caps'."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

from gateway.budgets.caps import usd_text
from gateway.budgets.report import budgets_report
from gateway.config import Config
from gateway.events import ThreadKey, utcnow
from gateway.store import Store
from gateway.store.job_spend import Firings, PeriodSpend, Spend
from gateway.store.schedules import ScheduleRecord

PERIODS = ("today", "this week", "this month")
WINDOW = "last 7 days"
WINDOW_DAYS = 7
MIN_SPAN = timedelta(hours=1)  # a job added minutes ago is not extrapolated from one firing


@dataclass(frozen=True)
class Forecast:
    per_day_tokens: float
    per_day_calls: float
    per_day_nano_usd: float | None  # None: nothing was priced
    days: float  # the span the rate was taken over
    whole_window: bool  # the job is older than the window: its last 7 days

    def text(self) -> str:
        cost = "cost unpriced" if self.per_day_nano_usd is None else f"{usd_text(round(self.per_day_nano_usd))}/day"
        rate = f"{tokens_text(round(self.per_day_tokens))} tokens/day, {cost}"
        if self.whole_window:
            return f"at the last 7 days' rate: {rate}"
        if self.days <= MIN_SPAN / timedelta(days=1):
            return f"at the rate since it was added (under 1 h ago, taken as 1 h): {rate}"
        return f"at the rate since it was added ({span_text(self.days)} ago): {rate}"


@dataclass(frozen=True)
class JobSpend:
    schedule: ScheduleRecord
    periods: dict[str, PeriodSpend]  # PERIODS, in order
    forecast: Forecast


def period_starts(now: datetime, zone: ZoneInfo) -> dict[str, datetime]:
    """Where today, this week (from Monday) and this month began in `zone`, and the window."""
    day = now.astimezone(zone).date()
    monday = day - timedelta(days=day.weekday())
    return {
        "today": datetime.combine(day, time(0, 0), tzinfo=zone),
        "this week": datetime.combine(monday, time(0, 0), tzinfo=zone),
        "this month": datetime.combine(day.replace(day=1), time(0, 0), tzinfo=zone),
        WINDOW: now - timedelta(days=WINDOW_DAYS),
    }


async def job_spend(store: Store, schedule: ScheduleRecord, zone: ZoneInfo, now: datetime) -> JobSpend:
    found = await store.job_spend.periods(schedule.id, period_starts(now, zone))
    window = found.pop(WINDOW)
    span = max(min(now - schedule.created_at, timedelta(days=WINDOW_DAYS)), MIN_SPAN)
    days = span / timedelta(days=1)
    spend = window.spend
    forecast = Forecast(
        spend.tokens / days,
        spend.calls / days,
        None if spend.cost_nano_usd is None and spend.calls else (spend.cost_nano_usd or 0) / days,
        days,
        now - schedule.created_at >= timedelta(days=WINDOW_DAYS),
    )
    return JobSpend(schedule, found, forecast)


def tokens_text(n: int) -> str:
    """850, 3.1 k, 42 k, 1.2 M."""
    if n < 1000:
        return str(n)
    if n < 10_000:
        return f"{n / 1000:.1f} k"
    if n < 1_000_000:
        return f"{n / 1000:.0f} k"
    return f"{n / 1_000_000:.1f} M" if n < 10_000_000 else f"{n / 1_000_000:.0f} M"


def span_text(days: float) -> str:
    return f"{days:.1f} days" if days >= 1 else f"{days * 24:.0f} h"


def cost_text(spend: Spend) -> str:
    """$0.0041; "unpriced" when no call had a price; a note when some had none."""
    if spend.cost_nano_usd is None:
        return "unpriced" if spend.calls else usd_text(0)
    text = usd_text(spend.cost_nano_usd)
    if spend.estimated:
        text = f"~{text}"
    return text + (" (+ unpriced calls)" if spend.unpriced else "")


def skipped_text(firings: Firings) -> str:
    if not firings.no_change:
        return ""
    return f"{firings.no_change:,} skipped (no change), {firings.calls_saved:,} calls saved"


def spend_line(spend: Spend, firings: Firings) -> str:
    """One period in words: calls, tokens (input, cached, output), cost, skipped firings."""
    parts = [
        f"{spend.calls:,} model calls, {spend.input_tokens:,} input tokens ({spend.cached_tokens:,} cached), "
        f"{spend.output_tokens:,} output, {cost_text(spend)}",
        f"{firings.total:,} firings ({firings.woke:,} woke the model)",
    ]
    skipped = skipped_text(firings)
    if skipped:
        parts.append(skipped)
    if firings.capped:
        parts.append(f"{firings.capped:,} skipped at a spend cap")
    return "; ".join(parts)


TABLE_HEAD = (
    f"    {'':<11} {'firings':>7} {'woke':>5} {'skipped':>7} {'saved':>6} {'calls':>6} "
    f"{'input':>10} {'cached':>10} {'output':>9}  cost"
)


def table_lines(found: JobSpend) -> list[str]:
    """The periods as a table (skipped: no change; saved: model calls not made), then the forecast."""
    lines = [TABLE_HEAD]
    for name in PERIODS:
        period = found.periods[name]
        s, f = period.spend, period.firings
        lines.append(
            f"    {name:<11} {f.total:>7,} {f.woke:>5,} {f.no_change:>7,} {f.calls_saved:>6,} {s.calls:>6,} "
            f"{s.input_tokens:>10,} {s.cached_tokens:>10,} {s.output_tokens:>9,}  {cost_text(s)}"
        )
    lines.append(f"    {found.forecast.text()}")
    return lines


async def jobs_spend_report(store: Store, zone: ZoneInfo, now: datetime) -> list[str]:
    """`gateway budgets`: every job's spend (its caps are listed above it)."""
    schedules = await store.schedules.list()
    if not schedules:
        return []
    lines = [f"scheduled jobs (every model call, quiet ones included; periods in {zone.key}):"]
    for schedule in schedules:
        lines.append(f"  {schedule.name}{'' if schedule.enabled else ' (off)'}")
        lines += table_lines(await job_spend(store, schedule, zone, now))
    return lines


async def budgets_with_jobs(store: Store, config: Config, now: datetime | None = None) -> list[str]:
    """`gateway budgets`: the caps and their use, then every job's spend."""
    moment = now or utcnow()
    jobs = await jobs_spend_report(store, ZoneInfo(config.scheduler.timezone), moment)
    return [*await budgets_report(store, config, moment), *([""] + jobs if jobs else [])]


def spend_table(store: Store, config: Config) -> Callable[[ScheduleRecord, datetime], Awaitable[list[str]]]:
    """`gateway jobs show`'s spend lines (scheduler/cli.py `SpendLines`)."""
    zone = ZoneInfo(config.scheduler.timezone)

    async def lines(schedule: ScheduleRecord, now: datetime) -> list[str]:
        return table_lines(await job_spend(store, schedule, zone, now))

    return lines


def delivers_to(schedule: ScheduleRecord, thread: ThreadKey) -> bool:
    """The job's outcome goes to this chat (any of its topics or threads)."""
    try:
        target = ThreadKey.parse(schedule.deliver_to)
    except ValueError:
        return False
    return (target.channel, target.chat) == (thread.channel, thread.chat)


async def chat_jobs_lines(store: Store, zone: ZoneInfo, thread: ThreadKey, now: datetime) -> list[str]:
    """`/cost` in a chat: the jobs that deliver there, each period in words and the forecast."""
    mine = [s for s in await store.schedules.list() if delivers_to(s, thread)]
    lines = []
    for schedule in mine:
        found = await job_spend(store, schedule, zone, now)
        lines.append(f"Job {schedule.name} (every model call, quiet ones included):")
        for name in PERIODS:
            period = found.periods[name]
            lines.append(f"  {name}: {spend_line(period.spend, period.firings)}")
        lines.append(f"  {found.forecast.text()}")
    return lines
