"""Run records (one per turn) and their events."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, insert, select, update

from gateway.store.base import Repo, to_record, utcnow
from gateway.store.records import RunEventRecord, RunRecord
from gateway.store.tables import run_events, runs

_TOTALS = ("input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens", "llm_calls", "tool_calls", "rounds")


class RunRepo(Repo):
    async def start(self, session_id: int, thread_key: str, *, model: str | None = None) -> RunRecord:
        async with self.db.write() as conn:
            row = (
                await conn.execute(
                    insert(runs)
                    .values(session_id=session_id, thread_key=thread_key, stage="RUNNING", model=model, started_at=utcnow())
                    .returning(*runs.c)
                )
            ).first()
        return to_record(RunRecord, row)

    async def last_event_seq(self, run_id: int, kind: str) -> int | None:
        async with self.db.read() as conn:
            return (
                await conn.execute(select(func.max(run_events.c.seq)).where(run_events.c.run_id == run_id, run_events.c.kind == kind))
            ).scalar()

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

    async def add_event(self, run_id: int, kind: str, payload: dict[str, Any], *, parent_seq: int | None = None, **totals: Any) -> int:
        """Append an event (and add `totals`, as for add_totals); its sequence number is
        allocated inside the same write."""
        return (await self.add_events(run_id, [(kind, payload, parent_seq)], **totals))[-1]

    async def add_events(self, run_id: int, events: list[tuple[str, dict[str, Any], int | None]], **totals: Any) -> list[int]:
        """Append several events and update the run's totals in one transaction."""
        async with self.db.write() as conn:
            first = (
                await conn.execute(
                    update(runs)
                    .where(runs.c.id == run_id)
                    .values(next_event_seq=runs.c.next_event_seq + len(events), **self._totals(totals))
                    .returning(runs.c.next_event_seq - len(events))
                )
            ).scalar_one()
            now = utcnow()
            rows = [
                {"run_id": run_id, "seq": first + i, "kind": kind, "at": now, "parent_seq": parent, "payload": payload}
                for i, (kind, payload, parent) in enumerate(events)
            ]
            await conn.execute(insert(run_events), rows)
        return [first + i for i in range(len(events))]

    @staticmethod
    def _totals(totals: dict[str, Any]) -> dict[str, Any]:
        values: dict[str, Any] = {name: getattr(runs.c, name) + totals[name] for name in _TOTALS if totals.get(name)}
        cost = totals.get("cost_nano_usd")
        if cost is not None:
            values["cost_nano_usd"] = func.coalesce(runs.c.cost_nano_usd, 0) + cost
        if totals.get("unpriced"):
            values["unpriced"] = True
        if totals.get("model"):
            values["model"] = totals["model"]
        return values

    async def events(self, run_id: int) -> list[RunEventRecord]:
        async with self.db.read() as conn:
            rows = (await conn.execute(select(run_events).where(run_events.c.run_id == run_id).order_by(run_events.c.seq))).all()
        return [to_record(RunEventRecord, r) for r in rows]

    async def add_totals(self, run_id: int, **totals: Any) -> None:
        """Add token counts, calls, rounds and cost (`cost_nano_usd`, `unpriced`, `model`)."""
        values = self._totals(totals)
        if not values:
            return
        async with self.db.write() as conn:
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
