"""A recording stand-in for the core's intake (`submit`) and `ChannelState`, for channel tests."""

from __future__ import annotations

from typing import Any

from fakes.channel import MemoryChannelState
from gateway.events import SubmitResult


class RecordingCore(MemoryChannelState):
    """Stands in for the core's intake and ChannelState: records what a channel submits.

    `fail_submits` makes the next N submits raise (the store is down); `answers` maps a
    button token to the (answer, alert) a button press gets back.
    """

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[list[Any], tuple[str, str] | None]] = []
        self.answers: dict[str, tuple[str, bool]] = {}
        self.fail_submits = 0
        self.on_submit: Any = None  # optional callable run inside submit (to observe ordering)
        self._seen: set[str] = set()

    @property
    def events(self) -> list[Any]:
        return [e for batch, _ in self.batches for e in batch]

    async def submit(self, events: Any, *, cursor: tuple[str, str] | None = None) -> list[Any]:
        if self.on_submit is not None:
            self.on_submit(events, cursor)
        if self.fail_submits:
            self.fail_submits -= 1
            raise RuntimeError("the store is down")
        self.batches.append((list(events), cursor))
        if cursor is not None:
            self.cursors[cursor[0]] = cursor[1]
        results = []
        for event in events:
            answer, alert = self.answers.get(getattr(event, "token", ""), ("", False))
            results.append(SubmitResult(event.event_id, duplicate=event.event_id in self._seen,
                                        answer=answer, alert=alert))
            self._seen.add(event.event_id)
        return results

