"""Who may forget what: the one rule `/memory` (commands.py) and `memory_forget` (tools.py) follow.

- A person's own memory (their direct messages) and a job's: every entry is theirs to forget.
- A chat's memory: an entry is forgotten by the person whose turn saved it, or by an admin;
  clearing all of it takes an admin. A turn that acts for nobody (an operator's job) forgets
  only what such turns saved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gateway.store.memory import MemoryRecord


def personal(owner: str) -> bool:
    return not owner.startswith("chat:")


def may_forget(entry: MemoryRecord, person: str, *, admin: bool) -> bool:
    """Whether `person` ("<channel>:<id>", "" for nobody) may forget `entry` of the memory it is in."""
    return personal(entry.owner) or admin or (entry.created_by or "") == person


def may_clear(owner: str, *, admin: bool) -> bool:
    return personal(owner) or admin


def refusal(memory_id: int) -> str:
    return f"Entry #{memory_id} was saved for someone else; only they or an admin can forget it."


def is_admin(admins: Mapping[str, Sequence[str]], person: str) -> bool:
    """Whether "<channel>:<id>" is one of `approvals.admins`."""
    channel, _, user = person.partition(":")
    return bool(user) and user in {str(a) for a in admins.get(channel) or ()}
