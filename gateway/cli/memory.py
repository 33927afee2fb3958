"""`gateway memory erase-person <channel>:<id> --yes`: erase what the gateway stores about a person
(gateway/store/erasure.py says what, docs/memory.md what is left), then their direct messages'
session directories and the files they sent, and print what was removed per kind.

It works on the database directly; run it while the person is not mid-conversation (a message
of theirs still waiting to be answered is left, and counted).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from gateway.config import Config
from gateway.files.workspace import session_dir
from gateway.store import Store
from gateway.store.audit import AuditEntry, AuditRepo
from gateway.store.erasure import Erased, ErasureRepo

NOT_ERASED = (
    "Not erased: what others wrote about them or quoted from them, the agent's replies in shared chats, "
    "summaries that put their words in other words, jobs they made (gateway jobs), copies outside this "
    "database (the platforms' own chat history, logs, backups); on PostgreSQL the old row versions until "
    "VACUUM reclaims them."
)


def add_parser(subparsers: Any, *, parents: Sequence[argparse.ArgumentParser], handler: Callable[..., Any]) -> None:
    memory = subparsers.add_parser("memory", parents=list(parents), help="memory and what is stored about people")
    memory.set_defaults(handler=handler)
    actions = memory.add_subparsers(dest="memory_command", metavar="ACTION", required=True)
    erase = actions.add_parser(
        "erase-person", parents=list(parents),
        help="erase everything stored about a person (their memory, messages, direct messages, access)",
    )
    erase.add_argument("person", help="channel:user id, e.g. telegram:123456789 or slack:U012ABCDEF")
    erase.add_argument("--yes", action="store_true", help="really erase (it cannot be undone)")


def parse_person(value: str) -> tuple[str, str] | None:
    channel, _, user = value.strip().partition(":")
    return (channel, user) if channel and user and ":" not in user else None


async def run(args: argparse.Namespace, store: Store, config: Config, out: TextIO = sys.stdout) -> int:
    person = parse_person(args.person)
    if person is None:
        print(f"not a person: {args.person!r}; write channel:user id, e.g. telegram:123456789", file=out)
        return 2
    if not args.yes:
        print(f"this erases everything stored about {args.person} and cannot be undone: add --yes", file=out)
        return 2
    erased = await ErasureRepo(store.db).erase_person(*person, store.memory)
    files = delete_files(Path(config.agent.workspace), erased)
    if files:
        erased.counts["files"] += files
    await store.db.write(lambda conn: AuditRepo.record_in(conn, AuditEntry(
        kind="access", action="erase_person", actor="cli", outcome="ok", detail={"removed": dict(erased.counts)},
    )))
    print("\n".join(report(args.person, erased)), file=out)
    return 0


def delete_files(workspace: Path, erased: Erased) -> int:
    """Their direct messages' session directories and the files they sent elsewhere; how many."""
    removed = 0
    for session_id in erased.dm_sessions:
        folder = session_dir(workspace, session_id)
        if folder.is_dir():
            removed += sum(1 for p in folder.rglob("*") if p.is_file())
            shutil.rmtree(folder)
    for session_id, relative in erased.attachments:
        folder = session_dir(workspace, session_id).resolve()
        path = (folder / relative).resolve()
        if path.is_relative_to(folder) and path.is_file():  # a stored path never leads out of its session
            path.unlink()
            removed += 1
    return removed


def report(person: str, erased: Erased) -> list[str]:
    lines = [f"Erased what was stored about {person}:"]
    lines += [f"  {kind}: {count}" for kind, count in sorted(erased.counts.items()) if count]
    if not any(erased.counts.values()):
        lines.append("  nothing was stored about them")
    lines += [f"Left: {kind}: {count}" for kind, count in sorted(erased.left.items()) if count]
    lines.append(NOT_ERASED)
    return lines
