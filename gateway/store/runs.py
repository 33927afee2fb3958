"""Run records (one per turn) and their events."""

from __future__ import annotations

import builtins  # the repositories have a `list` method, which hides the type in their signatures
from typing import Any

from sqlalchemy import BigInteger, Boolean, Integer, String, bindparam, case, func, insert, select, update
from sqlalchemy.engine import Connection

from gateway.events import utcnow
from gateway.store.base import Fence, Repo, check_fence, to_record
from gateway.store.records import RunEventRecord, RunRecord
from gateway.store.tables import run_events, runs
from gateway.telemetry.ids import new_trace_ids

_INSERT_RUN = insert(runs).returning(*runs.c)
_RUN_BY_ID = select(runs).where(runs.c.id == bindparam("id"))
_INSERT_EVENTS = insert(run_events)
_SET_STAGE = update(runs).where(runs.c.id == bindparam("run_id"))
_TOTALS = (
    "input_tokens", "cached_tokens", "cache_write_tokens", "output_tokens", "reasoning_tokens", "llm_calls",
    "tool_calls", "rounds",
)
_NO_TOTALS = {name: 0 for name in _TOTALS}


def _add_to(column: str):  # noqa: ANN202
    return getattr(runs.c, column) + bindparam(column, type_=Integer)


_cost = bindparam("cost", type_=BigInteger)
# One statement for any mix of totals (absent ones add 0): reserves `events` sequence numbers
# and returns the first. Built once: this runs after every LLM call and tool call.
_ADD_TOTALS = (
    update(runs)
    .where(runs.c.id == bindparam("run_id"))
    .values(
        next_event_seq=runs.c.next_event_seq + bindparam("events", type_=Integer),
        cost_nano_usd=case(
            (_cost.is_(None), runs.c.cost_nano_usd), else_=func.coalesce(runs.c.cost_nano_usd, 0) + _cost
        ),
        unpriced=runs.c.unpriced | bindparam("unpriced", type_=Boolean),
        usage_estimated=runs.c.usage_estimated | bindparam("usage_estimated", type_=Boolean),
        model=func.coalesce(bindparam("model", type_=String), runs.c.model),
        **{name: _add_to(name) for name in _TOTALS},
    )
    .returning(runs.c.next_event_seq)
)


