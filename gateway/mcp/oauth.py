"""The OAuth state of a remote MCP server behind OAuth (`auth: oauth`): its tokens and its client
registration, kept in the database (`mcp_tokens`) encrypted with a Fernet key from the
environment (GATEWAY_SECRET_KEY), so the table alone signs nobody in. The SDK's OAuth client
(gateway/mcp/sdk.py) reads and writes them through `TokenVault`: it refreshes expired tokens
itself; when it would need a person's sign-in (no tokens, or a refresh refused) the server's
state is `needs_login` until `gateway mcp login <name>` has been run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

KEY_VARIABLE = "GATEWAY_SECRET_KEY"


class NoKey(Exception):
    """GATEWAY_SECRET_KEY is unset or not a Fernet key."""


def new_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode("ascii")


class TokenVault:
    """One server's stored tokens and client registration, as JSON strings."""

    def __init__(self, store: Any, server: str, key: str):
        from cryptography.fernet import Fernet

        try:
            self._fernet = Fernet(key.encode("ascii"))
        except (ValueError, TypeError) as exc:
            raise NoKey(f"{KEY_VARIABLE} is not a Fernet key (make one with `gateway mcp key`): {exc}") from None
        self.store, self.server = store, server

    @classmethod
    def from_env(cls, store: Any, server: str, env: Mapping[str, str] | None = None) -> TokenVault:
        key = (env if env is not None else os.environ).get(KEY_VARIABLE, "")
        if not key:
            raise NoKey(f"{KEY_VARIABLE} is not set: it encrypts the stored MCP tokens (`gateway mcp key` makes one)")
        return cls(store, server, key)

    async def load(self, field: str) -> str | None:
        from cryptography.fernet import InvalidToken

        sealed = await self.store.mcp_tokens.get(self.server, field)
        if not sealed:
            return None
        try:
            return self._fernet.decrypt(sealed.encode("ascii")).decode("utf-8")
        except InvalidToken:
            return None  # another key: as good as no tokens (sign in again)

    async def save(self, field: str, value: str) -> None:
        sealed = self._fernet.encrypt(value.encode("utf-8")).decode("ascii")
        await self.store.mcp_tokens.set(self.server, field, sealed)
