"""Keeping a thread's lease while work runs, and proving it before a send.

The lease is renewed every third of its time to live. A send asks `prove()` first: when the
last renewal is recent (within two thirds of the TTL, by the local monotonic clock) the lease
is certainly still ours; when it is not (the process was stalled: the renewals did not run),
the lease is renewed on the spot, and if another instance took it meanwhile the send does not
happen (LeaseLost). Checking the local clock costs nothing on the common path, so a stalled
holder is caught before its first send after waking, not only at its next renewal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gateway.running.lifecycle import Stopper
from gateway.store import Fence, Lease, LeaseLost, Store

log = logging.getLogger("gateway.inbox.inbox")
PROVEN_FOR = 2 / 3  # of the TTL after a renewal: the lease is ours without asking the database


class LeaseHolder:
    """Renews a lease while work runs; reports when it was lost (another instance took over)."""

    def __init__(self, store: Store, lease: Lease, ttl_s: float, *, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.lease = lease
        self.ttl_s = ttl_s
        self.valid = True
        self.stopper = Stopper()
        self._clock = clock
        self._confirmed = clock()  # taken just now by the dispatcher
        self._on_lost: Callable[[], None] = lambda: None

    @property
    def fence(self) -> Fence:
        return Fence(self.lease.name, self.lease.owner, self.lease.fence)

    async def keep(self, *, on_lost: Callable[[], None]) -> None:
        self._on_lost = on_lost
        while not await self.stopper.sleep(self.ttl_s / 3):
            try:
                await self._renew()
            except LeaseLost:
                return
            except Exception:  # noqa: BLE001 - a blip; the next renewal may succeed
                log.warning("could not renew %s", self.lease.name, exc_info=True)

    async def prove(self) -> Fence:
        if not self.valid:
            raise LeaseLost(f"lease {self.lease.name} was lost")
        if self._clock() - self._confirmed >= self.ttl_s * PROVEN_FOR:
            log.warning("%s: not renewed for %.1fs; proving it before sending", self.lease.name, self._since())
            await self._renew()
        return self.fence

    async def _renew(self) -> None:
        asked = self._clock()
        renewed = await self.store.inbox.renew(self.lease, self.ttl_s)
        if renewed is None:
            self.valid = False
            self._on_lost()
            raise LeaseLost(f"lease {self.lease.name} (fence {self.lease.fence}) was taken over")
        self.lease, self._confirmed = renewed, asked

    def _since(self) -> float:
        return self._clock() - self._confirmed
