"""The gateway's files are its user's alone: the database holds every conversation and stored
token, the workspace what people sent and what the tools wrote. What the gateway creates is
0600 (directories 0700) whatever the umask it was started with, and what an earlier version
left open (0644 / 0755) is closed where it is found. Standard library only: the store, the
workspace and the command line use it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077  # the process's: what it creates, and what its commands and servers create
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
OTHERS = 0o077  # the group's and everyone else's rights


def private_by_default() -> None:
    """Everything the process creates from now on is private (the first thing a command does)."""
    os.umask(PRIVATE_UMASK)


def make_dirs(path: Path) -> None:
    """`path` and its missing parents, each created 0700 (`mkdir(parents=True)` gives the mode to
    the last one only)."""
    missing = []
    current = Path(path)
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=PRIVATE_DIR)


def create_private(path: Path) -> None:
    """An empty file created 0600 when missing (SQLite gives its WAL and shared memory the
    database file's mode, so they are private too)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE))


def close_to_others(path: Path) -> bool:
    """Take the group's and others' rights off a file or directory of ours (never through a
    link, never someone else's); whether anything changed."""
    try:
        found = path.lstat()
    except FileNotFoundError:
        return False
    mode = stat.S_IMODE(found.st_mode)
    if stat.S_ISLNK(found.st_mode) or not mode & OTHERS or found.st_uid != os.geteuid():
        return False
    try:
        os.chmod(path, mode & ~OTHERS)
    except OSError:  # a read-only file system: nothing we could change
        return False
    return True
