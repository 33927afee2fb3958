"""Trigger arithmetic: when a schedule fires, and which firings a downtime missed.

APScheduler's triggers are used as calculators (cron in the job's IANA zone, intervals); the
clock only ever waits for the next computed time. Two adjustments on top of them:

* fall-back DST: a cron job at a fixed hour (e.g. `30 2 * * *` in Europe/Berlin) fires once
  on the day 02:30 happens twice, as classic cron does; jobs whose hour field is `*` keep
  firing every real hour.
* ticks with `active_hours`: firings outside the window are not firings at all.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from gateway.config import parse_duration

UTC = UTC
EPSILON = timedelta(microseconds=1)
LATE_OK = timedelta(seconds=60)  # a firing this late is still "on time", whatever the policy
MAX_MISSED_ROWS = 200  # missed firings recorded one by one; older ones are counted
MAX_SCAN = 20_000  # firings walked before the scan jumps ahead (a 1-minute job down for weeks)
_HOURS = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


class TriggerError(ValueError):
    """A schedule's timing cannot be understood; the message says how to fix it."""


def _just_after(moment: datetime) -> datetime:
    # In UTC: wall-clock arithmetic on a zoned time drops `fold` and can step back an hour.
    return moment.astimezone(UTC) + EPSILON


class Timetable(Protocol):
    def next_after(self, moment: datetime) -> datetime | None:
        """The first firing strictly after `moment` (aware), or None when there is none."""


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise TriggerError(f"unknown time zone {name!r}; use an IANA name like Europe/Berlin or UTC") from None


def parse_interval(text: str) -> timedelta:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise TriggerError(str(exc)) from None
    if seconds <= 0:
        raise TriggerError(f"interval must be positive, got {text!r}")
    return timedelta(seconds=seconds)


def parse_active_hours(text: str) -> tuple[time, time]:
    match = _HOURS.match(text)
    if not match:
        raise TriggerError(f"active_hours must look like 08:00-22:00, got {text!r}")
    h1, m1, h2, m2 = (int(g) for g in match.groups())
    if h1 > 23 or h2 > 24 or m1 > 59 or m2 > 59 or (h2 == 24 and m2 != 0):
        raise TriggerError(f"active_hours {text!r}: hours are 00-24 and minutes 00-59")
    start, end = time(h1, m1), (time(23, 59, 59, 999999) if h2 == 24 else time(h2, m2))
    if start == end:
        raise TriggerError(f"active_hours {text!r}: the window is empty")
    return start, end


class CronTimetable:
    """Classic crontab semantics on APScheduler's CronTrigger.

    Two differences are corrected: APScheduler 3 numbers weekdays from Monday (crontab: 0 and
    7 are Sunday), and it ANDs day-of-month with day-of-week where cron ORs them when both are
    restricted (`0 9 1 * 1`: the 1st of the month and every Monday).
    """

    def __init__(self, expression: str, tz: str):
        fields = expression.split()
        if len(fields) != 5:
            raise TriggerError(f"cron needs 5 fields (minute hour day month weekday), got {expression!r}")
        minute, hour, day, month, weekday = fields
        where = zone(tz)
        try:
            weekdays = crontab_weekdays(weekday)
            if day != "*" and weekday != "*":
                self.triggers = [
                    CronTrigger.from_crontab(f"{minute} {hour} {day} {month} *", timezone=where),
                    CronTrigger.from_crontab(f"{minute} {hour} * {month} {weekdays}", timezone=where),
                ]
            else:
                self.triggers = [CronTrigger.from_crontab(f"{minute} {hour} {day} {month} {weekdays}", timezone=where)]
        except ValueError as exc:
            raise TriggerError(f"cron {expression!r}: {exc}") from None
        self.fixed_hour = hour != "*"

    def _next(self, moment: datetime) -> datetime | None:
        candidates = [t.get_next_fire_time(None, _just_after(moment)) for t in self.triggers]
        found = [c for c in candidates if c is not None]
        return min(found, key=lambda c: c.astimezone(UTC)) if found else None

    def next_after(self, moment: datetime) -> datetime | None:
        fire = self._next(moment)
        while fire is not None and self.fixed_hour and _second_of_repeated_wall_time(fire):
            fire = self._next(fire)
        return fire


DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _weekday_number(text: str) -> int:
    name = text.lower()[:3]
    if name in DAY_NAMES:
        return DAY_NAMES.index(name)
    if text.isdigit() and int(text) <= 7:
        return int(text) % 7
    raise TriggerError(f"weekday {text!r}: use 0-7 (0 and 7 are Sunday) or sun..sat")


def crontab_weekdays(field: str) -> str:
    """A crontab weekday field as APScheduler day names (`1-5` -> `mon,tue,wed,thu,fri`)."""
    if field == "*":
        return field
    days: set[int] = set()
    for part in field.split(","):
        span, _, step_text = part.partition("/")
        step = int(step_text) if step_text.isdigit() and int(step_text) > 0 else None
        if step_text and step is None:
            raise TriggerError(f"weekday step {part!r}: the step must be a positive number")
        if span == "*":
            first, last = 0, 6
        elif "-" in span:
            a, _, b = span.partition("-")
            first, last = _weekday_number(a), _weekday_number(b)
            last = 7 if b.strip() == "7" else last  # `5-7` is Friday to Sunday
            if last < first:
                raise TriggerError(f"weekday range {span!r} runs backwards")
        else:
            first = last = _weekday_number(span)
        days.update(d % 7 for d in range(first, last + 1, step or 1))
    return ",".join(DAY_NAMES[d] for d in sorted(days, key=lambda d: (d + 6) % 7))


