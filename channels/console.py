"""The terminal channel behind `gateway chat`: one thread, text in, streamed text out.

Prompts are shown with numbered buttons and say what to type: typing a number chooses its
button, and a number that is no button of an open prompt is answered here ("Choose 1-4."),
never sent to the agent (unless the open question also takes typed answers: then it is one).
Numbers stay with their prompt until it is closed, so prompts shown again after a restart
(gateway/cli/chat.py) keep theirs. Ctrl-C sends /stop (cancels the running turn); /quit leaves.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
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
NUMBER = re.compile(r"\s*\d{1,6}\s*")  # what is taken as a try at a button, not a message


@dataclass(frozen=True)
class _OpenPrompt:
    numbers: tuple[str, ...]
    decides: bool  # an approval or a question (not a notice's action buttons)
    takes_text: bool  # a question that also takes a typed answer (a number may be one)


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
    typed_buttons = True  # a button is chosen by typing its number: the core's notices say so

    def __init__(self, out: TextIO | None = None):
        self.out = out or sys.stdout
        self._ids = itertools.count(1)
        self._buttons: dict[str, str] = {}  # number typed -> token, of every open prompt
        self._open: dict[str, _OpenPrompt] = {}  # message id -> its prompt's numbers
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
        numbered = itertools.count(max(map(int, self._buttons), default=0) + 1)
        numbers = []
        for button in (b for row in prompt.buttons for b in row):
            if button.url:  # a link: opened, not chosen
                lines.append(f"  {button.label}: {button.url}")
                continue
            number = str(next(numbered))
            self._buttons[number] = button.token
            numbers.append(number)
            lines.append(f"  [{number}] {button.label}")
        if prompt.hint:
            lines.append(prompt.hint)
        if numbers:
            lines.append(f"Type {_span(numbers)} to choose.")
        self.write("\n".join(lines))
        message_id = self.next_id()
        takes_text = prompt.kind == "question" and bool(prompt.hint)
        self._open[message_id] = _OpenPrompt(tuple(numbers), prompt.kind != "notice", takes_text)
        return Delivered((message_id,))

    async def close_prompt(self, thread: ThreadKey, message_ids: Sequence[str], outcome: str) -> None:
        for message_id in message_ids:
            for number in self._open.pop(message_id, _OpenPrompt((), False, False)).numbers:
                self._buttons.pop(number, None)
        self.write(outcome)

    def open_stream(
        self, thread: ThreadKey, reply_to: str = "", adopt: Sequence[str] = (), links: Sequence[str] = ()
    ) -> _ConsoleStream:
        return _ConsoleStream(self)

    async def set_busy(self, thread: ThreadKey, busy: bool, reply_to: str = "") -> None:
        return None

    # ---- input ---------------------------------------------------------------------------
    def event_for(self, line: str) -> InboundMessage | ButtonPress | None:
        """A typed line: a button's number while its prompt is open, else a message; None for a
        number that is no button while a prompt waits for one (it is answered, not sent)."""
        event_id = f"console:{uuid.uuid4().hex}"
        token = self._buttons.get(line.strip())
        if token is not None:
            return ButtonPress(THREAD, USER, token, event_id)
        if NUMBER.fullmatch(line) and self._waiting_for_a_number():
            return None
        return InboundMessage(THREAD, USER, line, event_id)

    def _waiting_for_a_number(self) -> bool:
        deciding = [p for p in self._open.values() if p.decides and p.numbers]
        return bool(deciding) and not any(p.takes_text for p in deciding)

    async def handle_line(self, line: str) -> None:
        assert self._submit is not None, "start() first"
        event = self.event_for(line)
        if event is None:
            self.write(f"Choose {_span(sorted(self._buttons, key=int))}.")
            return
        results = await self._submit([event])
        if isinstance(event, ButtonPress) and results and results[0].answer and results[0].alert:
            self.write(results[0].answer)


def _span(numbers: Sequence[str]) -> str:
    """`1-4` for a run of numbers, else `1, 2 or 5`."""
    values = [int(n) for n in numbers]
    if len(values) > 1 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}"
    return ", ".join(numbers[:-1]) + (" or " if len(numbers) > 1 else "") + numbers[-1]


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
