"""Pairing requests and the people and chats an admin approved.

A request is created, found again (one pending per person or chat, through the unique
`open_key`) or refused when its channel has too many waiting, in one transaction. Deciding it
is a compare-and-set (pending -> approved | denied) written together with the grant and the
held messages going back to the queue (or being dropped on a denial), so a second tap, a CLI
approval racing a button, or a crash in between can neither lose the message nor grant twice.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import and_, delete, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from gateway.events import ThreadKey, utcnow
from gateway.store.audit import AuditEntry, AuditRepo, Via, via_of
from gateway.store.base import Repo, to_record
from gateway.store.inbox import InboxRepo, InsertIgnoring, NewItem
from gateway.store.tables import access_grants, access_requests, counters, inbox

Kind = Literal["user", "chat"]
CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: read aloud and typed by hand
TOKEN_PREFIX = "pair:"  # button tokens of pairing prompts ("<token>.<action>")


@dataclass(frozen=True)
class AccessRequestRecord:
    id: int
    code: str
    token: str
    kind: str
    channel: str
    subject: str
    name: str
    thread_key: str
    status: str
    open_key: str | None
    prompts: list
    decided_by: str | None
    created_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    asked_by: str | None = None  # the person behind it (a chat's: who addressed the bot)


@dataclass(frozen=True)
class AccessGrantRecord:
    id: int
    kind: str
    channel: str
    subject: str
    name: str
    granted_by: str
    request_id: int | None
    created_at: datetime


@dataclass(frozen=True)
class RequestOutcome:
    kind: Literal["created", "pending", "full"]
    request: AccessRequestRecord | None


@dataclass(frozen=True)
class DecideOutcome:
    kind: Literal["decided", "duplicate", "unknown", "not_pending", "expired"]
    request: AccessRequestRecord | None


def new_code() -> str:
    raw = "".join(secrets.choice(CODE_ALPHABET) for _ in range(8))
    return f"{raw[:4]}-{raw[4:]}"


def normalise_code(code: str) -> str:
    raw = "".join(ch for ch in code.upper() if ch.isalnum())
    return f"{raw[:4]}-{raw[4:]}" if len(raw) == 8 else code.strip().upper()


def open_key(channel: str, kind: str, subject: str) -> str:
    return f"{channel}:{kind}:{subject}"


def _held_of(request: Any) -> Any:
    """The inbox items a request holds: the person's DM thread, or every thread of the chat."""
    if request.kind == "chat":
        prefix = ThreadKey.format(request.channel, request.subject)  # every thread of the chat
        return and_(inbox.c.status == "held", func.substr(inbox.c.thread_key, 1, len(prefix)) == prefix)
    return and_(inbox.c.status == "held", inbox.c.thread_key == request.thread_key)


_CHANNEL_LOCK = InsertIgnoring(counters, ["name"])


def _lock_channel(conn: Connection, channel: str, now: datetime) -> None:
    """A row lock per channel on PostgreSQL (SQLite writes are serial already), so concurrent
    requests on any instance cannot all see room under `max_pending` and pass it together."""
    name = f"access:requests:{channel}"
    conn.execute(_CHANNEL_LOCK.for_conn(conn), {"name": name, "value": 0, "updated_at": now})
    conn.execute(select(counters.c.value).where(counters.c.name == name).with_for_update()).first()


def _audit(action: str, row: Any, decided_by: str | None = None, via: Via | None = None) -> AuditEntry:
    """The trail's row of a pairing or access change (`row` a request or a grant)."""
    return AuditEntry(
        kind="access",
        action=action,
        actor=f"{row.channel}:{row.subject}",
        decided_by=decided_by,
        via=via if via is not None else (via_of(decided_by) if decided_by is not None else None),
        detail={"kind": row.kind, "name": row.name, "id": row.id},
    )


