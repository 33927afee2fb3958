"""A tick's checklist: a file of items the tick works through, read before the model is called.

`checklist: heartbeat.md` names a file in the workspace's `checklists/` directory. The model is
called only when the checklist has open items that were not answered yet:

* an **open item** is any line that is not blank, not a Markdown heading (`# ...`), not inside
  an HTML comment (`<!-- ... -->`) and not a checked item (`- [x] ...`); `- [ ] ...`, `- ...`
  and plain text are open. A checklist without an open item (or no file at all) is **empty**.
* the open items are hashed (each stripped, in order); a firing whose hash is the one of the last
  run that ended in success is **already answered**.

Either way the firing is recorded `skipped` ("no change") with no session. Any change to the
open items (added, edited, removed, checked off) wakes the tick once; a run that fails does not
count as an answer, so the next firing tries again.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway.store.schedules import JobRunRecord, ScheduleRecord, ScheduleRepo
from scheduler.checks import NO_CHANGE

log = logging.getLogger(__name__)

CHECKLISTS_DIR = "checklists"  # under agent.workspace, beside sessions/: no session's tools reach it
MAX_CHECKLIST_CHARS = 8_000  # of open items given to the model; the rest is said to be cut
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_HEADING = re.compile(r"^#{1,6}(\s|$)")
_CHECKED = re.compile(r"^([-*+]|\d+[.)])\s+\[[xX]\](\s|$)")

# Reads a checklist by name: its text, or None when there is no such file (the composition root
# gives the scheduler one that reads the workspace without following links).
ReadChecklist = Callable[[str], str | None]


class ChecklistNameError(ValueError):
    """A checklist name that is not a plain file name."""


def check_name(name: str) -> str:
    """The checklist's file name, refused unless it is a plain name (no directories, no dot first)."""
    value = (name or "").strip()
    if not NAME.match(value) or value.endswith(".tmp"):
        raise ChecklistNameError(
            f"checklist {name!r}: use a plain file name such as heartbeat.md (letters, digits, _ . -), "
            f"kept in the workspace's {CHECKLISTS_DIR}/ directory"
        )
    return value


def open_items(text: str) -> list[str]:
    """The checklist's open lines, stripped, in order (see the module's doc for what is open)."""
    items: list[str] = []
    in_comment = False
    for raw in text.splitlines():
        line = raw.strip()
        while line:  # a line may close a comment and open another
            if in_comment:
                end = line.find("-->")
                if end < 0:
                    line = ""
                    break
                in_comment, line = False, line[end + 3 :].strip()
                continue
            start = line.find("<!--")
            if start < 0:
                break
            before, rest = line[:start].strip(), line[start + 4 :]
            end = rest.find("-->")
            if end < 0:
                in_comment, line = True, before
                break
            line = (before + " " + rest[end + 3 :]).strip()
        if not line or _HEADING.match(line) or _CHECKED.match(line):
            continue
        items.append(line)
    return items


def items_hash(items: list[str]) -> str:
    return hashlib.sha256("\n".join(items).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ChecklistReading:
    """What a firing found in its checklist."""

    name: str
    items: tuple[str, ...]
    hash: str
    missing: bool  # no such file (read as empty)

    @property
    def empty(self) -> bool:
        return not self.items


def read_checklist(name: str, read: ReadChecklist) -> ChecklistReading:
    text = read(name)
    items = open_items(text or "")
    return ChecklistReading(name, tuple(items), items_hash(items), text is None)


def wakes(reading: ChecklistReading, answered_hash: str | None) -> bool:
    """Whether the checklist alone is a reason to call the model: open items not yet answered."""
    return not reading.empty and reading.hash != answered_hash


def checklist_block(reading: ChecklistReading) -> str:
    """The checklist as the prompt shows it, after the job's prompt (and before a check's output)."""
    lines = list(reading.items)
    body, cut = "", False
    for line in lines:
        if len(body) + len(line) + 1 > MAX_CHECKLIST_CHARS:
            cut = True
            break
        body += line + "\n"
    note = "\n(the checklist is longer; the rest was left out)" if cut else ""
    return (
        f"## Checklist ({CHECKLISTS_DIR}/{reading.name}: the open items to work through)\n"
        f"{body.rstrip()}{note}\n## End of the checklist"
    )


class ChecklistGate:
    """The checklist's part of a firing: read it, skip the firing when it has nothing new, note
    on a woken run which checklist it answers, and remember that answer when the run succeeds."""

    def __init__(self, repo: ScheduleRepo, read: ReadChecklist | None):
        self.repo = repo
        self.read = read

    def reading(self, schedule: ScheduleRecord) -> ChecklistReading | None:
        """The tick's checklist now; None when the job has none. A file that cannot be read is
        taken as empty (and said in the log): the tick then does not wake for its checklist."""
        if schedule.kind != "tick" or not schedule.checklist:
            return None
        try:
            reading = read_checklist(schedule.checklist, self.read or (lambda name: None))
        except (OSError, ValueError) as exc:
            name = schedule.checklist
            log.warning("job %s: checklist %s cannot be read (%s); taken as empty", schedule.name, name, exc)
            return ChecklistReading(name, (), items_hash([]), True)
        if reading.missing:
            log.debug("job %s: no checklist file %s yet", schedule.name, schedule.checklist)
        return reading

    async def wakes(self, schedule: ScheduleRecord, run: JobRunRecord, reading: ChecklistReading | None) -> bool:
        """Whether the checklist wakes the model for this firing (a run by hand always does)."""
        if reading is None or (reading.empty and run.origin != "manual"):
            return False  # an empty checklist needs no look at what was answered
        if run.origin == "manual":
            return True
        return wakes(reading, (await self.repo.state(schedule.id)).checklist_hash)

    async def skip(self, run: JobRunRecord, reading: ChecklistReading, now: datetime) -> JobRunRecord | None:
        """Close the firing: `skipped`, "no change", no session."""
        found = {"found": NO_CHANGE, "checklist": record(reading)}
        return await self.repo.finish(run.id, status="skipped", error=NO_CHANGE, check_result=found, now=now)

    async def note(self, run: JobRunRecord, reading: ChecklistReading, check: dict[str, Any] | None) -> None:
        """Which checklist the woken run works on (its hash becomes the answered one on success)."""
        await self.repo.set_check_result(run.id, {**(check or {}), "found": "woke", "checklist": record(reading)})

    async def answered(self, run: JobRunRecord) -> None:
        """A run that succeeded answered its checklist: the same open items do not wake again."""
        noted = (run.check_result or {}).get("checklist") if run.status == "success" else None
        if isinstance(noted, dict) and noted.get("hash"):
            await self.repo.save_state(run.schedule_id, checklist_hash=str(noted["hash"]))


def record(reading: ChecklistReading) -> dict[str, Any]:
    """The checklist's part of the firing's `check_result`."""
    return {"name": reading.name, "hash": reading.hash, "open_items": len(reading.items)}
