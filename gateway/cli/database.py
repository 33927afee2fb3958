"""The configured database as `gateway status` and `gateway doctor` see it, changing nothing: is
`database.url` one the gateway can use (SQLite, or PostgreSQL through asyncpg) with its driver
installed, does the server answer (within a few seconds), and at which schema revision.

What is wrong is the store's own line for it (gateway/store/failures.py: what happened, the
setting, what to do), so these commands and `serve` say the same. Nothing is created or
migrated here: a SQLite file that does not exist yet is said to be so, and an unreachable
PostgreSQL is found by a TCP connection with a timeout before the driver (whose own timeout is
a minute) is asked anything.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, urlsplit

from gateway.config.redaction import redact_url
from gateway.store import Store, StoreError
from gateway.store.db import SCHEMA_REVISION, current_revision
from gateway.store.failures import SETTING, connection_failure

Kind = Literal["sqlite", "postgresql"]


@dataclass(frozen=True)
class DatabaseState:
    url: str  # redacted
    kind: Kind
    reachable: bool = False
    created: bool = True  # False: a SQLite file not created yet (or one that cannot be)
    revision: str | None = None  # alembic's; None before the first migration
    problem: str = ""  # what is wrong, in one line with the fix
    note: str = ""  # what is worth knowing that is not wrong (what creates a missing file)

    @property
    def current(self) -> bool:
        return self.reachable and self.revision == SCHEMA_REVISION

    @property
    def ahead(self) -> bool:
        """A schema from a newer gateway: migrating it down is not ours to do."""
        return self.revision is not None and self.revision > SCHEMA_REVISION  # four digits: text order

    def schema(self) -> str:
        """The schema's revision in words: current, behind (with the fix), or ahead."""
        if self.revision is None:
            return f"no tables yet (gateway serve or gateway migrate creates schema {SCHEMA_REVISION})"
        if self.current:
            return f"schema {self.revision} (current)"
        if self.ahead:
            return f"schema {self.revision}, newer than this gateway's {SCHEMA_REVISION}: upgrade the gateway"
        return f"schema {self.revision} (behind {SCHEMA_REVISION}: run gateway migrate)"


@asynccontextmanager
async def opened(url: str, timeout_s: float) -> AsyncIterator[tuple[DatabaseState, Store | None]]:
    """The database's state and, when it answered, a store to read it with (closed after)."""
    shown = redact_url(url)
    kind: Kind = "sqlite" if url.lower().startswith("sqlite") else "postgresql"
    if kind == "sqlite" and (missing := _missing_file(url)) is not None:
        yield DatabaseState(shown, kind, created=False, problem=missing[0], note=missing[1]), None
        return
    try:
        store = Store(url, pool_size=1, max_overflow=1, application_name="gateway-status")
    except StoreError as exc:  # a URL it cannot use, a driver not installed, a file it cannot open
        yield DatabaseState(shown, kind, problem=str(exc)), None
        return
    try:
        state = await _connected(store, shown, kind, timeout_s)
        yield state, store if state.reachable else None
    finally:
        await store.close()


async def _connected(store: Store, shown: str, kind: Kind, timeout_s: float) -> DatabaseState:
    try:
        if kind == "postgresql":
            await _server_accepts(store.db.url, timeout_s)
        revision = await current_revision(store.db)
    except Exception as exc:  # noqa: BLE001 - whatever the driver raised is the answer, in one line
        return DatabaseState(shown, kind, problem=_failure_line(exc, store))
    return DatabaseState(shown, kind, reachable=True, revision=revision)


async def _server_accepts(url: str, timeout_s: float) -> None:
    """Raise the OSError of a TCP connection to the PostgreSQL server that failed or timed out
    (a Unix socket, named by `?host=`, is left to the driver)."""
    parts = urlsplit(url)
    if "host" in parse_qs(parts.query):
        return
    connecting = asyncio.open_connection(parts.hostname or "localhost", parts.port or 5432)
    _, writer = await asyncio.wait_for(connecting, timeout_s)
    writer.close()


def _failure_line(exc: Exception, store: Store) -> str:
    failure = connection_failure(exc, store.db.parsed_url)
    if failure is not None:
        return str(failure)
    original = getattr(exc, "orig", None) or exc  # the driver's own words, not SQLAlchemy's wrapping
    said = str(original).strip().splitlines()
    return f"cannot read the database ({said[0] if said else type(original).__name__}): check {SETTING}"


def _missing_file(url: str) -> tuple[str, str] | None:
    """('', what creates it) for a SQLite file not created yet, (why, '') when it cannot be created
    where the URL says; None when it exists (or the database is in memory)."""
    rest = url.split("://", 1)[-1].split("?", 1)[0]
    name = rest[1:] if rest.startswith("/") else rest
    if name in ("", ":memory:") or Path(name).exists():
        return None
    path = Path(name)
    ancestor = next(parent for parent in path.absolute().parents if parent.exists())
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{path} cannot be created: {ancestor} is not writable: choose a writable place in {SETTING}", ""
    return "", f"the first gateway serve or gateway migrate creates {path}"
