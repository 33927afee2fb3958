"""Which directory a turn's tools work in: its session's (gateway/files/workspace.py). A sub-agent
works for its parent, so it uses the directory of the root of its chain of parents: what it
writes, the parent reads."""

from __future__ import annotations

from pathlib import Path

from gateway.files.workspace import session_dir
from gateway.store import SessionRecord, Store

MAX_CHAIN = 32  # far beyond agent.max_depth: a loop in broken rows cannot hang a turn


async def files_session_id(store: Store, session: SessionRecord) -> int:
    current = session
    for _ in range(MAX_CHAIN):
        if current.kind != "child":
            break
        task = await store.delegations.by_child_session(current.id)
        parent = await store.sessions.get(task.parent_session_id) if task is not None else None
        if parent is None:
            break
        current = parent
    return current.id


async def files_dir(store: Store, workspace: str, session: SessionRecord) -> Path:
    return session_dir(workspace, await files_session_id(store, session))
