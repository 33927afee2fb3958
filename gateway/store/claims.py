"""The owner's claim of a chat channel with no admin (gateway/access/claim.py): its one-time
code, the wrong codes each person sent, and the admins claimed with it.

A claimed admin is an `access_grants` row of kind "admin" (listed and revoked with the other
approvals). Using a code is one transaction: the person's lock-out is read under a row lock,
the code is compared and deleted (single use: two senders cannot both take it, on any
instance), the grant written, and the person's own pairing request, if one waits, approved with
its held messages queued again.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from gateway.store.access import CODE_ALPHABET, _held_of, open_key
from gateway.store.audit import AuditEntry, AuditRepo
from gateway.store.base import Repo
from gateway.store.inbox import InsertIgnoring
from gateway.store.tables import access_grants, access_requests, claim_attempts, claim_codes, inbox

ADMIN_KIND = "admin"  # access_grants.kind of a claimed admin
CLAIMED_BY = "claim"  # access_grants.granted_by, access_requests.decided_by of a claim


@dataclass(frozen=True)
class ClaimCode:
    channel: str
    code: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class ClaimResult:
    kind: Literal["claimed", "wrong", "expired", "locked", "taken"]
    tries_left: int = 0  # wrong: wrong codes the person may still send before the lock-out
    locked_until: datetime | None = None  # locked (or wrong, when this one locked them out)
    woken: tuple[str, ...] = ()  # claimed: the threads whose held messages went back to the queue


def new_claim_code() -> str:
    """Ten characters (50 bits) a person copies or types: no 0/O, 1/I."""
    raw = "".join(secrets.choice(CODE_ALPHABET) for _ in range(10))
    return f"{raw[:5]}-{raw[5:]}"


def normalise_claim_code(text: str) -> str:
    raw = "".join(ch for ch in text.upper() if ch.isalnum())
    return f"{raw[:5]}-{raw[5:]}" if len(raw) == 10 else text.strip().upper()


_ATTEMPTS_ROW = InsertIgnoring(claim_attempts, ["channel", "person"])


def _has_admin(conn: Connection, channel: str) -> bool:
    query = select(access_grants.c.id).where(access_grants.c.kind == ADMIN_KIND, access_grants.c.channel == channel)
    return conn.execute(query.limit(1)).first() is not None


class ClaimRepo(Repo):
    async def open_code(self, channel: str, *, now: datetime, ttl_s: float) -> ClaimCode | None:
        """The channel's code, a new one when it has none or it expired; None once someone
        claimed the channel (the configuration's admins are the caller's to check)."""

        def work(conn: Connection) -> ClaimCode | None:
            if _has_admin(conn, channel):
                conn.execute(delete(claim_codes).where(claim_codes.c.channel == channel))
                return None
            row = conn.execute(select(claim_codes).where(claim_codes.c.channel == channel).with_for_update()).first()
            if row is not None and row.expires_at > now:
                return ClaimCode(row.channel, row.code, row.created_at, row.expires_at)
            conn.execute(delete(claim_codes).where(claim_codes.c.channel == channel))
            made = ClaimCode(channel, new_claim_code(), now, now + timedelta(seconds=ttl_s))
            conn.execute(insert(claim_codes).values(**made.__dict__))
            return made

        try:
            return await self.db.write(work)
        except IntegrityError:  # another process made one a moment ago: that one it is
            return await self.db.write(work)

    async def attempt(
        self,
        channel: str,
        person: str,
        code: str,
        *,
        name: str,
        now: datetime,
        max_wrong: int,
        lockout_s: float,
    ) -> ClaimResult:
        """`person` sent `code`: they become the channel's admin, or it is refused (and counted)."""
        lockout = timedelta(seconds=lockout_s)

        def work(conn: Connection) -> ClaimResult:
            conn.execute(_ATTEMPTS_ROW.for_conn(conn), {"channel": channel, "person": person, "wrong": 0, "since": now})
            tries = conn.execute(
                select(claim_attempts)
                .where(claim_attempts.c.channel == channel, claim_attempts.c.person == person)
                .with_for_update()
            ).one()
            if tries.locked_until is not None and tries.locked_until > now:
                return ClaimResult("locked", locked_until=tries.locked_until)
            if _has_admin(conn, channel):
                return ClaimResult("taken")
            row = conn.execute(select(claim_codes).where(claim_codes.c.channel == channel).with_for_update()).first()
            sent = normalise_claim_code(code)
            if row is not None and hmac.compare_digest(row.code.encode(), sent.encode()):
                if row.expires_at <= now:
                    return ClaimResult("expired")
                return self._claim_in(conn, channel, person, name, now)
            return self._wrong_in(conn, tries, now, max_wrong, lockout)

        return await self.db.write(work)

    @staticmethod
    def _claim_in(conn: Connection, channel: str, person: str, name: str, now: datetime) -> ClaimResult:
        conn.execute(delete(claim_codes).where(claim_codes.c.channel == channel))
        conn.execute(delete(claim_attempts).where(claim_attempts.c.channel == channel))
        grant_id = conn.execute(
            insert(access_grants)
            .values(kind=ADMIN_KIND, channel=channel, subject=person, name=name, granted_by=CLAIMED_BY, created_at=now)
            .returning(access_grants.c.id)
        ).scalar_one()
        actor = f"{channel}:{person}"
        entries = [AuditEntry(kind="access", action="admin_claimed", actor=actor, decided_by=CLAIMED_BY, via="claim",
                              detail={"kind": ADMIN_KIND, "name": name, "id": grant_id})]
        woken = []
        waiting = conn.execute(  # their own pairing request: settled, their held messages answered
            update(access_requests)
            .where(access_requests.c.open_key == open_key(channel, "user", person))
            .values(status="approved", open_key=None, decided_by=CLAIMED_BY, decided_at=now)
            .returning(*access_requests.c)
        ).all()
        for request in waiting:
            conn.execute(update(inbox).where(_held_of(request)).values(status="pending"))
            detail = {"kind": request.kind, "name": request.name, "id": request.id}
            entries.append(AuditEntry(kind="access", action="pairing_approved", actor=actor, decided_by=CLAIMED_BY,
                                      via="claim", detail=detail))
            woken.append(request.thread_key)
        AuditRepo.record_in(conn, *entries)
        return ClaimResult("claimed", woken=tuple(woken))

    @staticmethod
    def _wrong_in(conn: Connection, tries: Any, now: datetime, max_wrong: int, lockout: timedelta) -> ClaimResult:
        fresh = tries.locked_until is not None or tries.since + lockout <= now  # a new run of wrong codes
        wrong, since = (1, now) if fresh or tries.wrong == 0 else (tries.wrong + 1, tries.since)
        locked_until = now + lockout if wrong >= max_wrong else None
        conn.execute(
            update(claim_attempts)
            .where(claim_attempts.c.channel == tries.channel, claim_attempts.c.person == tries.person)
            .values(wrong=0 if locked_until else wrong, since=since, locked_until=locked_until)
        )
        AuditRepo.record_in(conn, AuditEntry(
            kind="access", action="claim_refused", actor=f"{tries.channel}:{tries.person}", via="claim",
            outcome="locked" if locked_until else "wrong", detail={"wrong": wrong},
        ))
        return ClaimResult("wrong", tries_left=max(max_wrong - wrong, 0), locked_until=locked_until)

    async def void(self, channel: str, code: str) -> bool:
        """Delete the channel's code if it is `code` (it was shown where others may read it)."""

        def work(conn: Connection) -> bool:
            row = conn.execute(select(claim_codes).where(claim_codes.c.channel == channel).with_for_update()).first()
            if row is None or not hmac.compare_digest(row.code.encode(), normalise_claim_code(code).encode()):
                return False
            conn.execute(delete(claim_codes).where(claim_codes.c.channel == channel))
            return True

        return await self.db.write(work)

    async def admins(self) -> dict[str, list[str]]:
        """The claimed admins, by channel."""
        query = select(access_grants.c.channel, access_grants.c.subject).where(access_grants.c.kind == ADMIN_KIND)

        def work(conn: Connection) -> dict[str, list[str]]:
            found: dict[str, list[str]] = {}
            for channel, subject in conn.execute(query).all():
                found.setdefault(channel, []).append(subject)
            return found

        return await self.db.read(work)


__all__ = ["ADMIN_KIND", "CLAIMED_BY", "ClaimCode", "ClaimRepo", "ClaimResult", "normalise_claim_code"]
