"""A chat's own choices (`/voice on|off`, `/rich on|off`), kept in `chat_preferences`: a choice a chat never
made is NULL there, and the configured default applies."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from gateway.events import utcnow
from gateway.store.audit import AuditEntry, AuditRepo
from gateway.store.base import Repo
from gateway.store.inbox import InsertIgnoring
from gateway.store.tables import chat_preferences

_ADD = InsertIgnoring(chat_preferences, ["chat"])


class PreferenceRepo(Repo):
    async def voice(self, chat: str) -> bool | None:
        """Whether `chat` ("<channel>:<chat id>") asked for voice notes; None: it never said."""
        query = select(chat_preferences.c.voice).where(chat_preferences.c.chat == chat)
        return await self.db.read(lambda conn: conn.execute(query).scalar())

    async def rich(self, chat: str) -> bool | None:
        """Whether `chat` asked for Telegram's rich messages; None: it never said."""
        query = select(chat_preferences.c.rich).where(chat_preferences.c.chat == chat)
        return await self.db.read(lambda conn: conn.execute(query).scalar())

    async def set_voice(self, chat: str, voice: bool, *, audit: AuditEntry | None = None) -> None:
        await self._set(chat, {"voice": voice}, audit)

    async def set_rich(self, chat: str, rich: bool, *, audit: AuditEntry | None = None) -> None:
        await self._set(chat, {"rich": rich}, audit)

    async def _set(self, chat: str, choice: dict[str, bool], audit: AuditEntry | None) -> None:
        def work(conn: Connection) -> None:
            now = utcnow()
            row = chat_preferences.c.chat == chat
            if conn.execute(update(chat_preferences).where(row).values(**choice, updated_at=now)).rowcount == 0:
                conn.execute(_ADD.for_conn(conn), {"chat": chat, **choice, "updated_at": now})
            if audit is not None:
                AuditRepo.record_in(conn, audit)

        await self.db.write(work)
