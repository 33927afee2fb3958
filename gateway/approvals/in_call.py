"""Questions asked while a tool call waits inside it (an MCP server on an older protocol asks in
the middle of a call): the call keeps its worker and the thread, and reads the prompt's row
until someone decides it (`PromptService.ask_in_call`). Such a prompt queues no resume item
(no parked turn is there to continue) and stays pending only while the call lives: the
waiting call keeps pushing its expiry forward, so when the process dies it expires within a
lease's time, and a tap after a restart is told the question expired, never taken as an
answer to a dead call. The turn that continues after the restart gives the call the error
saved with the prompt (`restart_error`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gateway.store import PromptRecord

IN_CALL = "in_call"  # the payload key that marks such a prompt
EXPIRED_QUESTION = "This question has expired: the call that asked it has ended."
OPEN = "o"  # the action of a link button (it opens the page; no press reaches us)


def is_in_call(prompt: PromptRecord) -> bool:
    return IN_CALL in prompt.payload


def restart_error(prompt: PromptRecord) -> str | None:
    """The result for the call that asked, when a restart ended its wait."""
    marker = prompt.payload.get(IN_CALL)
    return str(marker.get("restart_error") or "") or None if isinstance(marker, dict) else None


def alive_until(now: datetime, seconds: float, deadline: datetime) -> datetime:
    return min(now + timedelta(seconds=seconds), deadline)
