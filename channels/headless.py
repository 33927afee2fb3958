"""The channel of scheduled (cron, tick) sessions: nobody is watching, so nothing is shown.

Their results are delivered by the scheduler to the configured chat when the turn ends; this
channel only accepts what the turn loop would show live, and gives it stable ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.events import Delivered, Outbound, Prompt, ReplyStream, Submit, ThreadKey


class _SilentStream:
    def __init__(self, thread: ThreadKey):
        self.thread = thread

    async def update(self, text: str) -> None:
        return None

    async def finish(self, text: str) -> Delivered:
        return Delivered((f"headless:{self.thread}",))

    async def abort(self) -> None:
        return None

    def message_ids(self) -> tuple[str, ...]:
        return ()


class HeadlessChannel:
    def __init__(self, name: str):
        self.name = name

    async def start(self, submit: Submit) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, message: Outbound) -> Delivered:
        return Delivered((f"headless:{message.key}",))

    async def send_prompt(self, prompt: Prompt) -> Delivered:
        return Delivered((f"headless:{prompt.key}",))

    async def close_prompt(self, thread: ThreadKey, message_ids: Sequence[str], outcome: str) -> None:
        return None

    def open_stream(
        self, thread: ThreadKey, reply_to: str = "", adopt: Sequence[str] = (), links: Sequence[str] = ()
    ) -> ReplyStream:
        return _SilentStream(thread)

    async def set_busy(self, thread: ThreadKey, busy: bool, reply_to: str = "") -> None:
        return None
