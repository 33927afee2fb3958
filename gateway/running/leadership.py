"""The leader lease: one instance at a time runs the leader's duties; every instance heartbeats.

The duties are the work that must not run twice across instances (Telegram long polling, the
scheduler clock, retention pruning). The composition root says what they are and how they
start and stop; this module decides when this instance holds them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gateway.config import RetentionConfig
from gateway.events import StoreUnwritable
from gateway.running.lifecycle import Stopper
from gateway.serving import metrics
from gateway.store import Lease, RetentionDays, Store, notify
from gateway.store.console import HEARTBEAT_PREFIX
from gateway.store.holds import HOLDS_CHANNEL

log = logging.getLogger(__name__)
LEADER_LEASE = "leader"

StartDuties = Callable[[], Awaitable[list[asyncio.Task]]]
StopDuties = Callable[[list[asyncio.Task]], Awaitable[None]]
OnInstances = Callable[[int], None]


class Leadership:
    def __init__(
        self,
        store: Store,
        instance_id: str,
        ttl: float,
        *,
        start_duties: StartDuties,
        stop_duties: StopDuties,
        on_instances: OnInstances | None = None,
    ) -> None:
        """`on_instances`: told after every heartbeat how many instances beat (this one included)."""
        self.store = store
        self.on_instances = on_instances
        self._beat_name = f"{HEARTBEAT_PREFIX}{instance_id}"
        self._beat: Lease | None = None
        self.instance_id = instance_id
        self.ttl = ttl
        self._start_duties = start_duties
        self._stop_duties = stop_duties
        self._stopper = Stopper()

    def stop(self) -> None:
        """`run` gives up its duties and the lease, and returns."""
        self._stopper.stop()

    async def run(self) -> None:
        ttl = self.ttl
        duties: list[asyncio.Task] = []
        lease = None
        try:
            while not self._stopper.stopped:
                unwritable = False
                try:
                    lease = await (
                        self.store.inbox.renew(lease, ttl)
                        if lease
                        else self.store.inbox.acquire(LEADER_LEASE, self.instance_id, ttl)
                    )
                except StoreUnwritable:  # the disk's fault, said once by the store: tried again each round
                    lease, unwritable = None, True
                except Exception:  # noqa: BLE001 - the leader's supervisor loop: the lease lapses, it tries again
                    log.warning("leader lease check failed", exc_info=True)
                    lease = None
                if lease is not None and not duties:
                    log.info("this instance is the leader (fence %s)", lease.fence)
                    _count_leadership("acquired", taken_over=lease.taken_over)
                    duties = await self._start_duties()
                elif lease is None and duties:
                    log.log(
                        logging.INFO if unwritable else logging.WARNING,
                        "leadership lost; stopping polling and the scheduler clock%s",
                        " until the database takes writes again" if unwritable else "",
                    )
                    _count_leadership("lost")
                    await self._stop_duties(duties)
                    duties = []
                await self._heartbeat(ttl)
                await self._stopper.sleep(ttl / 3)
        finally:
            if duties:
                metrics.IS_LEADER.set(0)
            await self._stop_duties(duties)
            if lease is not None:
                await self.store.inbox.release(lease)
            await self._depart()

    async def _heartbeat(self, ttl: float) -> None:
        """Every instance renews its own lease: the console lists instances by it, and the
        instances sharing a bot's rate limits count each other by it (an instance that
        stopped released it; one that died is not counted once it expired)."""
        try:
            beat = await self.store.inbox.acquire(self._beat_name, self.instance_id, ttl)
            self._beat = beat
            if beat is not None and not beat.unreleased:
                await self._announce()  # arrived (or back after a lapse)
            await self.count_instances()
        except Exception:  # noqa: BLE001 - the console's view and the shares wait for the next beat
            log.debug("heartbeat failed", exc_info=True)

    async def _announce(self) -> None:
        """Others recount at once when this instance arrives or leaves (each beat would find it
        too, a third of a lease's time later: meanwhile the bot's budget would be over-shared)."""
        await notify.publish(self.store.db, {self._beat_name}, channel=HOLDS_CHANNEL)

    async def _depart(self) -> None:
        if self._beat is None:
            return
        try:
            await self.store.inbox.release(self._beat)
            await self._announce()
        except Exception:  # noqa: BLE001 - the others find it expired at their beats
            log.debug("releasing the heartbeat failed", exc_info=True)

    async def count_instances(self) -> None:
        """Tell `on_instances` how many instances beat now (this one included)."""
        if self.on_instances is not None:
            self.on_instances(max(1, await self.store.inbox.count_held(HEARTBEAT_PREFIX)))


async def prune_forever(store: Store, cfg: RetentionConfig) -> None:
    """Retention, a leader's duty: one instance deletes, in batches."""
    days = RetentionDays(cfg.inbox_days, cfg.outbox_days, cfg.prompts_days, cfg.run_events_days, cfg.audit_days)
    while True:
        try:
            pruned = await store.retention.prune(days, batch=cfg.batch)
            pruned["memories"] = await store.memory.prune(cfg.memory_days, batch=cfg.batch)
            if any(pruned.values()):
                log.info("retention: pruned %s", ", ".join(f"{n} {k}" for k, n in pruned.items() if n))
        except Exception:  # noqa: BLE001 - the next round tries again
            log.warning("retention pruning failed", exc_info=True)
        await asyncio.sleep(cfg.every_s)


def _count_leadership(event: str, *, taken_over: bool = False) -> None:
    metrics.LEADER_CHANGES.labels(event).inc()
    metrics.IS_LEADER.set(1 if event == "acquired" else 0)
    if taken_over:
        metrics.LEASE_TAKEOVERS.labels("leader").inc()
