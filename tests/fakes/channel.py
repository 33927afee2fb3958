"""An in-process channel that records everything the core asks it to show."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.events import Delivered, Outbound, Prompt, Submit, ThreadKey


@dataclass
class Shown:
    kind: str  # message | prompt | close | stream_final
    thread: ThreadKey
    text: str
    message_id: str
    prompt: Prompt | None = None


class _Stream:
    def __init__(self, channel: FakeChannel, thread: ThreadKey):
        self.channel = channel
        self.thread = thread
        self.updates: list[str] = []

    async def update(self, text: str) -> None:
        self.updates.append(text)
        self.channel.stream_updates.append((self.thread, text))

    async def finish(self, text: str) -> Delivered:
        return Delivered((self.channel.show("message", self.thread, text),))

    async def abort(self) -> None:
        return None

    def message_ids(self) -> tuple[str, ...]:
        return ()


@dataclass
class FakeChannel:
    name: str = "fake"
    shown: list[Shown] = field(default_factory=list)
    stream_updates: list[tuple[ThreadKey, str]] = field(default_factory=list)
    busy: list[tuple[ThreadKey, bool]] = field(default_factory=list)
    adopted: list[tuple[str, ...]] = field(default_factory=list)
    submit: Submit | None = None
    changed: asyncio.Condition | None = None

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)

    def show(self, kind: str, thread: ThreadKey, text: str, prompt: Prompt | None = None) -> str:
        message_id = str(next(self._ids))
        self.shown.append(Shown(kind, thread, text, message_id, prompt))
        return message_id

    async def start(self, submit: Submit) -> None:
        self.submit = submit

    async def stop(self) -> None:
        return None

    async def send(self, message: Outbound) -> Delivered:
        return Delivered((self.show("message", message.thread, message.text),))

    async def send_prompt(self, prompt: Prompt) -> Delivered:
        return Delivered((self.show("prompt", prompt.thread, prompt.text, prompt),))

    async def close_prompt(self, thread: ThreadKey, message_ids: Sequence[str], outcome: str) -> None:
        self.show("close", thread, outcome)

    def open_stream(
        self, thread: ThreadKey, reply_to: str = "", adopt: Sequence[str] = (), links: Sequence[str] = ()
    ) -> _Stream:
        self.adopted.append(tuple(adopt))
        return _Stream(self, thread)

    async def set_busy(self, thread: ThreadKey, busy: bool, reply_to: str = "") -> None:
        self.busy.append((thread, busy))

    # ---- test helpers --------------------------------------------------------------------
    def messages(self, thread: ThreadKey | None = None) -> list[str]:
        return [s.text for s in self.shown if s.kind == "message" and (thread is None or s.thread == thread)]

    def prompts(self, thread: ThreadKey | None = None) -> list[Prompt]:
        return [
            s.prompt for s in self.shown if s.kind == "prompt" and s.prompt and (thread is None or s.thread == thread)
        ]

    def closes(self) -> list[str]:
        return [s.text for s in self.shown if s.kind == "close"]


class MemoryChannelState:
    """ChannelState in memory: cursors, counters, and the threads that have a session."""

    def __init__(self) -> None:
        self.cursors: dict[str, str] = {}
        self.counters: dict[str, int] = {}
        self.threads: set[ThreadKey] = set()
        self.choices: dict[tuple[str, str], bool] = {}  # (chat, name) -> what the chat chose

    async def load_cursor(self, name: str) -> str | None:
        return self.cursors.get(name)

    async def bump_counter(self, name: str) -> int:
        self.counters[name] = self.counters.get(name, 0) + 1
        return self.counters[name]

    async def knows_thread(self, thread: ThreadKey) -> bool:
        return thread in self.threads

    async def chat_choice(self, chat: str, name: str) -> bool | None:
        return self.choices.get((chat, name))
