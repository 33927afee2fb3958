"""A small filesystem of the test's own, for the faults of a disk under the SQLite database: an
ext4 image on a loop device, mounted under the test's directory. It fills up (a file takes
every free block, SQLite then gets SQLITE_FULL) and frees again; its database files go
read-only and back (`chattr +i` on the database, its WAL and their directory: the open
connection's writes fail with SQLITE_IOERR_WRITE, a new connection's with SQLITE_READONLY).

Mounting needs root (CAP_SYS_ADMIN) and a loop device: `SmallDisk.problem()` says why not, for
a skip. The shared memory file (-shm) is never made immutable: SQLite maps it, and a write to
an immutable mapped file is a SIGBUS, not an error."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

FILLER = "filler"


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False)


class SmallDisk:
    def __init__(self, root: Path, size_mb: int = 24):
        self.root = root
        self.image = root / "disk.img"
        self.mount = root / "disk"
        self.size_mb = size_mb
        self.mounted = False
        self.frozen: list[Path] = []

    @staticmethod
    def problem() -> str:
        """Why a small disk cannot be mounted here ("" when it can)."""
        if os.geteuid() != 0:
            return "mounting a small disk needs root"
        for tool in ("mkfs.ext4", "mount", "umount", "chattr"):
            if shutil.which(tool) is None:
                return f"{tool} is not installed"
        if not Path("/dev/loop-control").exists():
            return "no loop devices (/dev/loop-control)"
        return ""

    def __enter__(self) -> SmallDisk:
        self.mount.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as image:
            image.truncate(self.size_mb * 1024 * 1024)
        made = _run("mkfs.ext4", "-q", "-F", "-m", "0", str(self.image))
        if made.returncode != 0:
            raise OSError(f"mkfs.ext4: {made.stderr.strip()}")
        mounted = _run("mount", "-o", "loop", str(self.image), str(self.mount))
        if mounted.returncode != 0:
            raise OSError(f"mount: {mounted.stderr.strip()}")
        self.mounted = True
        (self.mount / "data").mkdir()
        return self

    def __exit__(self, *_: object) -> None:
        self.writable()
        self.free()
        if self.mounted:
            _run("umount", "-l", str(self.mount))
            self.mounted = False
        with contextlib.suppress(OSError):
            self.image.unlink()

    @property
    def data(self) -> Path:
        return self.mount / "data"

    def fill(self) -> None:
        """Every free block taken by one file (ENOSPC from then on). ext4 gives back the blocks it
        had set aside for a file when the file is closed: filled again until nothing is left."""
        for _ in range(10):
            with open(self.mount / FILLER, "ab") as filler:
                for size in (1 << 20, 4096):
                    block = b"\0" * size
                    with contextlib.suppress(OSError):
                        while True:
                            filler.write(block)
                            filler.flush()
                with contextlib.suppress(OSError):
                    os.fsync(filler.fileno())
            if self.free_bytes() < 64 * 1024:
                return

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.mount / FILLER).unlink()

    def free_bytes(self) -> int:
        stat = os.statvfs(self.mount)
        return stat.f_bavail * stat.f_frsize

    def read_only(self, database: Path) -> None:
        """The database, its WAL and its directory immutable (-shm left alone, see above)."""
        targets = [database, database.with_name(database.name + "-wal"), database.parent]
        for path in targets:
            if path.exists():
                done = _run("chattr", "+i", str(path))
                if done.returncode != 0:
                    raise OSError(f"chattr +i {path}: {done.stderr.strip()}")
                self.frozen.append(path)

    def writable(self) -> None:
        for path in self.frozen:
            _run("chattr", "-i", str(path))
        self.frozen = []


@contextlib.contextmanager
def small_disk(root: Path, size_mb: int = 24) -> Iterator[SmallDisk]:
    with SmallDisk(root, size_mb) as disk:
        yield disk
