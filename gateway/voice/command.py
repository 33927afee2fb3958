"""`/voice`, `/voice on`, `/voice off`: whether this chat's answers also come as voice notes.
In a direct message the person decides; in a group an admin does (everyone there hears them,
and the speech is paid for)."""

from __future__ import annotations

from typing import Any

from gateway.access import AccessPolicy
from gateway.config import Config
from gateway.events import ThreadKey
from gateway.store import AuditEntry

USAGE = "Use /voice on (answers also come as a voice note) or /voice off."
NO_MODEL = (
    "Voice notes need a speech model: the owner sets llm.speech_model in config.yml "
    "(an OpenAI-compatible /audio/speech model, e.g. gpt-4o-mini-tts) and restarts."
)


async def voice_command(
    store: Any, config: Config, access: AccessPolicy | None, thread: ThreadKey, sender: str, private: bool, args: str
) -> str:
    """The answer to `/voice <args>` from `sender` in `thread` (a direct message when `private`)."""
    chat = f"{thread.channel}:{thread.chat}"
    setting = args.strip().lower()
    if not setting:
        return await _state(store, config, chat)
    if setting not in ("on", "off"):
        return USAGE
    if not private and access is not None and not access.is_admin(thread.channel, sender):
        return f"Only an admin can switch voice notes in a group. {await _state(store, config, chat)}"
    on = setting == "on"
    if on and not config.llm.speech_model:
        return NO_MODEL
    audit = AuditEntry(
        kind="preference", action=f"voice_{setting}", actor=f"{thread.channel}:{sender}" if sender else None,
        thread_key=str(thread), outcome="ok", detail={"via": "/voice"},
    )
    await store.preferences.set_voice(chat, on, audit=audit)
    if on:
        return "Voice notes are on: answers here also come as a voice note (the text stays). /voice off stops them."
    return "Voice notes are off: answers here come as text only."


async def _state(store: Any, config: Config, chat: str) -> str:
    chosen = await store.preferences.voice(chat)
    on = chosen if chosen is not None else config.voice.default == "on"
    if not config.llm.speech_model:
        return "Answers here come as text only: no speech model is set up (llm.speech_model)."
    if on:
        return "Voice notes are on in this chat: /voice off stops them."
    return "Voice notes are off in this chat: /voice on turns them on."
