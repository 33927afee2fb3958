"""The terminal channel behind `gateway chat`: one thread, text in, streamed text out.

Prompts are shown with numbered buttons; typing the number taps the button. Ctrl-C sends
/stop (cancels the running turn); /quit leaves.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TextIO

from gateway.events import (
    ButtonPress,
    Delivered,
    InboundMessage,
    Outbound,
    Prompt,
    Sender,
    Submit,
    ThreadKey,
)

THREAD = ThreadKey("console", "local", "")
USER = Sender("console", "you")


class _ConsoleStream:
    """Prints the reply as it grows (only the new part of each update)."""

    def __init__(self, console: ConsoleChannel):
        self.console = console
        self.shown = ""

    async def update(self, text: str) -> None:
        if text.startswith(self.shown):
            self.console.write(text[len(self.shown):], end="")
        else:  # the text was rewritten (e.g. trimmed): show it anew
            self.console.write("\n" + text, end="")
        self.shown = text

    async def finish(self, text: str) -> Delivered:
        await self.update(text)
        self.console.write("\n")
        return Delivered((self.console.next_id(),))

    async def abort(self) -> None:
        if self.shown:
            self.console.write("\n")

    def message_ids(self) -> tuple[str, ...]:
        return ()


class ConsoleChannel:
    name = "console"
    show_tool_progress = True

    def __init__(self, out: TextIO | None = None):
        self.out = out or sys.stdout
        self._ids = itertools.count(1)
        self._buttons: dict[str, str] = {}  # number typed -> token
        self._submit: Submit | None = None

    def next_id(self) -> str:
        return str(next(self._ids))

    def write(self, text: str, end: str = "\n") -> None:
        self.out.write(text + end)
        self.out.flush()

    async def start(self, submit: Submit) -> None:
        self._submit = submit

    async def stop(self) -> None:
        return None

    async def send(self, message: Outbound) -> Delivered:
        self.write(message.text)
        return Delivered((self.next_id(),))

    async def send_prompt(self, prompt: Prompt) -> Delivered:
        lines = [f"❓ {prompt.text}"]
        if prompt.arguments:
            lines.append(prompt.arguments)
        self._buttons.clear()
        numbered = itertools.count(1)
        for row in prompt.buttons:
            for button in row:
                number = str(next(numbered))
                self._buttons[number] = button.token
                lines.append(f"  [{number}] {button.label}")
        if prompt.hint:
            lines.append(prompt.hint)
        self.write("\n".join(lines))
        return Delivered((self.next_id(),))

    async def close_prompt(self, thread: ThreadKey, message_ids: Sequence[str], outcome: str) -> None:
        self._buttons.clear()
        self.write(outcome)

    def open_stream(
        self, thread: ThreadKey, reply_to: str = "", adopt: Sequence[str] = (), links: Sequence[str] = ()
    ) -> _ConsoleStream:
        return _ConsoleStream(self)

    async def set_busy(self, thread: ThreadKey, busy: bool, reply_to: str = "") -> None:
        return None

    # ---- input ---------------------------------------------------------------------------
    def event_for(self, line: str) -> InboundMessage | ButtonPress:
        """A typed line: a button number while a prompt shows, else a message."""
        event_id = f"console:{uuid.uuid4().hex}"
        token = self._buttons.get(line.strip())
        if token is not None:
            return ButtonPress(THREAD, USER, token, event_id)
        return InboundMessage(THREAD, USER, line, event_id)

    async def handle_line(self, line: str) -> None:
        assert self._submit is not None, "start() first"
        event = self.event_for(line)
        results = await self._submit([event])
        if isinstance(event, ButtonPress) and results and results[0].answer and results[0].alert:
            self.write(results[0].answer)


async def read_lines(stream: TextIO, on_line: Callable[[str], Awaitable[bool]]) -> None:
    """Feed lines from a (blocking) text stream; stops when `on_line` returns False or at EOF."""
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, stream.readline)
        if not line:
            return
        if not await on_line(line.rstrip("\n")):
            return


__all__ = ["ConsoleChannel", "THREAD", "read_lines"]
