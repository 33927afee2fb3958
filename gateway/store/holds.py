"""Flood waits shared by every sender: a chat the platform asked us to leave alone (Telegram
`retry_after`, Slack `Retry-After`) is held in the database, so other instances, the sweeper
and a process started after the hold honour it too, not only the process that was told."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.engine import Connection

from gateway.events import utcnow
from gateway.store import notify
from gateway.store.base import Repo
from gateway.store.inbox import InsertIgnoring
from gateway.store.tables import chat_holds

_ADD = InsertIgnoring(chat_holds, ["chat"])
# A hold only ever grows: a shorter retry_after seen later does not shorten a longer one.
_EXTEND = (
    update(chat_holds)
    .where(chat_holds.c.chat == bindparam("held_chat"), chat_holds.c.until < bindparam("new_until"))
    .values(until=bindparam("new_until"))
)
_ACTIVE = select(chat_holds.c.chat, chat_holds.c.until).where(chat_holds.c.until > bindparam("now"))
_EXPIRED = delete(chat_holds).where(chat_holds.c.until <= bindparam("now"))
HOLDS_CHANNEL = "gateway_holds"


class HoldRepo(Repo):
    async def hold(self, chat: str, until: datetime) -> None:
        """Hold `chat` ("<channel>:<chat id>") until `until` (or longer, if already held so)."""

        def work(conn: Connection) -> None:
            conn.execute(_EXPIRED, {"now": utcnow()})
            if conn.execute(_EXTEND, {"held_chat": chat, "new_until": until}).rowcount == 0:
                conn.execute(_ADD.for_conn(conn), {"chat": chat, "until": until})
            notify.publish_in(conn, {chat}, channel=HOLDS_CHANNEL)

        await self.db.write(work)

    async def active(self) -> dict[str, datetime]:
        """Every chat held now, with the end of its hold."""
        return await self.db.read(lambda conn: dict(conn.execute(_ACTIVE, {"now": utcnow()}).tuples().all()))