class AccessRepo(Repo):
    # ---- requests --------------------------------------------------------------------------
    async def request(
        self,
        *,
        kind: Kind,
        channel: str,
        subject: str,
        name: str,
        thread_key: str,
        ttl_s: float,
        max_pending: int,
        now: datetime | None = None,
        asked_by: str = "",
    ) -> RequestOutcome:
        """The person's (or chat's) pending request, a new one, or `full` when `max_pending`
        people have requests waiting on the channel already, or when `asked_by` (the person
        behind it) has one of this kind waiting for another subject (one person cannot fill
        the cap by adding the bot to many groups). `now` (here, in `decide` and `expire_due`):
        the time expiry is judged at (a `Clock`'s; the system's by default)."""
        key = open_key(channel, kind, subject)
        asked_at = now

        def work(conn: Connection) -> RequestOutcome:
            now = asked_at or utcnow()
            _lock_channel(conn, channel, now)  # count-then-insert below is one step per channel
            self._expire_in(conn, now)
            row = conn.execute(select(access_requests).where(access_requests.c.open_key == key)).first()
            if row is not None:
                return RequestOutcome("pending", to_record(AccessRequestRecord, row))
            person = asked_by or (subject if kind == "user" else "")
            if self._waiting_people(conn, channel, person, kind, max_pending):
                return RequestOutcome("full", None)
            request_id = conn.execute(
                insert(access_requests)
                .values(
                    code=new_code(),
                    token=TOKEN_PREFIX + secrets.token_urlsafe(16),
                    kind=kind,
                    channel=channel,
                    subject=subject,
                    name=name,
                    thread_key=thread_key,
                    status="pending",
                    open_key=key,
                    prompts=[],
                    created_at=now,
                    expires_at=now + timedelta(seconds=ttl_s),
                    asked_by=person or None,
                )
                .returning(access_requests.c.id)
            ).scalar_one()
            created = self._get_in(conn, request_id)
            AuditRepo.record_in(conn, _audit("pairing_requested", created))
            return RequestOutcome("created", created)

        try:
            return await self.db.write(work)
        except IntegrityError:  # another instance created it a moment ago (a group's other topic)
            return await self.db.write(work)

    @staticmethod
    def _waiting_people(conn: Connection, channel: str, person: str, kind: str, max_pending: int) -> bool:
        """Whether a new request is refused: the person has one of this kind waiting already,
        or `max_pending` other people have (requests of before, without a person, count one each)."""
        rows = conn.execute(
            select(access_requests.c.kind, access_requests.c.asked_by, access_requests.c.id).where(
                access_requests.c.channel == channel, access_requests.c.status == "pending"
            )
        ).all()
        if person and any(row.asked_by == person and row.kind == kind for row in rows):
            return True
        people = {row.asked_by or f"request:{row.id}" for row in rows}
        return person not in people and len(people) >= max_pending

    @staticmethod
    def _get_in(conn: Connection, request_id: int) -> AccessRequestRecord | None:
        row = conn.execute(select(access_requests).where(access_requests.c.id == request_id)).first()
        return to_record(AccessRequestRecord, row) if row is not None else None

    @staticmethod
    def _expire_in(conn: Connection, now: datetime) -> list[AccessRequestRecord]:
        rows = conn.execute(
            update(access_requests)
            .where(access_requests.c.status == "pending", access_requests.c.expires_at <= now)
            .values(status="expired", open_key=None, decided_at=now)
            .returning(*access_requests.c)
        ).all()
        for row in rows:  # the held messages of an expired request are not answered
            conn.execute(update(inbox).where(_held_of(row)).values(status="dropped", done_at=now))
        AuditRepo.record_in(conn, *(_audit("pairing_expired", row, via="expiry") for row in rows))
        return [to_record(AccessRequestRecord, r) for r in rows]

    async def expire_due(self, now: datetime | None = None) -> list[AccessRequestRecord]:
        return await self.db.write(lambda conn: self._expire_in(conn, now or utcnow()))

    async def get(self, request_id: int) -> AccessRequestRecord | None:
        return await self.db.read(lambda conn: self._get_in(conn, request_id))

    async def find(self, *, code: str | None = None, token: str | None = None) -> AccessRequestRecord | None:
        column, value = (
            (access_requests.c.code, normalise_code(code)) if code is not None else (access_requests.c.token, token)
        )

        def work(conn: Connection) -> AccessRequestRecord | None:
            row = conn.execute(select(access_requests).where(column == value)).first()
            return to_record(AccessRequestRecord, row) if row is not None else None

        return await self.db.read(work)

    async def pending(self, channel: str | None = None) -> list[AccessRequestRecord]:
        query = select(access_requests).where(
            access_requests.c.status == "pending", access_requests.c.expires_at > utcnow()
        )
        if channel is not None:
            query = query.where(access_requests.c.channel == channel)
        return await self.db.read(
            lambda conn: [
                to_record(AccessRequestRecord, r) for r in conn.execute(query.order_by(access_requests.c.id)).all()
            ]
        )

    async def set_prompts(self, request_id: int, prompts: list) -> None:
        await self.db.write(
            lambda conn: conn.execute(
                update(access_requests).where(access_requests.c.id == request_id).values(prompts=prompts)
            )
        )

    async def decide(
        self,
        request_id: int,
        *,
        approve: bool,
        decided_by: str,
        event: NewItem | None = None,
        now: datetime | None = None,
    ) -> DecideOutcome:
        """pending -> approved (the grant, the held messages queued again) or denied (the held
        messages dropped), with the button's inbox event, in one transaction."""

        decided_at = now

        def work(conn: Connection) -> DecideOutcome:
            now = decided_at or utcnow()
            if event is not None and not InboxRepo.add_in(conn, event):
                return DecideOutcome("duplicate", None)
            row = self._get_in(conn, request_id)
            if row is None:
                return DecideOutcome("unknown", None)
            if row.status == "pending" and row.expires_at <= now:
                self._expire_in(conn, now)
                return DecideOutcome("expired", self._get_in(conn, request_id))
            changed = conn.execute(
                update(access_requests)
                .where(access_requests.c.id == request_id, access_requests.c.status == "pending")
                .values(
                    status="approved" if approve else "denied", open_key=None, decided_by=decided_by, decided_at=now
                )
            )
            if changed.rowcount != 1:
                return DecideOutcome("not_pending", row)
            AuditRepo.record_in(conn, _audit("pairing_approved" if approve else "pairing_denied", row, decided_by))
            if approve:
                self._grant_in(conn, row.kind, row.channel, row.subject, row.name, decided_by, row.id)
                conn.execute(update(inbox).where(_held_of(row)).values(status="pending"))
            else:
                conn.execute(update(inbox).where(_held_of(row)).values(status="dropped", done_at=now))
            return DecideOutcome("decided", self._get_in(conn, request_id))

        return await self.db.write(work)

    # ---- grants ----------------------------------------------------------------------------
    @staticmethod
    def _grant_in(
        conn: Connection, kind: str, channel: str, subject: str, name: str, granted_by: str, request_id: int | None
    ) -> None:
        existing = conn.execute(
            select(access_grants.c.id).where(
                access_grants.c.kind == kind, access_grants.c.channel == channel, access_grants.c.subject == subject
            )
        ).first()
        if existing is None:
            grant_id = conn.execute(
                insert(access_grants).values(
                    kind=kind,
                    channel=channel,
                    subject=subject,
                    name=name,
                    granted_by=granted_by,
                    request_id=request_id,
                    created_at=utcnow(),
                ).returning(access_grants.c.id)
            ).scalar_one()
            if request_id is None:  # a pairing approval is recorded as such
                AuditRepo.record_in(conn, AuditEntry(
                    kind="access", action="granted", actor=f"{channel}:{subject}", decided_by=granted_by,
                    via=via_of(granted_by), detail={"kind": kind, "name": name, "id": grant_id},
                ))

    async def grant(self, *, kind: Kind, channel: str, subject: str, name: str = "", granted_by: str) -> None:
        await self.db.write(lambda conn: self._grant_in(conn, kind, channel, subject, name, granted_by, None))

    async def grant_for(self, kind: Kind, channel: str, subject: str) -> AccessGrantRecord | None:
        query = select(access_grants).where(
            access_grants.c.kind == kind, access_grants.c.channel == channel, access_grants.c.subject == subject
        )

        def work(conn: Connection) -> AccessGrantRecord | None:
            row = conn.execute(query).first()
            return to_record(AccessGrantRecord, row) if row is not None else None

        return await self.db.read(work)

    async def grants(self) -> list[AccessGrantRecord]:
        query = select(access_grants).order_by(access_grants.c.id)
        return await self.db.read(lambda conn: [to_record(AccessGrantRecord, r) for r in conn.execute(query).all()])

    async def revoke(self, ident: str, *, revoked_by: str = "cli") -> AccessGrantRecord | None:
        """By grant id, or by `channel:subject` (a person or a chat)."""

        def work(conn: Connection) -> AccessGrantRecord | None:
            if ident.isdigit():
                condition = access_grants.c.id == int(ident)
            else:
                channel, _, subject = ident.partition(":")
                condition = and_(access_grants.c.channel == channel, access_grants.c.subject == subject)
            row = conn.execute(select(access_grants).where(condition)).first()
            if row is None:
                return None
            conn.execute(delete(access_grants).where(access_grants.c.id == row.id))
            AuditRepo.record_in(conn, _audit("revoked", row, revoked_by))
            return to_record(AccessGrantRecord, row)

        return await self.db.write(work)


__all__ = [
    "AccessRepo",
    "AccessRequestRecord",
    "AccessGrantRecord",
    "RequestOutcome",
    "DecideOutcome",
    "TOKEN_PREFIX",
    "normalise_code",
]
