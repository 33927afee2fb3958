"""What a database the operator pointed us at can do wrong, as one line each: a URL that is not
one, an engine or driver we do not use, a server that cannot be reached, a database that does
not exist, a login refused, a schema from another version. Each names `database.url` and its
environment variable and says what to do; the command line turns its kind into an exit code."""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from gateway.events import FailureKind, OperatorError

SETTING = "database.url (GATEWAY_DATABASE_URL)"
EXAMPLES = "sqlite+aiosqlite:///data/gateway.db or postgresql+asyncpg://user:password@host:5432/name"
PG_DRIVER = "postgresql+asyncpg"
_DOES_NOT_EXIST = "3D000"  # invalid_catalog_name
_LOGIN_REFUSED = ("28000", "28P01")  # invalid_authorization_specification, invalid_password


class StoreError(OperatorError):
    """A database problem worded for the operator."""

    def __init__(self, line: str, *, kind: FailureKind = "database_schema"):
        super().__init__(line, kind=kind)


def shown(url: URL) -> str:
    """The URL without its password; a SQLite database by its file."""
    if url.get_backend_name() == "sqlite":
        return url.database or ":memory:"
    return url.render_as_string(hide_password=True)


def sqlite_file(url: str) -> Path | None:
    """The SQLite database's file; None for PostgreSQL (or a database in memory)."""
    parsed = make_url(url)
    if not parsed.get_backend_name().startswith("sqlite") or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def parse_database_url(url: str) -> URL:
    """The URL, if it names an engine and driver the gateway uses: SQLite, or PostgreSQL through
    asyncpg (`postgresql://` alone means psycopg to SQLAlchemy, which is not installed)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        where = url.rpartition("@")[2]  # never the password
        raise StoreError(
            f"{SETTING} is {where!r}, which is not a database URL: write {EXAMPLES}", kind="database_url"
        ) from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return parsed
    if backend in ("postgresql", "postgres"):
        if parsed.drivername != PG_DRIVER:
            fixed = parsed.set(drivername=PG_DRIVER).render_as_string(hide_password=True)
            raise StoreError(
                f"{SETTING} starts with {parsed.drivername}://, which selects a driver the gateway does not use "
                f"(psycopg): write {PG_DRIVER}:// instead ({fixed})",
                kind="database_url",
            )
        return parsed
    raise StoreError(
        f"{SETTING}: {backend} is not supported; the gateway stores in SQLite or PostgreSQL: write {EXAMPLES}",
        kind="database_url",
    )


def driver_missing(url: URL) -> StoreError:
    return StoreError(
        f"{SETTING} is PostgreSQL ({shown(url)}), but its driver asyncpg is not installed: "
        "pip install 'chat-gateway[postgres]' (make install does), or use SQLite",
        kind="database_url",
    )


def sqlite_unusable(url: URL, exc: OSError | sqlite3.Error) -> StoreError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return StoreError(
        f"cannot open the SQLite database {shown(url)} ({reason}): create its directory, or set {SETTING} "
        "to a path the gateway's user may write (relative to the config file's directory)",
        kind="database_unreachable",
    )


def connection_failure(exc: BaseException, url: URL) -> StoreError | None:
    """The operator's line for a failure to connect, or None when it is not one."""
    chain = list(_causes(exc))
    state = next((str(getattr(e, "sqlstate", "")) for e in chain if getattr(e, "sqlstate", None)), "")
    if url.get_backend_name() == "sqlite":
        opened = next((e for e in chain if isinstance(e, (sqlite3.OperationalError, OSError))), None)
        if isinstance(opened, OSError) or (opened is not None and "unable to open" in str(opened)):
            return sqlite_unusable(url, opened)
        return None
    server = f"{url.host or 'localhost'}:{url.port or 5432}"
    if state == _DOES_NOT_EXIST:
        return StoreError(
            f"PostgreSQL at {server} has no database {url.database!r}: create it "
            f"(createdb -h {url.host or 'localhost'} -U {url.username or 'postgres'} {url.database}), "
            f"or correct the name in {SETTING}",
            kind="database_missing",
        )
    if state in _LOGIN_REFUSED:
        refused = next(str(e) for e in chain if getattr(e, "sqlstate", None))
        return StoreError(
            f"PostgreSQL at {server} refused the login ({refused}): correct the user and password in {SETTING}",
            kind="database_login",
        )
    network = next((e for e in chain if isinstance(e, OSError)), None)
    if network is None:
        return None
    if isinstance(network, socket.gaierror):
        reason, fix = "no such host", f"correct the host in {SETTING}"
    else:
        reason = "connection refused" if isinstance(network, ConnectionRefusedError) else (
            "timed out" if isinstance(network, TimeoutError) else network.strerror or str(network)
        )
        fix = f"start PostgreSQL there, or correct the host and port in {SETTING}"
    return StoreError(f"cannot connect to PostgreSQL at {server} ({reason}): {fix}", kind="database_unreachable")


def _causes(exc: BaseException | None) -> Iterator[BaseException]:
    """The exception, what it was raised from or during, and a driver error's own error."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        inner = getattr(exc, "orig", None)
        if isinstance(inner, BaseException) and id(inner) not in seen:
            yield from _causes(inner)
        exc = exc.__cause__ or exc.__context__


def schema_newer(url: URL, found: str, ours: str) -> StoreError:
    """Old code, new schema: the line names both, and the gateway's own version."""
    return StoreError(
        f"the database {shown(url)} is at schema {found}, newer than this gateway's {ours} "
        f"(gateway {_product_version()}): run the gateway "
        f"version that wrote it (or restore a backup), or point {SETTING} at another database",
        kind="database_schema",
    )


def schema_behind(url: URL, found: str | None, ours: str) -> StoreError:
    state = f"is at schema {found}, not {ours}" if found else "has no schema yet"
    return StoreError(
        f"the database {shown(url)} {state}, and database.auto_migrate is false: run `gateway migrate` first",
        kind="database_schema",
    )


def _product_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("chat-gateway")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "not installed"
