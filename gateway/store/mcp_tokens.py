"""The stored OAuth state of remote MCP servers: per server, its tokens and its client
registration, each an opaque (encrypted) string; gateway/mcp/oauth.py encrypts and decrypts."""

from __future__ import annotations

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from gateway.events import utcnow
from gateway.store.base import Repo
from gateway.store.tables import mcp_tokens


class McpTokenRepo(Repo):
    async def get(self, server: str, field: str) -> str | None:
        column = mcp_tokens.c[field]
        statement = select(column).where(mcp_tokens.c.server == server)
        return await self.db.read(lambda conn: conn.execute(statement).scalar())

    async def set(self, server: str, field: str, value: str | None) -> None:
        def work(conn: Connection) -> None:
            values = {field: value, "updated_at": utcnow()}
            changed = conn.execute(update(mcp_tokens).where(mcp_tokens.c.server == server).values(**values))
            if changed.rowcount == 0:
                conn.execute(insert(mcp_tokens).values(server=server, **values))

        await self.db.write(work)

    async def forget(self, server: str) -> None:
        await self.set(server, "tokens", None)
