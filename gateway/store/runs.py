"""Run records (one per turn) and their events."""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select, update

from gateway.store.base import Repo, to_record, utcnow
from gateway.store.records import RunEventRecord, RunRecord
from gateway.store.tables import run_events, runs

_TOTALS = ("input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens", "llm_calls", "tool_calls", "rounds")


class RunRepo(Repo):
    async def start(self, session_id: int, thread_key: str, *, model: str | None = None) -> RunRecord:
        async with self.db.write() as conn:
            run_id = (
                await conn.execute(
                    insert(runs)
                    .values(session_id=session_id, thread_key=thread_key, stage="RUNNING", model=model, started_at=utcnow())
                    .returning(runs.c.id)
                )
            ).scalar_one()
            row = (await conn.execute(select(runs).where(runs.c.id == run_id))).first()
        return to_record(RunRecord, row)

    async def get(self, run_id: int) -> RunRecord | None:
        async with self.db.read() as conn:
            row = (await conn.execute(select(runs).where(runs.c.id == run_id))).first()
        return to_record(RunRecord, row) if row else None

    async def list(self, *, limit: int = 50, session_id: int | None = None, stage: str | None = None) -> list[RunRecord]:
        query = select(runs).order_by(runs.c.id.desc()).limit(limit)
        if session_id is not None:
            query = query.where(runs.c.session_id == session_id)
        if stage is not None:
            query = query.where(runs.c.stage == stage)
        async with self.db.read() as conn:
            rows = (await conn.execute(query)).all()
        return [to_record(RunRecord, r) for r in rows]

    async def add_event(self, run_id: int, kind: str, payload: dict[str, Any], *, parent_seq: int | None = None) -> int:
        """Append an event; its sequence number is allocated inside the same write."""
        async with self.db.write() as conn:
            seq = (
                await conn.execute(
                    update(runs)
                    .where(runs.c.id == run_id)
                    .values(next_event_seq=runs.c.next_event_seq + 1)
                    .returning(runs.c.next_event_seq - 1)
                )
            ).scalar_one()
            await conn.execute(
                insert(run_events).values(run_id=run_id, seq=seq, kind=kind, at=utcnow(), parent_seq=parent_seq, payload=payload)
            )
        return seq

    async def events(self, run_id: int) -> list[RunEventRecord]:
        async with self.db.read() as conn:
            rows = (await conn.execute(select(run_events).where(run_events.c.run_id == run_id).order_by(run_events.c.seq))).all()
        return [to_record(RunEventRecord, r) for r in rows]

    async def add_totals(self, run_id: int, *, cost_nano_usd: int | None = None, unpriced: bool = False, model: str | None = None, **counts: int) -> None:
        values: dict[str, Any] = {name: getattr(runs.c, name) + counts[name] for name in _TOTALS if counts.get(name)}
        if cost_nano_usd is not None:
            values["cost_nano_usd"] = runs.c.cost_nano_usd + cost_nano_usd
        if unpriced:
            values["unpriced"] = True
        if model:
            values["model"] = model
        if not values:
            return
        async with self.db.write() as conn:
            if cost_nano_usd is not None:
                await conn.execute(update(runs).where(runs.c.id == run_id, runs.c.cost_nano_usd.is_(None)).values(cost_nano_usd=0))
            await conn.execute(update(runs).where(runs.c.id == run_id).values(**values))

    async def set_stage(self, run_id: int, stage: str, *, end_reason: str | None = None, error: str | None = None) -> None:
        values: dict[str, Any] = {"stage": stage}
        if end_reason is not None:
            values["end_reason"] = end_reason
        if error is not None:
            values["error"] = error
        if stage in ("SUCCESS", "FAILED", "CANCELED"):
            values["finished_at"] = utcnow()
        async with self.db.write() as conn:
            await conn.execute(update(runs).where(runs.c.id == run_id).values(**values))

    async def session_totals(self, session_id: int) -> dict[str, int | None]:
        from sqlalchemy import func

        async with self.db.read() as conn:
            row = (
                await conn.execute(
                    select(
                        func.coalesce(func.sum(runs.c.input_tokens), 0).label("input_tokens"),
                        func.coalesce(func.sum(runs.c.cached_tokens), 0).label("cached_tokens"),
                        func.coalesce(func.sum(runs.c.output_tokens), 0).label("output_tokens"),
                        func.sum(runs.c.cost_nano_usd).label("cost_nano_usd"),
                        func.count().label("runs"),
                    ).where(runs.c.session_id == session_id)
                )
            ).first()
        return dict(row._mapping)
