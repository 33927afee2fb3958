"""Trigger arithmetic: time zones, DST, intervals, one-shots, active hours, missed firings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway.config import JobConfig, SchedulerConfig
from gateway.events import ThreadKey
from scheduler.definitions import DefinitionError, deliver_to_text, parse_deliver_to, to_schedule
from scheduler.triggers import (
    MAX_MISSED_ROWS,
    ActiveHoursTimetable,
    CronTimetable,
    IntervalTimetable,
    TriggerError,
    catch_up,
    firings,
    parse_active_hours,
    timetable,
)

UTC = UTC


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_cron_in_berlin_follows_the_offset_change_in_utc():
    table = CronTimetable("0 9 * * 1-5", "Europe/Berlin")
    # Friday 2025-03-28 evening -> Monday 2025-03-31 09:00 CEST (07:00 UTC, after the switch)
    monday = table.next_after(utc(2025, 3, 28, 18, 0))
    assert monday.astimezone(UTC) == utc(2025, 3, 31, 7, 0)
    # a winter Monday: 09:00 CET is 08:00 UTC
    assert table.next_after(utc(2025, 1, 5, 12, 0)).astimezone(UTC) == utc(2025, 1, 6, 8, 0)


def test_a_0230_job_runs_once_on_the_spring_forward_day_although_0230_does_not_exist():
    table = CronTimetable("30 2 * * *", "Europe/Berlin")
    fires = firings(table, utc(2025, 3, 29, 0, 0), utc(2025, 3, 31, 0, 0))
    # 29th 02:30 CET, 30th (no 02:30: fires at 01:30 UTC = 03:30 CEST), nothing else
    assert [f.astimezone(UTC) for f in fires] == [utc(2025, 3, 29, 1, 30), utc(2025, 3, 30, 1, 30)]


def test_a_0230_job_runs_once_on_the_fall_back_day_when_0230_happens_twice():
    table = CronTimetable("30 2 * * *", "Europe/Berlin")
    fires = firings(table, utc(2025, 10, 25, 12, 0), utc(2025, 10, 27, 12, 0))
    # 26th: only the first 02:30 (CEST, 00:30 UTC); then the 27th at 02:30 CET (01:30 UTC)
    assert [f.astimezone(UTC) for f in fires] == [utc(2025, 10, 26, 0, 30), utc(2025, 10, 27, 1, 30)]


def test_an_hourly_job_keeps_firing_every_real_hour_through_the_fall_back():
    table = CronTimetable("0 * * * *", "Europe/Berlin")
    fires = firings(table, utc(2025, 10, 25, 23, 30), utc(2025, 10, 26, 2, 30))
    # 02:00 CEST (00:00 UTC) and 02:00 CET (01:00 UTC) are both hours that really passed
    assert [f.astimezone(UTC) for f in fires] == [utc(2025, 10, 26, 0), utc(2025, 10, 26, 1), utc(2025, 10, 26, 2)]


def test_cron_in_new_york_uses_its_own_dst_dates():
    table = CronTimetable("0 9 * * *", "America/New_York")
    # US DST starts 2025-03-09: 09:00 EST = 14:00 UTC before, 09:00 EDT = 13:00 UTC after
    fires = firings(table, utc(2025, 3, 8, 0), utc(2025, 3, 10, 0))
    assert [f.astimezone(UTC) for f in fires] == [utc(2025, 3, 8, 14), utc(2025, 3, 9, 13)]


def test_interval_counts_from_its_anchor():
    anchor = utc(2025, 5, 1, 10, 0, 0)
    table = IntervalTimetable(timedelta(minutes=30), anchor)
    assert table.next_after(anchor) == utc(2025, 5, 1, 10, 30)
    assert table.next_after(utc(2025, 5, 1, 10, 30)) == utc(2025, 5, 1, 11, 0)
    assert firings(table, anchor, utc(2025, 5, 1, 12, 0)) == [
        utc(2025, 5, 1, 10, 30), utc(2025, 5, 1, 11, 0), utc(2025, 5, 1, 11, 30), utc(2025, 5, 1, 12, 0)
    ]


def test_at_reads_a_naive_time_in_the_job_zone_and_fires_once():
    table = timetable("at", "2025-06-01T09:00:00+00:00", "UTC", anchor=utc(2025, 5, 1))
    assert table.next_after(utc(2025, 5, 1)) == utc(2025, 6, 1, 9)
    assert table.next_after(utc(2025, 6, 1, 9)) is None
    new = to_schedule(
        JobConfig(name="once", at="2025-06-01T09:00", prompt="p", timezone="Europe/Berlin"),
        SchedulerConfig(),
        source="cli",
        now=utc(2025, 5, 1),
    )
    assert new.kind == "at" and datetime.fromisoformat(new.spec) == utc(2025, 6, 1, 7)


def test_in_is_resolved_when_the_job_is_defined():
    now = utc(2025, 5, 1, 8, 0, 0)
    new = to_schedule(JobConfig(name="soon", **{"in": "20m"}, prompt="p"), SchedulerConfig(), source="agent", now=now)
    assert new.kind == "at" and datetime.fromisoformat(new.spec) == now + timedelta(minutes=20)


def test_tick_fires_only_inside_active_hours_of_its_zone():
    anchor = utc(2025, 7, 1, 0, 0)
    table = timetable("tick", "1h", "Europe/Berlin", anchor=anchor, active_hours="08:00-22:00")
    fires = firings(table, anchor, anchor + timedelta(days=1))
    local_hours = [f.astimezone(ActiveHoursTimetableZone).hour for f in fires]
    assert local_hours == list(range(8, 22))


def test_active_hours_across_midnight():
    anchor = utc(2025, 1, 1, 0, 0)
    table = ActiveHoursTimetable(
        IntervalTimetable(timedelta(hours=1), anchor), parse_active_hours("22:00-02:00"), "UTC"
    )
    fires = firings(table, anchor, anchor + timedelta(days=1))
    assert [f.hour for f in fires] == [1, 22, 23, 0]


@pytest.mark.parametrize("text", ["8-22", "25:00-26:00", "10:00-10:00", "08:61-09:00"])
def test_bad_active_hours_are_refused(text):
    with pytest.raises(TriggerError):
        parse_active_hours(text)


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"cron": "0 9 * *"}, "5 fields"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"cron": "0 25 * * *"}, "cron"),
        ({"every": "10s"}, "too short"),
        ({"every": "soon"}, "duration"),
        ({"at": "tomorrow"}, "ISO time"),
        ({"kind": "at"}, "exactly one of"),
        ({"kind": "tick", "every": "30m", "cron": "0 9 * * *"}, "cron does not apply"),
        ({"every": "30m", "active_hours": "08:00-22:00"}, "active_hours does not apply"),
        ({"cron": "0 9 * * *", "deliver_to": "email:me"}, "deliver_to"),
        ({"cron": "0 9 * * *", "prompt": "  "}, "prompt is empty"),
        ({"cron": "0 9 * * *", "name": "has:colon"}, "name"),
        ({"cron": "0 9 * * *", "timeout": "0s"}, "timeout"),
    ],
)
def test_bad_definitions_get_a_clear_answer(fields, expected):
    values = {"name": "job", "prompt": "do it", **fields}
    with pytest.raises(DefinitionError, match=expected):
        to_schedule(JobConfig(**values), SchedulerConfig(), source="cli", now=utc(2025, 5, 1))


def test_kind_is_inferred_from_the_only_timing_field():
    new = to_schedule(JobConfig(name="j", every="2h", prompt="p"), SchedulerConfig(), source="cli", now=utc(2025, 5, 1))
    assert new.kind == "every" and new.spec == "2h"
    tick = to_schedule(
        JobConfig(name="t", kind="tick", every="30m", prompt="p"),
        SchedulerConfig(quiet_sentinel="QUIET"),
        source="cli",
        now=utc(2025, 5, 1),
    )
    assert tick.quiet_sentinel == "QUIET"


def test_deliver_to_parsing_and_back():
    assert parse_deliver_to("telegram:-1001234:42") == ThreadKey("telegram", "-1001234", "42")
    assert parse_deliver_to("telegram:555") == ThreadKey("telegram", "555", "")
    assert parse_deliver_to("slack:C0123:1712345678.000100") == ThreadKey("slack", "C0123", "1712345678.000100")
    assert parse_deliver_to("none") is None
    for bad in ("telegram", "discord:1", "slack::1", "telegram:1:2:3"):
        with pytest.raises(DefinitionError):
            parse_deliver_to(bad)
    assert deliver_to_text(ThreadKey("slack", "C1", "1.2")) == "slack:C1:1.2"
    assert deliver_to_text(ThreadKey("telegram", "9", "")) == "telegram:9"
    with pytest.raises(DefinitionError):
        deliver_to_text(ThreadKey("console", "local", ""))


# ---- catch-up after a downtime ---------------------------------------------------------------

HOURLY = IntervalTimetable(timedelta(hours=1), utc(2025, 5, 1, 0, 0))


def test_run_once_runs_the_latest_missed_firing_within_grace_and_records_the_rest():
    plan = catch_up(
        HOURLY, since=utc(2025, 5, 1), now=utc(2025, 5, 1, 5, 10), misfire="run_once", grace=timedelta(hours=1)
    )
    assert plan.due == utc(2025, 5, 1, 5)
    assert plan.missed == tuple(utc(2025, 5, 1, h) for h in range(1, 5))
    assert plan.next == utc(2025, 5, 1, 6) and plan.uncounted == 0


def test_run_once_beyond_grace_runs_nothing():
    plan = catch_up(
        HOURLY, since=utc(2025, 5, 1), now=utc(2025, 5, 1, 5, 10), misfire="run_once", grace=timedelta(minutes=5)
    )
    assert plan.due is None and len(plan.missed) == 5


def test_skip_records_every_missed_firing():
    plan = catch_up(HOURLY, since=utc(2025, 5, 1), now=utc(2025, 5, 1, 5, 10), misfire="skip", grace=timedelta(hours=1))
    assert plan.due is None and plan.missed == tuple(utc(2025, 5, 1, h) for h in range(1, 6))


def test_a_firing_a_few_seconds_old_runs_whatever_the_policy():
    plan = catch_up(
        HOURLY, since=utc(2025, 5, 1, 4, 30), now=utc(2025, 5, 1, 5, 0, 20), misfire="skip", grace=timedelta(0)
    )
    assert plan.due == utc(2025, 5, 1, 5) and plan.missed == ()


def test_a_long_downtime_records_the_recent_misses_and_counts_the_rest():
    minutely = IntervalTimetable(timedelta(minutes=1), utc(2025, 5, 1))
    plan = catch_up(minutely, since=utc(2025, 5, 1), now=utc(2025, 5, 2), misfire="skip", grace=timedelta(hours=1))
    assert len(plan.missed) == MAX_MISSED_ROWS
    assert plan.due == utc(2025, 5, 2)  # the firing of this very minute is on time
    assert plan.missed[-1] == utc(2025, 5, 1, 23, 59)
    assert plan.uncounted == 24 * 60 - 1 - MAX_MISSED_ROWS and not plan.truncated


ActiveHoursTimetableZone = __import__("zoneinfo").ZoneInfo("Europe/Berlin")


def test_crontab_weekday_numbers_count_from_sunday():
    # 2025-05-03 is a Saturday: "1-5" (Mon-Fri in crontab) must not fire on it
    table = CronTimetable("0 9 * * 1-5", "UTC")
    assert table.next_after(utc(2025, 5, 2, 10)) == utc(2025, 5, 5, 9)
    sundays = CronTimetable("0 9 * * 0", "UTC")
    assert sundays.next_after(utc(2025, 5, 1)) == utc(2025, 5, 4, 9)
    assert CronTimetable("0 9 * * 7", "UTC").next_after(utc(2025, 5, 1)) == utc(2025, 5, 4, 9)


def test_day_of_month_and_weekday_are_either_or_like_cron():
    table = CronTimetable("0 9 1 * 1", "UTC")  # the 1st of the month, and every Monday
    fires = firings(table, utc(2025, 4, 27), utc(2025, 5, 13))
    assert [f.day for f in fires] == [28, 1, 5, 12]
