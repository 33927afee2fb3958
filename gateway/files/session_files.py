"""A closed session's files on disk pruned with it: what people sent (attachments) and what
MCP servers returned (images, blobs) stay `retention.files_days` after the session was closed
(by /new, or at the end of a scheduled run), then go; the history stays and says where they
were. The workspace is each instance's own disk, so every instance prunes its own, at most
every `retention.every_s`; a session still in use is never pruned."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from gateway.config import Config
from gateway.events import utcnow
from gateway.files.workspace import sessions_root
from gateway.store import Store

log = logging.getLogger(__name__)
MCP_DIR = "mcp"  # gateway/mcp/results.py saves under it
VOICE_DIR = "voice"  # gateway/voice/replies.py saves the voice notes under it


class SessionFiles:
    def __init__(self, store: Store, config: Config, *, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.root = sessions_root(config.agent.workspace)
        self.kinds = (config.attachments.dir, MCP_DIR, VOICE_DIR)
        self.days = config.retention.files_days
        self.every_s = config.retention.every_s
        self._clock = clock
        self._next = 0.0

    async def prune_due(self) -> int:
        """Prune when a round is due; returns the sessions whose files went."""
        if self.days <= 0 or self._clock() < self._next:
            return 0
        self._next = self._clock() + self.every_s
        try:
            return await self.prune()
        except Exception:  # noqa: BLE001 - the next round tries again
            log.warning("pruning session files failed", exc_info=True)
            return 0

    async def prune(self) -> int:
        holding = await asyncio.to_thread(self._holding)
        closed = await self.store.sessions.closed_before(list(holding), utcnow() - timedelta(days=self.days))
        for session_id in closed:
            for folder in holding[session_id]:
                # rmtree removes links, never what they point to (it works from directory fds here)
                await asyncio.to_thread(shutil.rmtree, folder, ignore_errors=True)
        if closed:
            log.info("retention: pruned the files of %d closed sessions", len(closed))
        return len(closed)

    def _holding(self) -> dict[int, list[Path]]:
        """Session id -> its folders of attachments and MCP results, for the sessions that have any."""
        found: dict[int, list[Path]] = {}
        if not self.root.is_dir():
            return found
        for entry in self.root.iterdir():
            if not entry.name.isdigit() or entry.is_symlink():
                continue
            folders = [entry / kind for kind in self.kinds if (entry / kind).is_dir()]
            if folders:
                found[int(entry.name)] = folders
        return found