def _second_of_repeated_wall_time(moment: datetime) -> bool:
    """True for the later of two instants sharing a wall-clock time (fall-back DST)."""
    if moment.fold != 1:
        return False
    return moment.replace(fold=0).utcoffset() != moment.utcoffset()


class IntervalTimetable:
    """Every `interval`, counted from `anchor` (when the schedule was last defined)."""

    def __init__(self, interval: timedelta, anchor: datetime):
        self.trigger = IntervalTrigger(seconds=interval.total_seconds(), start_date=anchor, timezone=UTC)

    def next_after(self, moment: datetime) -> datetime | None:
        return self.trigger.get_next_fire_time(None, _just_after(moment))


class OneShotTimetable:
    def __init__(self, when: datetime):
        self.when = when

    def next_after(self, moment: datetime) -> datetime | None:
        return self.when if self.when > moment else None


class ActiveHoursTimetable:
    """Firings of `inner` that fall inside a daily window of the job's zone."""

    def __init__(self, inner: Timetable, window: tuple[time, time], tz: str):
        self.inner, self.start, self.end, self.zone = inner, window[0], window[1], zone(tz)

    def contains(self, moment: datetime) -> bool:
        local = moment.astimezone(self.zone).time()
        if self.start < self.end:
            return self.start <= local < self.end
        return local >= self.start or local < self.end  # a window across midnight

    def next_after(self, moment: datetime) -> datetime | None:
        fire = self.inner.next_after(moment)
        for _ in range(400):  # a window opens every day; this bounds a year of jumps
            if fire is None or self.contains(fire):
                return fire
            fire = self.inner.next_after(self._window_opens_after(fire) - EPSILON)
        return None

    def _window_opens_after(self, moment: datetime) -> datetime:
        local = moment.astimezone(self.zone)
        opening = datetime.combine(local.date(), self.start, tzinfo=self.zone)
        if opening <= local:
            opening = datetime.combine(local.date() + timedelta(days=1), self.start, tzinfo=self.zone)
        return opening.astimezone(UTC)


def parse_at(text: str, tz: str) -> datetime:
    """An ISO time; without an offset it is read in the job's zone. Returned in UTC."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise TriggerError(
            f"at must be an ISO time like 2025-06-01T09:00 (optionally with +02:00), got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone(tz))
    return moment.astimezone(UTC)


def timetable(kind: str, spec: str, tz: str, *, anchor: datetime, active_hours: str | None = None) -> Timetable:
    """The timetable of a stored schedule (`spec` as stored: cron text, interval, ISO time)."""
    if kind == "cron":
        return CronTimetable(spec, tz)
    if kind == "at":
        return OneShotTimetable(parse_at(spec, tz))
    if kind in ("every", "tick"):
        base = IntervalTimetable(parse_interval(spec), anchor.replace(microsecond=0))
        if kind == "tick" and active_hours:
            return ActiveHoursTimetable(base, parse_active_hours(active_hours), tz)
        return base
    raise TriggerError(f"unknown kind {kind!r}; use cron, every, at or tick")


def firings(table: Timetable, after: datetime, until: datetime, *, limit: int = 1000) -> list[datetime]:
    """Firings in (after, until], at most `limit` of them."""
    out: list[datetime] = []
    moment = after
    while len(out) < limit:
        fire = table.next_after(moment)
        if fire is None or fire > until:
            break
        out.append(fire)
        moment = fire
    return out


@dataclass(frozen=True)
class CatchUp:
    """What to do about a schedule at start (or after the clock was held up)."""

    missed: tuple[datetime, ...]  # to record as `missed`, oldest first
    uncounted: int  # earlier missed firings beyond MAX_MISSED_ROWS (counted, not recorded)
    truncated: bool  # the scan jumped ahead: `uncounted` is a lower bound
    due: datetime | None  # the firing to run now
    next: datetime | None  # the next future firing, for the clock


def catch_up(table: Timetable, *, since: datetime, now: datetime, misfire: str, grace: timedelta) -> CatchUp:
    """Sort the firings in (since, now] into one to run now and the missed ones.

    A firing at most LATE_OK old runs whatever the policy. Otherwise `run_once` runs the latest
    missed firing when it is within `grace`; `skip` runs none. Every other firing is missed.
    """
    past: deque[datetime] = deque(maxlen=MAX_MISSED_ROWS + 1)
    total, moment, truncated = 0, since, False
    while True:
        fire = table.next_after(moment)
        if fire is None or fire > now:
            break
        past.append(fire)
        total, moment = total + 1, fire
        jump = now - max(grace, LATE_OK) - timedelta(days=1)
        if total == MAX_SCAN and jump > moment:  # far behind: stop walking every firing
            moment, truncated = jump, True
    due = None
    if past and (now - past[-1] <= LATE_OK or (misfire == "run_once" and now - past[-1] <= grace)):
        due = past.pop()
    recorded = tuple(list(past)[-MAX_MISSED_ROWS:])
    uncounted = total - (1 if due else 0) - len(recorded)
    return CatchUp(missed=recorded, uncounted=uncounted, truncated=truncated, due=due, next=fire)
