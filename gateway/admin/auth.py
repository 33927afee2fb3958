"""Who may use the console: the admin token, compared in constant time; a random server-side
session behind an HttpOnly, SameSite=Strict cookie; a CSRF token per session on every form;
failed logins rate limited per client address."""

from __future__ import annotations

import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

COOKIE = "gateway_admin"
SESSION_TTL_S = 8 * 3600
LOGIN_FAILURES = 5  # per client address and window, then refused until the window passes
LOGIN_WINDOW_S = 300.0


def token_matches(given: str, expected: str) -> bool:
    """Constant time: how much of a guess was right is not measurable."""
    return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())


def bearer(header: str) -> str:
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


@dataclass
class ConsoleSession:
    user: str
    csrf: str
    expires: float


@dataclass
class Sessions:
    """In memory, on the instance that logged in: a restart logs everyone out (by design)."""

    ttl_s: float = SESSION_TTL_S
    clock: Callable[[], float] = time.monotonic
    _by_id: dict[str, ConsoleSession] = field(default_factory=dict)

    def _now(self) -> float:
        return self.clock()

    def open(self, user: str) -> tuple[str, ConsoleSession]:
        self._forget_expired()
        session_id = secrets.token_urlsafe(32)
        session = ConsoleSession(user, secrets.token_urlsafe(32), self._now() + self.ttl_s)
        self._by_id[session_id] = session
        return session_id, session

    def get(self, session_id: str | None) -> ConsoleSession | None:
        session = self._by_id.get(session_id or "")
        if session is None or session.expires <= self._now():
            self._by_id.pop(session_id or "", None)
            return None
        return session

    def close(self, session_id: str | None) -> None:
        self._by_id.pop(session_id or "", None)

    def _forget_expired(self) -> None:
        now = self._now()
        for key in [k for k, s in self._by_id.items() if s.expires <= now]:
            del self._by_id[key]


@dataclass
class LoginLimiter:
    failures: int = LOGIN_FAILURES
    window_s: float = LOGIN_WINDOW_S
    clock: Callable[[], float] = time.monotonic
    _seen: dict[str, deque[float]] = field(default_factory=dict)

    def _recent(self, client: str) -> deque[float]:
        now = self.clock()
        times = self._seen.setdefault(client, deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return times

    def blocked(self, client: str) -> float:
        """Seconds until this client may try again (0: it may)."""
        times = self._recent(client)
        if len(times) < self.failures:
            return 0.0
        return max(0.0, times[0] + self.window_s - self.clock())

    def failed(self, client: str) -> None:
        self._recent(client).append(self.clock())

    def succeeded(self, client: str) -> None:
        self._seen.pop(client, None)


def csrf_matches(session: ConsoleSession, given: str) -> bool:
    return bool(given) and hmac.compare_digest(given.encode(), session.csrf.encode())
