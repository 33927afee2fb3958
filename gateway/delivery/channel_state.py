"""What channels may keep (cursors, counters, known threads) and read (a chat's choices), backed by the store.

Channels never import the store; they are handed this as their `ChannelState`.
"""

from __future__ import annotations

from gateway.events import ThreadKey
from gateway.store import Store


class StoreChannelState:
    def __init__(self, store: Store):
        self.store = store

    async def load_cursor(self, name: str) -> str | None:
        return await self.store.inbox.load_cursor(name)

    async def bump_counter(self, name: str) -> int:
        return await self.store.inbox.bump_counter(name)

    async def knows_thread(self, thread: ThreadKey) -> bool:
        """A session exists, or the thread's first message is still waiting in the inbox
        (a quick follow-up must not be dropped because the first turn has not started)."""
        key = str(thread)
        return await self.store.sessions.thread_exists(key) or await self.store.inbox.count_pending(key) > 0

    async def chat_choice(self, chat: str, name: str) -> bool | None:
        if name != "rich":
            raise ValueError(f"no chat choice named {name!r}")
        return await self.store.preferences.rich(chat)
