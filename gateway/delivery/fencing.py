"""The lease the current work holds, for every send and every write of a send.

A thread's worker (and the sweeper, for the thread it sweeps) runs under the thread's lease.
Its sends are made deep inside turns, prompts and notices, so the lease travels with the task
(a context variable, set where the lease is taken, inherited by the tasks the work starts)
rather than through every call. The outbox asks `proven()` before each send and hands the
fence to each of its writes, so a holder that stalled past the lease's time to live (a GC
pause, a stopped VM, SIGSTOP) neither sends nor records a send once another instance has
taken the thread over.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol

from gateway.store import Fence


class HeldLease(Protocol):
    @property
    def fence(self) -> Fence: ...

    async def prove(self) -> Fence:
        """The fence, once the lease is known to be held now; raises LeaseLost otherwise."""
        ...


_held: ContextVar[HeldLease | None] = ContextVar("held_lease", default=None)


def hold(lease: HeldLease | None) -> None:
    """The lease the current task (and the tasks it starts from now on) works under."""
    _held.set(lease)


def fence() -> Fence | None:
    held = _held.get()
    return held.fence if held is not None else None


async def proven() -> Fence | None:
    """Before a send: the current fence, proven held (None when no lease is held: a send made
    outside any thread's work, such as a startup notice)."""
    held = _held.get()
    return await held.prove() if held is not None else None
