"""Who may use the console: the admin token, compared in constant time; a random session id
behind an HttpOnly, SameSite=Strict cookie, stored in the database as its hash (so a session
works on every instance and after a restart, and the table alone logs nobody in); a CSRF token
per session on every form; failed logins and wrong bearer tokens rate limited per client address."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from gateway.events import utcnow
from gateway.serving.guesses import LOGIN_FAILURES, LOGIN_WINDOW_S, LoginLimiter, bearer, client_bytes, token_matches
from gateway.store import ConsoleRepo

COOKIE = "gateway_admin"
SESSION_TTL_S = 8 * 3600


@dataclass(frozen=True)
class ConsoleSession:
    user: str
    csrf: str
    expires: datetime


def session_hash(session_id: str) -> str:
    """What the database keeps of a session id (the id is 256 random bits: a plain hash is enough)."""
    return hashlib.sha256(client_bytes(session_id)).hexdigest()  # a cookie is the client's text


def _csrf_of(session_id: str) -> str:
    """The session's CSRF token, derived from its id: not stored, and not derivable from the hash."""
    return hmac.new(client_bytes(session_id), b"gateway console csrf", hashlib.sha256).hexdigest()


class Sessions:
    """Console sessions in the database, shared by every instance; logout deletes the row."""

    def __init__(self, repo: ConsoleRepo, *, ttl_s: float = SESSION_TTL_S, clock: Callable[[], datetime] = utcnow):
        self.repo = repo
        self.ttl_s = ttl_s
        self.clock = clock

    async def open(self, user: str) -> tuple[str, ConsoleSession]:
        session_id = secrets.token_urlsafe(32)
        now = self.clock()
        expires = now + timedelta(seconds=self.ttl_s)
        await self.repo.open_login(session_hash(session_id), user, now=now, expires_at=expires)
        return session_id, ConsoleSession(user, _csrf_of(session_id), expires)

    async def get(self, session_id: str | None) -> ConsoleSession | None:
        if not session_id:
            return None
        login = await self.repo.login(session_hash(session_id), now=self.clock())
        return ConsoleSession(login.username, _csrf_of(session_id), login.expires_at) if login else None

    async def close(self, session_id: str | None) -> None:
        if session_id:
            await self.repo.close_login(session_hash(session_id))


def csrf_matches(session: ConsoleSession, given: str) -> bool:
    return bool(given) and hmac.compare_digest(client_bytes(given), session.csrf.encode())


__all__ = [
    "COOKIE", "LOGIN_FAILURES", "LOGIN_WINDOW_S", "SESSION_TTL_S", "ConsoleSession", "LoginLimiter", "Sessions",
    "bearer", "csrf_matches", "session_hash", "token_matches",
]
