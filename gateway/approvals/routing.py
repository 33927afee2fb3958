"""Where an approval prompt goes, and what it says: the people who may decide it see its
buttons; the person who asked, when they may not decide it, sees that it waits.

By default a request is decided by the channel's admins (`approvals.admins`), its approvers
(`approvals.approvers`) and people whose role has `approve: true`, never by the requester
alone (`approvals.self_approve: true` restores that). A request such people cannot see where
it was made (a member's DM, a group they may not be in) is sent to each one's own DM as well;
in a DM the member is told it waits. The owner of a one-person set-up is an admin: their own
requests stay one tap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gateway.access.policy import TRUSTED_CHANNELS, AccessPolicy
from gateway.config import Config
from gateway.display import escape_invisible, escape_markdown, name_shown

WAITING_FOR_ADMIN = (
    "⏳ `{tool}` needs an admin's approval: I asked them, and I'll go on once one of them decides."
)
NOBODY_DECIDES = (
    "approval %s (%s, asked by %s:%s) has nobody to decide it: set approvals.admins for %s "
    "(or approvals.self_approve: true); `gateway approvals` decides it from the terminal"
)


def deciders(config: Config, access: AccessPolicy | None, channel: str) -> list[str]:
    """The people of `channel` who may decide others' approval requests, by the configuration."""
    people = {str(p) for p in (config.approvals.admins.get(channel) or ())}
    people |= {str(p) for p in (config.approvals.approvers.get(channel) or ())}
    if access is not None:
        for person, role in config.access.users.items():
            where, _, user = person.partition(":")
            if where == channel and access.roles.get(role) is not None and access.roles[role].approve:
                people.add(user)
    return sorted(people)


def requester_decides(config: Config, channel: str) -> bool:
    """Whether the person who asked may decide their own request by the base rule."""
    return channel in TRUSTED_CHANNELS or config.approvals.self_approve


def shown_arguments(raw: str) -> str:
    """The call's arguments as the decider reads them: pretty JSON, hidden characters (bidi
    overrides, zero-width) shown as their escapes (still valid JSON)."""
    try:
        text = json.dumps(json.loads(raw or "{}"), indent=2, ensure_ascii=False)
    except ValueError:
        text = raw
    return escape_invisible(text)


def one_line(arguments: str, limit: int = 120) -> str:
    """Arguments inside a Markdown line (a sub-agent's request): one line, escaped."""
    text = " ".join(escape_invisible(arguments).split())
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return escape_markdown(text)


@dataclass(frozen=True)
class Asker:
    """Who asked, and where: for the text of the copies sent to the deciders' DMs."""

    channel: str
    user_id: str
    name: str
    private: bool
    chat: str

    def line(self) -> str:
        who = name_shown(self.name) or escape_markdown(self.user_id)
        where = "in a direct message" if self.private else f"in the chat {escape_markdown(self.chat)}"
        return f"Asked by {who} ({self.channel}:{escape_markdown(self.user_id)}) {where}."
