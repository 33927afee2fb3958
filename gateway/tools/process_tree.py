"""Ending a command with everything it started. Its process group is not enough: bubblewrap's
`--new-session` runs the sandbox's init in a session of its own, out of the group's reach, and
its parent-death signal was seen not to fire when the outer bwrap was killed (the sandbox then
ran on, holding the output pipe, and the call's cancel waited for it). So a command still
running is ended by its descendants first (the sandbox's init among them, whose death ends its
PID namespace), then its group."""

from __future__ import annotations

import os
import signal

_PROC = "/proc"


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s descendants, then its process group (`pid` leads it: start_new_session).
    Only for a process not yet reaped: a reaped one's pid may already be another's."""
    for descendant in descendants(pid):
        _kill(descendant)
    kill_group(pid)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def descendants(root: int) -> list[int]:
    """The processes below `root`, parents before children (none where there is no /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e.name for e in os.scandir(_PROC) if e.name.isdigit()]
    except OSError:
        return []
    for name in entries:
        parent = _parent(name)
        if parent is not None:
            children.setdefault(parent, []).append(int(name))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def _parent(pid: str) -> int | None:
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None  # gone since the listing
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
    fields = stat.rsplit(b")", 1)[-1].split()
    return int(fields[1]) if len(fields) > 1 else None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
