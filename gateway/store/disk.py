"""A SQLite database whose disk refuses writes: full (SQLITE_FULL), or read-only (SQLITE_READONLY,
or SQLITE_IOERR from a file system remounted read-only or a file made immutable under an open
connection). Such a write raises `DatabaseUnwritable` (the channels' `StoreUnwritable`: nothing
stored, nothing acknowledged), the log says so once with the fix, /readyz says so while it lasts,
and the first write that succeeds again ends it, with a line of its own. Nothing restarts: every
loop that writes (polling, the leader lease, the outbox) simply tries again."""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
from pathlib import Path

from gateway.events import StoreUnwritable

log = logging.getLogger("gateway.store.db")

SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN = 8, 10, 13, 14
ROOM_BYTES = 1 << 20  # a disk with less free is still full, even when a small write went through
RESUMES = (
    "until then nothing new is acknowledged to Telegram or Slack (they deliver it again) and the "
    "gateway resumes by itself"
)


class DatabaseUnwritable(StoreUnwritable):
    def __init__(self, line: str, kind: str):
        super().__init__(line)
        self.kind = kind  # "full" | "read-only" | "io"


def sqlite_error_code(exc: BaseException) -> int | None:
    """The primary SQLite result code of a driver error (wrapped by SQLAlchemy or not)."""
    for error in (getattr(exc, "orig", None), exc, exc.__cause__):
        if isinstance(error, sqlite3.Error):
            code = getattr(error, "sqlite_errorcode", None)
            if isinstance(code, int):
                return code & 0xFF
            text = str(error).lower()
            if "disk is full" in text:
                return SQLITE_FULL
            if "readonly database" in text:
                return SQLITE_READONLY
            if "disk i/o error" in text:
                return SQLITE_IOERR
    return None


def _free_bytes(folder: Path) -> int | None:
    try:
        stat = os.statvfs(folder)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def _why_not_writable(database: Path) -> str:
    """What refuses a write to the file: its file system read-only, or the file (or its folder) not writable."""
    for path in (database, database.with_name(database.name + "-wal")):
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno == errno.EROFS:
                return "its file system is mounted read-only"
            if exc.errno in (errno.EPERM, errno.EACCES):
                return f"{path.name} is not writable (its permissions, or an immutable attribute: lsattr)"
            return f"{path.name}: {exc.strerror}"
        os.close(fd)
    try:
        if os.statvfs(database.parent).f_flag & os.ST_RDONLY:
            return "its file system is mounted read-only"
    except OSError:
        pass
    return ""


def diagnose(database: Path | None, code: int) -> DatabaseUnwritable:
    """The one line for a write the disk refused: the cause and the fix."""
    where = str(database) if database else "the database"
    folder = database.parent if database else None
    free = _free_bytes(folder) if folder else None
    if code == SQLITE_FULL or (free is not None and free < ROOM_BYTES and code == SQLITE_IOERR):
        return DatabaseUnwritable(
            f"the database's disk is full ({where}): free space on it; {RESUMES}", "full"
        )
    why = _why_not_writable(database) if database else ""
    if code in (SQLITE_READONLY, SQLITE_CANTOPEN) or why:
        return DatabaseUnwritable(
            f"the database is read-only ({where}{': ' + why if why else ''}): make it, its -wal file and its "
            f"folder writable again (mount -o remount,rw, chattr -i, chmod); {RESUMES}",
            "read-only",
        )
    return DatabaseUnwritable(
        f"the database's disk failed a write ({where}: disk I/O error): check the disk (dmesg) and that "
        f"the file system is writable; {RESUMES}",
        "io",
    )


class WriteHealth:
    """Whether the database's disk takes writes, as the last write found."""

    def __init__(self, database: Path | None):
        self.database = database
        self.fault: DatabaseUnwritable | None = None

    def refused(self, exc: BaseException) -> DatabaseUnwritable | None:
        """The fault a failed write shows (said once per fault), or None when it is not the disk's."""
        code = sqlite_error_code(exc)
        if code not in (SQLITE_FULL, SQLITE_READONLY, SQLITE_IOERR, SQLITE_CANTOPEN):
            return None
        fault = diagnose(self.database, code)
        if self.fault is None or self.fault.kind != fault.kind:  # once per fault, not per file it names
            log.error("%s", fault)
            self.fault = fault
        return fault

    def succeeded(self) -> None:
        """A write went through. A full disk can still take a small write (SQLite reuses its WAL's
        space): the fault ends when the disk has room again, or the file is writable again."""
        if self.fault is None or self._still(self.fault):
            return
        log.warning("the database takes writes again (%s): acknowledging messages again", self.database)
        self.fault = None

    def _still(self, fault: DatabaseUnwritable) -> bool:
        if self.database is None:
            return False
        if fault.kind == "full":
            free = _free_bytes(self.database.parent)
            return free is not None and free < ROOM_BYTES
        if fault.kind == "read-only":
            return bool(_why_not_writable(self.database))
        return False

    @property
    def line(self) -> str | None:
        return str(self.fault) if self.fault is not None else None
