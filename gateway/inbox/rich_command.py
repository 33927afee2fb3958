"""`/rich`, `/rich on`, `/rich off`: whether this Telegram chat's long answers come as one rich
message (tables, headings; Bot API 10.1) or as plain messages. Telegram Web does not show rich
messages, so a chat chooses: in a direct message the person, in a group an admin (everyone there
reads them). A chat that never chose follows `telegram.rich_messages`."""

from __future__ import annotations

from typing import Any

from gateway.access import AccessPolicy
from gateway.config import Config
from gateway.events import ThreadKey
from gateway.store import AuditEntry

USAGE = "Use /rich on (long answers, tables and headings as one rich message) or /rich off (plain messages)."
NOT_HERE = "Rich messages are Telegram's: answers here are formatted as this app shows them."


async def rich_command(
    store: Any, config: Config, access: AccessPolicy | None, thread: ThreadKey, sender: str, private: bool, args: str
) -> str:
    """The answer to `/rich <args>` from `sender` in `thread` (a direct message when `private`)."""
    if thread.channel != "telegram":
        return NOT_HERE
    chat = f"{thread.channel}:{thread.chat}"
    setting = args.strip().lower()
    if not setting:
        return await rich_state(store, config, chat)
    if setting not in ("on", "off"):
        return USAGE
    if not private and access is not None and not access.is_admin(thread.channel, sender):
        return f"Only an admin can switch rich messages in a group. {await rich_state(store, config, chat)}"
    audit = AuditEntry(
        kind="preference", action=f"rich_{setting}", actor=f"{thread.channel}:{sender}" if sender else None,
        thread_key=str(thread), outcome="ok", detail={"via": "/rich"},
    )
    await store.preferences.set_rich(chat, setting == "on", audit=audit)
    if setting == "on":
        return ("Rich messages are on: long answers, tables and headings come as one rich message "
                "(Telegram Web does not show them). /rich off goes back to plain messages.")
    return "Rich messages are off: answers here come as plain messages."


async def chat_wants_rich(store: Any, config: Config, chat: str) -> bool:
    chosen = await store.preferences.rich(chat)
    return chosen if chosen is not None else config.telegram.rich_messages == "on"


async def rich_state(store: Any, config: Config, chat: str) -> str:
    if await chat_wants_rich(store, config, chat):
        return "Rich messages are on in this chat: /rich off sends plain messages instead."
    return "Rich messages are off in this chat: /rich on sends long answers, tables and headings as one rich message."
