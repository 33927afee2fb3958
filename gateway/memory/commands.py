"""`/memory`: people see and control what the agent remembers.

`/memory` lists this chat's memory (a direct message: your own; a group: the group's), each
entry with who saved it and from what, `/memory forget N` forgets entry #N, `/memory clear`
forgets all of it, and in a direct message `/memory share on|off` lets (or stops) your memory
being read in the groups you speak in. In a group, a member forgets the entries their own turns
saved; clearing the group's memory, or forgetting others' entries, takes an admin (rules.py,
which `memory_forget` follows too). Forgetting takes the text out of the kept history as well
(gateway/store/memory.py).
"""

from __future__ import annotations

from typing import Any

from gateway.access import AccessPolicy
from gateway.config import MemoryConfig
from gateway.events import ThreadKey
from gateway.memory import rules
from gateway.memory.block import entry_line
from gateway.memory.scope import message_owner
from gateway.store.audit import AuditEntry

MAX_LISTED = 50
USAGE = "Use /memory, /memory forget N, /memory clear, or in a direct message /memory share on|off."
OFF = "Memory is off here (memory.enabled: false)."


class MemoryCommand:
    def __init__(
        self, store: Any, config: MemoryConfig, access: AccessPolicy | None, thread: ThreadKey, sender: str,
        private: bool,
    ):
        self.store, self.config, self.access = store, config, access
        self.thread, self.sender, self.private = thread, sender, private
        self.owner = message_owner(config, thread, sender, private)
        self.personal = self.owner.startswith("person:")
        self.person = f"{thread.channel}:{sender}" if sender else ""  # as entries and the audit trail name people

    def _audit(self, action: str) -> AuditEntry:
        return AuditEntry(
            kind="memory", action=action, actor=self.person or None, thread_key=str(self.thread),
            outcome="ok", detail={"via": "/memory"},
        )

    def _is_admin(self) -> bool:
        return self.access is None or self.access.is_admin(self.thread.channel, self.sender)

    async def run(self, args: str) -> str:
        if not self.config.enabled:
            return OFF
        word, _, rest = args.strip().partition(" ")
        word, rest = word.lower(), rest.strip()
        if word in ("", "list"):
            return await self.listing()
        if word == "forget":
            return await self.forget(rest)
        if word == "clear":
            return await self.clear()
        if word == "share":
            return await self.share(rest.lower())
        return USAGE

    async def listing(self) -> str:
        entries = await self.store.memory.list([self.owner])
        whose = "Your memory" if self.personal else "This chat's memory"
        lines = [f"{whose}: {len(entries)} {'entry' if len(entries) == 1 else 'entries'}."]
        if not entries:
            lines = [f"{whose} is empty: nothing is remembered yet."]
        shown = entries[-MAX_LISTED:]
        if len(entries) > len(shown):
            lines.append(f"(the newest {len(shown)} shown)")
        lines += [entry_line(e)[2:] for e in shown]
        if self.personal and self.config.scope == "person":
            shared = await self.store.memory.shared(self.owner)
            switch = "off" if shared else "on"
            lines.append(f"Read in the groups you speak in: {'yes' if shared else 'no'} (/memory share {switch}).")
        lines.append("/memory forget N forgets entry #N; /memory clear forgets everything.")
        return "\n".join(lines)

    async def forget(self, number: str) -> str:
        if not number.lstrip("#").isdigit():
            return "Say which entry: /memory forget N, with N the #number /memory shows."
        memory_id = int(number.lstrip("#"))
        entry = await self.store.memory.get(memory_id)
        if entry is None or entry.owner != self.owner:
            return f"There is no entry #{memory_id} in this chat's memory (/memory lists them)."
        if not rules.may_forget(entry, self.person, admin=self._is_admin()):
            return rules.refusal(memory_id)
        await self.store.memory.forget(self.owner, [memory_id], audit=self._audit("forget"))
        return f"Forgot entry #{memory_id}."

    async def clear(self) -> str:
        if not rules.may_clear(self.owner, admin=self._is_admin()):
            return "Only an admin can clear a group's memory; /memory forget N forgets an entry you saved."
        count = await self.store.memory.clear(self.owner, audit=self._audit("clear"))
        return f"Forgot {count} {'entry' if count == 1 else 'entries'}." if count else "There was nothing to forget."

    async def share(self, setting: str) -> str:
        if not (self.personal and self.config.scope == "person"):
            return "Sharing is set in a direct message with me: /memory share on|off there."
        if setting not in ("on", "off"):
            return "Use /memory share on (your memory is read in the groups you speak in) or /memory share off."
        shared = setting == "on"
        await self.store.memory.set_shared(self.owner, shared, audit=self._audit("share_on" if shared else "share_off"))
        if shared:
            return "Your memory is now read in the groups you speak in (only in the turns you ask for)."
        return "Your memory is no longer read in groups."


async def memory_command(
    store: Any, config: MemoryConfig, access: AccessPolicy | None, thread: ThreadKey, sender: str, private: bool,
    args: str,
) -> str:
    """The answer to `/memory <args>` from `sender` in `thread` (a direct message when `private`)."""
    return await MemoryCommand(store, config, access, thread, sender, private).run(args)
