"""Ticks' checklist files: `<agent.workspace>/checklists/<name>`, read and written without links.

The directory sits beside `sessions/`, outside every session's directory, so no session's file
tools or sandboxed shell reach it: a checklist changes only through the `checklist` tool (in a
conversation with a person, with an approval) or by the operator's hand. The scheduler reads it
before each firing of a tick that names it; a link planted there is never followed.
"""

from __future__ import annotations

import os
from pathlib import Path

from gateway.files.workspace import CHECKLISTS, base_dir, open_dirs, read_regular, write_fresh

MAX_FILE_BYTES = 64 * 1024


class ChecklistFiles:
    def __init__(self, workspace: Path | str):
        self.root = base_dir(workspace)

    def path(self, name: str) -> Path:
        return self.root / CHECKLISTS / name

    def read(self, name: str) -> str | None:
        """The checklist's text (at most MAX_FILE_BYTES of it); None when it is missing or not a
        regular file."""
        if not (self.root / CHECKLISTS).is_dir():
            return None
        fd = open_dirs(self.root, [CHECKLISTS])
        try:
            data = read_regular(fd, name)
        finally:
            os.close(fd)
        return None if data is None else data[:MAX_FILE_BYTES].decode("utf-8", errors="replace")

    def write(self, name: str, text: str) -> None:
        data = text.encode("utf-8")
        if len(data) > MAX_FILE_BYTES:
            raise ValueError(f"a checklist holds at most {MAX_FILE_BYTES // 1024} KiB; this one is {len(data)} bytes")
        fd = open_dirs(self.root, [CHECKLISTS])
        try:
            write_fresh(fd, name, data)
        finally:
            os.close(fd)
