"""Where an approval prompt goes, and what it says: the people who may decide it see its
buttons; the person who asked, when they may not decide it, sees that it waits.

By default a request is decided by the channel's admins (`approvals.admins`), its approvers
(`approvals.approvers`) and people whose role has `approve: true`, never by the requester
alone (`approvals.self_approve: true` restores that). A request such people cannot see where
it was made (a member's DM, a group they may not be in) is sent to each one's own DM as well;
in a DM the member is told it waits. The owner of a one-person set-up is an admin (configured,
or claimed with the code the terminal shows: gateway/access/claim.py): their own requests stay
one tap. A tap that may not decide is told who does, and how the owner becomes an admin while
the channel has none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gateway.access.claim import claim_alert, claimable
from gateway.access.policy import TRUSTED_CHANNELS, AccessPolicy
from gateway.config import Config
from gateway.serving.display import escape_invisible, escape_markdown, name_shown

WAITING_FOR_ADMIN = (
    "⏳ `{tool}` needs an admin's approval: I asked them, and I'll go on once one of them decides."
)
NOBODY_DECIDES = (
    "approval %s (%s, asked by %s:%s) has nobody to decide it: set approvals.admins for %s or claim it with "
    "the code of the claim line (or approvals.self_approve: true); `gateway approvals` decides it from the terminal"
)


# What a tap that may not decide is answered (an alert: at most 200 characters on Telegram).
OWN_REQUEST_SEPARATE = "You asked for this, so someone else decides it (approvals.separate_requester)."
OWN_REQUEST = "An admin (or an approver) decides your requests here, not you: it waits for them."
REQUESTERS = "Only the person who asked (or an admin) decides this request."
OTHERS_REQUEST = "Only an admin (or an approver) decides this request: it waits for them."
NOT_ASKED = "Only the person this was asked of (or an admin) answers it."


def deciders(config: Config, access: AccessPolicy | None, channel: str) -> list[str]:
    """The people of `channel` who may decide others' approval requests: the configuration's,
    and the admins who claimed the channel."""
    admins = access.admins(channel) if access is not None else config.approvals.admins.get(channel) or ()
    people = {str(p) for p in admins}
    people |= {str(p) for p in (config.approvals.approvers.get(channel) or ())}
    if access is not None:
        for person, role in config.access.users.items():
            where, _, user = person.partition(":")
            if where == channel and access.roles.get(role) is not None and access.roles[role].approve:
                people.add(user)
    return sorted(people)


def refusal(config: Config, access: AccessPolicy | None, kind: str, channel: str, user: str, requested_by: str) -> str:
    """What a tap that may not decide is answered: who decides instead, and while the channel has
    no admin, how the owner becomes one (never only "you can't")."""
    if kind != "approval":
        return NOT_ASKED
    own = bool(requested_by) and str(user) == str(requested_by)
    if own and config.approvals.separate_requester:
        return OWN_REQUEST_SEPARATE
    if not own and requester_decides(config, channel) and not config.approvals.approvers.get(channel):
        return REQUESTERS
    if access is not None and claimable(config, access, channel) and not deciders(config, access, channel):
        return claim_alert(channel)
    return OWN_REQUEST if own else OTHERS_REQUEST


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
