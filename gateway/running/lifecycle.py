"""Cooperative stopping.

Tasks that write to the database are never cancelled mid-statement (a cancelled SQLAlchemy
statement invalidates its connection, and a SQLite connection closed mid-statement can keep the
write lock). They are asked to stop instead; only the parts that are safe to abandon at once
(an LLM stream, a running tool) are cancelled, through `interruptible`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Interrupted(Exception):
    """Raised by `interruptible` when a stop was requested while the work ran."""


class Stopper:
    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.reason = ""

    @property
    def stopped(self) -> bool:
        return self.event.is_set()

    def stop(self, reason: str = "") -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()

    async def sleep(self, seconds: float) -> bool:
        """Sleep, waking early on a stop. Returns True when stopped."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.event.wait(), seconds)
        return self.stopped


async def interruptible(work: Awaitable[T], stopper: Stopper) -> T:
    """Run `work`; if a stop is requested first, cancel it and raise Interrupted."""
    task = asyncio.ensure_future(work)
    if stopper.stopped:
        task.cancel()
    waiter = asyncio.ensure_future(stopper.event.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        waiter.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise Interrupted(stopper.reason)
    if task.cancelled():
        raise Interrupted(stopper.reason)
    return task.result()


def run_main(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run`, with child processes awaited through pidfds on Python 3.11, as 3.12 does by
    default: 3.11's default watcher starts a thread for every child, about 1 ms of CPU per
    command (a scheduled check's command runs every firing). The watcher is taken back at the end,
    so a later loop in this process gets asyncio's default again."""
    if sys.version_info >= (3, 12) or not _pidfd_works():
        return asyncio.run(main)
    with asyncio.Runner() as runner:
        watcher = asyncio.PidfdChildWatcher()
        watcher.attach_loop(runner.get_loop())
        asyncio.set_child_watcher(watcher)
        try:
            return runner.run(main)
        finally:
            asyncio.set_child_watcher(None)  # type: ignore[arg-type]  # None: back to the default


def _pidfd_works() -> bool:
    """Whether this kernel has pidfd_open (Linux 5.3+)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True
