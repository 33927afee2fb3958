"""PostgreSQL LISTEN/NOTIFY wake-ups between instances: a hint, never the source of truth.

`submit` publishes the threads it stored work for; every instance listens and wakes its
dispatcher at once instead of at its next poll. Polling (`inbox.poll_interval_s`) stays the
fallback: a lost notification (the listener reconnecting, a transaction-pooling PgBouncer,
which does not carry LISTEN) only costs the poll interval. On SQLite there is one process
(or a console beside it) and these do nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from gateway.store.db import Database

log = logging.getLogger(__name__)
CHANNEL = "gateway_inbox"
_NOTIFY = text("SELECT pg_notify(:channel, :thread)")
RECONNECT_S = 2.0


def publish_in(conn: Connection, thread_keys: set[str], *, channel: str = CHANNEL) -> None:
    """Inside the transaction that stored the work: PostgreSQL delivers it at commit, never
    before (and not at all on a rollback)."""
    if conn.dialect.name != "postgresql":
        return
    for key in sorted(thread_keys):
        conn.execute(_NOTIFY, {"channel": channel, "thread": key})


async def publish(db: Database, thread_keys: set[str], *, channel: str = CHANNEL) -> None:
    """Tell the other instances these threads have new work (after it was committed)."""
    if db.is_sqlite or not thread_keys:
        return
    try:
        await db.write(lambda conn: publish_in(conn, thread_keys, channel=channel))
    except Exception:  # noqa: BLE001 - a hint: polling finds the work anyway
        log.debug("pg_notify failed", exc_info=True)


async def listen(
    db: Database, on_thread: Callable[[str], None], stopped: asyncio.Event, *, channel: str = CHANNEL
) -> None:
    """Call `on_thread` for every thread another instance published, until `stopped` is set;
    reconnects after a dropped connection (what was published meanwhile is found by polling)."""
    if db.is_sqlite:
        return
    while not stopped.is_set():
        try:
            async with db.engine.connect() as conn:
                raw = await conn.get_raw_connection()
                driver: Any = raw.driver_connection  # the asyncpg connection

                def received(_conn, _pid, _channel, payload: str) -> None:  # noqa: ANN001
                    on_thread(payload)

                await driver.add_listener(channel, received)
                try:
                    while not stopped.is_set() and not driver.is_closed():
                        try:
                            await asyncio.wait_for(stopped.wait(), RECONNECT_S)
                        except TimeoutError:
                            pass
                finally:
                    if not driver.is_closed():
                        await driver.remove_listener(channel, received)
        except Exception:  # noqa: BLE001 - the database went away: poll meanwhile, then retry
            log.warning("LISTEN %s failed; relying on polling until it reconnects", channel, exc_info=True)
            try:
                await asyncio.wait_for(stopped.wait(), RECONNECT_S)
            except TimeoutError:
                pass
