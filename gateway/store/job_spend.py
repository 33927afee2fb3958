"""What scheduled work spent, read from the runs themselves (every model call of a job, quiet
ones included) and its firings (woken, or skipped when the check found nothing new).

A job's spend is the sum of the runs of its firings' sessions (a sub-agent's use is added to its
parent's run when it ends: gateway/store/delegations.py), counted in the period of the firing's
`scheduled_for`, like its firings. Each read is one aggregate over the job's firings in the
period (the index of `uq_job_runs_schedule_time`) and their runs (`runs.session_id`), never the
whole history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, case, func, select
from sqlalchemy.engine import Connection

from gateway.store.base import Repo
from gateway.store.tables import job_runs, runs

NO_CHANGE = "no change"  # the error of a firing skipped because its check found nothing new


@dataclass(frozen=True)
class Spend:
    """Model calls and what they cost. Tokens as the caps count them: input (cached ones
    included) plus output; `cost_nano_usd` None while nothing was priced."""

    calls: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    cost_nano_usd: int | None = None
    unpriced: bool = False  # some calls had no price: the cost leaves them out
    estimated: bool = False  # some counts were estimated (the server sent none)
    runs: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class Firings:
    """A job's firings in a period, by what became of them."""

    total: int = 0
    woke: int = 0  # a session was opened: the model was asked
    no_change: int = 0  # skipped: the check found nothing new (no session, no model call)
    capped: int = 0  # skipped at a spend cap
    failed: int = 0
    missed: int = 0

    @property
    def calls_saved(self) -> int:
        """Each firing skipped with no change is at least one model call not made."""
        return self.no_change


@dataclass(frozen=True)
class PeriodSpend:
    since: datetime
    spend: Spend
    firings: Firings


_SPEND_COLUMNS = ("llm_calls", "input_tokens", "cached_tokens", "cache_write_tokens", "output_tokens")
_SPEND_FIELDS = ("calls", "input_tokens", "cached_tokens", "cache_write_tokens", "output_tokens")


def _spend_sums(within: ColumnElement[bool], label: str) -> list[Any]:
    """One period's sums, each over the rows `within` selects (the others add nothing)."""
    sums = [
        func.coalesce(func.sum(case((within, getattr(runs.c, column)), else_=0)), 0).label(f"{label}_{field}")
        for column, field in zip(_SPEND_COLUMNS, _SPEND_FIELDS, strict=True)
    ]
    return [
        *sums,
        func.sum(case((within, runs.c.cost_nano_usd))).label(f"{label}_cost"),  # NULL: nothing priced
        func.sum(case((and_(within, runs.c.unpriced), 1), else_=0)).label(f"{label}_unpriced"),
        func.sum(case((and_(within, runs.c.usage_estimated), 1), else_=0)).label(f"{label}_estimated"),
        func.sum(case((within, 1), else_=0)).label(f"{label}_runs"),
    ]


def _spend_of(row: Any, label: str) -> Spend:
    values = {field: int(row[f"{label}_{field}"] or 0) for field in _SPEND_FIELDS}
    cost = row[f"{label}_cost"]
    return Spend(
        **values,
        cost_nano_usd=None if cost is None else int(cost),
        unpriced=bool(row[f"{label}_unpriced"]),
        estimated=bool(row[f"{label}_estimated"]),
        runs=int(row[f"{label}_runs"] or 0),
    )


def _firing_counts(within: ColumnElement[bool], label: str) -> list[Any]:
    skipped = job_runs.c.status == "skipped"
    kinds = {
        "total": within,
        "woke": and_(within, job_runs.c.session_id.is_not(None)),
        "no_change": and_(within, skipped, job_runs.c.error.like(f"{NO_CHANGE}%")),
        "capped": and_(within, skipped, job_runs.c.error.like("budget: %")),
        "failed": and_(within, job_runs.c.status == "failed"),
        "missed": and_(within, job_runs.c.status == "missed"),
    }
    return [func.sum(case((condition, 1), else_=0)).label(f"{label}_{kind}") for kind, condition in kinds.items()]


def _firings_of(row: Any, label: str) -> Firings:
    return Firings(**{kind: int(row[f"{label}_{kind}"] or 0) for kind in Firings.__dataclass_fields__})


class JobSpendRepo(Repo):
    async def periods(self, schedule_id: int, starts: Mapping[str, datetime]) -> dict[str, PeriodSpend]:
        """The job's spend and firings since each start (a name -> its moment): two aggregate
        reads over the job's firings since the earliest start."""
        spend_query, firings_query = period_queries(schedule_id, starts)
        labels = {name: f"p{i}" for i, name in enumerate(starts)}

        def work(conn: Connection) -> dict[str, PeriodSpend]:
            spent = conn.execute(spend_query).one()._mapping
            fired = conn.execute(firings_query).one()._mapping
            return {
                name: PeriodSpend(at, _spend_of(spent, labels[name]), _firings_of(fired, labels[name]))
                for name, at in starts.items()
            }

        return await self.db.read(work)

    async def of_sessions(self, session_ids: Sequence[int]) -> dict[int, Spend]:
        """Each firing's session's spend (its sub-agents' included), by session id."""
        wanted = list(dict.fromkeys(session_ids))
        if not wanted:
            return {}
        query = (
            select(runs.c.session_id, *_spend_sums(runs.c.id.is_not(None), "s"))
            .where(runs.c.session_id.in_(wanted))
            .group_by(runs.c.session_id)
        )

        def work(conn: Connection) -> dict[int, Spend]:
            return {row.session_id: _spend_of(row._mapping, "s") for row in conn.execute(query)}

        return await self.db.read(work)


def period_queries(schedule_id: int, starts: Mapping[str, datetime]) -> tuple[Select, Select]:
    """The spend and the firings of one job since each start, each one aggregate read over the
    job's firings since the earliest start (and their runs)."""
    earliest = min(starts.values())
    fired = job_runs.c.scheduled_for
    labels = {name: f"p{i}" for i, name in enumerate(starts)}
    in_range = and_(job_runs.c.schedule_id == schedule_id, fired >= earliest)
    spend = (
        select(*[c for name, at in starts.items() for c in _spend_sums(fired >= at, labels[name])])
        .select_from(job_runs.join(runs, runs.c.session_id == job_runs.c.session_id))
        .where(in_range)
    )
    firings = select(*[c for name, at in starts.items() for c in _firing_counts(fired >= at, labels[name])]).where(
        in_range
    )
    return spend, firings
