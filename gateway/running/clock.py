"""The time expiry and timeouts are measured against: the system's, or one a test advances.

Code that decides whether something expired (prompts, their timeouts) takes a `Clock` instead
of reading the time itself, so a test moves time forward instead of sleeping past a timer.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Protocol

from gateway.events import utcnow


class Clock(Protocol):
    def now(self) -> datetime:
        """The wall-clock time, timezone-aware UTC (what is stored in the database)."""
        ...

    def monotonic(self) -> float:
        """Seconds for measuring intervals (never goes back)."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return utcnow()

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK = SystemClock()