class RunRepo(Repo):
    async def start(self, session_id: int, thread_key: str, *, model: str | None = None) -> RunRecord:
        return await self.db.write(lambda conn: self.start_in(conn, session_id, thread_key, model=model))

    @staticmethod
    def start_in(conn: Connection, session_id: int, thread_key: str, *, model: str | None = None) -> RunRecord:
        trace_id, span_id = new_trace_ids()  # kept whether or not spans are exported: a run is findable by it
        row = conn.execute(
            _INSERT_RUN,
            {
                "session_id": session_id,
                "thread_key": thread_key,
                "stage": "RUNNING",
                "model": model,
                "started_at": utcnow(),
                "trace_id": trace_id,
                "trace_span_id": span_id,
            },
        ).first()
        return to_record(RunRecord, row)

    async def continue_in_new_run(
        self, run_id: int, why: str, *, model: str | None = None, fence: Fence | None = None
    ) -> RunRecord | None:
        """A run left RUNNING ends FAILED (stage `restart`, saying `why`) and the run that
        continues its turn starts, in one write: a crash in between (kill -9 again) leaves either
        the old run RUNNING or the new one, to be continued again; never neither. None when the
        run is no longer RUNNING."""

        def work(conn: Connection) -> RunRecord | None:
            check_fence(conn, fence)
            row = conn.execute(select(runs).where(runs.c.id == run_id).with_for_update()).first()
            if row is None or row.stage != "RUNNING":
                return None
            self.add_events_in(conn, run_id, [("RUN_ERROR", {"stage": "restart", "message": why}, None)])
            self.set_stage_in(conn, run_id, "FAILED", end_reason="error", error="restart")
            return self.start_in(conn, row.session_id, row.thread_key, model=model)

        return await self.db.write(work)

    async def trace_ids(self, run_id: int) -> tuple[str, str]:
        """The run's trace and turn span ids; a run from before they were kept gets them now."""

        def work(conn: Connection) -> tuple[str, str]:
            row = conn.execute(select(runs.c.trace_id, runs.c.trace_span_id).where(runs.c.id == run_id)).first()
            if row is not None and row.trace_id and row.trace_span_id:
                return row.trace_id, row.trace_span_id
            trace_id, span_id = new_trace_ids()
            conn.execute(update(runs).where(runs.c.id == run_id).values(trace_id=trace_id, trace_span_id=span_id))
            return trace_id, span_id

        return await self.db.write(work)

    async def last_event_seq(self, run_id: int, kind: str) -> int | None:
        return await self.db.read(
            lambda conn: conn.execute(
                select(func.max(run_events.c.seq)).where(run_events.c.run_id == run_id, run_events.c.kind == kind)
            ).scalar()
        )

    async def get(self, run_id: int) -> RunRecord | None:
        def work(conn: Connection) -> RunRecord | None:
            row = conn.execute(_RUN_BY_ID, {"id": run_id}).first()
            return to_record(RunRecord, row) if row else None

        return await self.db.read(work)

    async def list(
        self, *, limit: int = 50, session_id: int | None = None, stage: str | None = None, thread_key: str | None = None
    ) -> list[RunRecord]:
        query = select(runs).order_by(runs.c.id.desc()).limit(limit)
        if thread_key is not None:
            query = query.where(runs.c.thread_key == thread_key)
        if session_id is not None:
            query = query.where(runs.c.session_id == session_id)
        if stage is not None:
            query = query.where(runs.c.stage == stage)
        return await self.db.read(lambda conn: [to_record(RunRecord, r) for r in conn.execute(query)], large=True)

    async def add_event(
        self, run_id: int, kind: str, payload: dict[str, Any], *, parent_seq: int | None = None, **totals: Any
    ) -> int:
        """Append an event and add `totals` (token counts, calls, rounds, `cost_nano_usd`,
        `unpriced`, `model`); its sequence number is allocated inside the same write."""
        return (await self.add_events(run_id, [(kind, payload, parent_seq)], **totals))[-1]

    async def add_events(
        self, run_id: int, events: builtins.list[tuple[str, dict[str, Any], int | None]], **totals: Any
    ) -> builtins.list[int]:
        """Append several events and update the run's totals in one transaction."""
        return await self.db.write(lambda conn: self.add_events_in(conn, run_id, events, **totals))

    @staticmethod
    def add_events_in(
        conn: Connection, run_id: int, events: builtins.list[tuple[str, dict[str, Any], int | None]], **totals: Any
    ) -> builtins.list[int]:
        after = conn.execute(_ADD_TOTALS, _totals_params(run_id, len(events), totals)).scalar_one()
        first = after - len(events)
        if events:
            now = utcnow()
            rows = [
                {"run_id": run_id, "seq": first + i, "kind": kind, "at": now, "parent_seq": parent, "payload": payload}
                for i, (kind, payload, parent) in enumerate(events)
            ]
            conn.execute(_INSERT_EVENTS, rows)
        return [first + i for i in range(len(events))]

    async def events(self, run_id: int) -> builtins.list[RunEventRecord]:
        def work(conn: Connection) -> list[RunEventRecord]:
            rows = conn.execute(
                select(run_events).where(run_events.c.run_id == run_id).order_by(run_events.c.seq)
            ).all()
            return [to_record(RunEventRecord, r) for r in rows]

        return await self.db.read(work, large=True)

    async def set_stage(
        self,
        run_id: int,
        stage: str,
        *,
        end_reason: str | None = None,
        error: str | None = None,
        fence: Fence | None = None,
    ) -> None:
        """Called by `gateway.traces.runs.RunTrace`, the one writer of a run's stage (and by the reply
        stream for the `FinalStage` RunTrace gave it, when the reply was already sent); the store's
        own transactions that write the stage with something else use `set_stage_in`. With
        `fence`: only while it holds its lease (LeaseLost otherwise)."""

        def work(conn: Connection) -> None:
            check_fence(conn, fence)
            self.set_stage_in(conn, run_id, stage, end_reason=end_reason, error=error)

        await self.db.write(work)

    @staticmethod
    def set_stage_in(
        conn: Connection, run_id: int, stage: str, *, end_reason: str | None = None, error: str | None = None
    ) -> None:
        values: dict[str, Any] = {"stage": stage}
        if end_reason is not None:
            values["end_reason"] = end_reason
        if error is not None:
            values["error"] = error
        if stage in ("SUCCESS", "FAILED", "CANCELED"):
            values["finished_at"] = utcnow()
        conn.execute(_SET_STAGE, {"run_id": run_id, **values})

    async def session_totals(self, session_id: int) -> dict[str, int | None]:
        def work(conn: Connection) -> dict[str, int | None]:
            row = conn.execute(
                select(
                    func.coalesce(func.sum(runs.c.input_tokens), 0).label("input_tokens"),
                    func.coalesce(func.sum(runs.c.cached_tokens), 0).label("cached_tokens"),
                    func.coalesce(func.sum(runs.c.cache_write_tokens), 0).label("cache_write_tokens"),
                    func.coalesce(func.sum(runs.c.output_tokens), 0).label("output_tokens"),
                    func.coalesce(func.sum(runs.c.reasoning_tokens), 0).label("reasoning_tokens"),
                    func.sum(runs.c.cost_nano_usd).label("cost_nano_usd"),
                    func.count().label("runs"),
                    func.count().filter(runs.c.usage_estimated).label("estimated_runs"),
                ).where(runs.c.session_id == session_id)
            ).one()
            return dict(row._mapping)

        return await self.db.read(work)


def _totals_params(run_id: int, events: int, totals: dict[str, Any]) -> dict[str, Any]:
    unknown = set(totals) - set(_TOTALS) - {"cost_nano_usd", "unpriced", "usage_estimated", "model"}
    if unknown:
        raise ValueError(f"unknown run totals: {', '.join(sorted(unknown))}")
    params = {**_NO_TOTALS, **{name: totals[name] for name in _TOTALS if totals.get(name)}}
    params.update(
        run_id=run_id,
        events=events,
        cost=totals.get("cost_nano_usd"),
        unpriced=bool(totals.get("unpriced")),
        usage_estimated=bool(totals.get("usage_estimated")),
        model=totals.get("model") or None,
    )
    return params
