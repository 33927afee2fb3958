"""Claiming the owner: how the person who runs the gateway becomes a chat channel's admin
without editing the configuration (docs/access.md, "Claiming the owner").

While a chat channel has no admin (nobody in `approvals.admins`, nobody claimed it), the
terminal shows a one-time code on a line that says "claim" (the start log, `gateway setup`,
`gateway status`, `gateway access claim`: `current_claim_line`). The person who sends
`/start <code>` to the bot in a Telegram direct message, or the code alone in a Slack direct
message, becomes that channel's admin, kept in the database (gateway/store/claims.py): listed
by `gateway access list`, removed by `gateway access revoke`, counted wherever
`approvals.admins` is. A code works once and for `CLAIM_TTL_S`; a wrong one is refused and
counted, and `MAX_WRONG` of them in a row lock the person out for `LOCKOUT_S`. Only the
terminal shows codes: a chat never does.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime

from gateway.access.notes import chat_channels, log_start_notes
from gateway.access.policy import AccessPolicy
from gateway.config import Config
from gateway.events import ThreadKey, utcnow
from gateway.running.clock import SYSTEM_CLOCK, Clock
from gateway.serving.display import name_shown
from gateway.store import Store
from gateway.store.access import CODE_ALPHABET
from gateway.store.claims import ClaimCode
from gateway.store.items import Said

log = logging.getLogger(__name__)

CLAIM_TTL_S = 3600.0  # a code's life: long enough to set up, short enough that an old log is stale
MAX_WRONG = 5  # wrong codes in a row from one person before the lock-out
LOCKOUT_S = 15 * 60.0

_START = re.compile(r"^/start(?:@\w+)?(?:\s+(?P<code>\S.*))?$", re.IGNORECASE | re.DOTALL)
# A code sent alone (Slack has no /start): its shape as shown, dash included, and a digit or its
# capitals as well, so two words a person writes ("fresh start", "sweet-dream") are not taken for one.
_BARE_CODE = re.compile(rf"^[{CODE_ALPHABET}]{{5}}-[{CODE_ALPHABET}]{{5}}$", re.IGNORECASE)

WHERE_CODES_ARE = "the gateway's start log and `gateway status` show it"


def is_start(text: str) -> bool:
    return _START.match(text.strip()) is not None


def code_sent(text: str) -> str | None:
    """The claim code a message offers: `/start <code>`, or a code alone; None for anything else."""
    stripped = text.strip()
    start = _START.match(stripped)
    if start is not None:
        return start.group("code")
    if not _BARE_CODE.match(stripped):
        return None
    return stripped if stripped.isupper() or any(ch.isdigit() for ch in stripped) else None


def how_to_send(channel: str, code: str) -> str:
    """What to send, and where, to claim `channel` with `code`."""
    if channel == "telegram":
        return f"send `/start {code}` to the bot in a direct message"
    return f"send `{code}` to the bot in a direct message"


def claim_hint(channel: str) -> str:
    """For someone in the chat who may be the owner: how to claim (the code only the terminal shows)."""
    what = "`/start` and the claim code" if channel == "telegram" else "the claim code"
    return f"If you run this assistant, send me {what} to become its admin ({WHERE_CODES_ARE})."


def claim_alert(channel: str) -> str:
    """A refused tap's answer while `channel` has no admin (plain text, within Telegram's 200 characters)."""
    what = "/start and the claim code" if channel == "telegram" else "the claim code"
    return (
        f"Only an admin decides this, and {channel} has none yet. If you run this assistant, send me {what} "
        "in a direct message (its start log and 'gateway status' show it)."
    )


def claim_line(code: ClaimCode, *, telegram_bot: str = "") -> str:
    """`telegram_bot`: the bot's username, when known: a link that sends the `/start` in one tap."""
    link = ""
    if telegram_bot and code.channel == "telegram":  # Telegram sends `/start <code>` for the person
        link = f" (or open https://t.me/{telegram_bot}?start={code.code})"
    return (
        f"claim: {code.channel} has no admin yet: {how_to_send(code.channel, code.code)}{link} to become its "
        f"admin (works once, until {code.expires_at:%H:%M} UTC; or set approvals.admins)"
    )


def claimable(config: Config, policy: AccessPolicy, channel: str) -> bool:
    """A chat channel nobody decides for: no admin configured, none claimed."""
    return channel in chat_channels(config) and not policy.admins(channel)


def unclaimed(config: Config, policy: AccessPolicy) -> list[str]:
    return [channel for channel in chat_channels(config) if claimable(config, policy, channel)]


async def refresh_admins(store: Store, policy: AccessPolicy) -> None:
    """Hand the policy the claimed admins as they are now (a claim or a removal made by another
    instance or the command line counts at once)."""
    policy.use_claimed(await store.claims.admins())


async def claim_lines(
    store: Store, config: Config, *, now: datetime | None = None, telegram_bot: str = ""
) -> list[str]:
    """One line per chat channel with no admin, with its code (made when it has none or it
    expired). The store must be migrated. `telegram_bot`: see claim_line."""
    policy = AccessPolicy(config)
    await refresh_admins(store, policy)
    lines = []
    for channel in unclaimed(config, policy):
        code = await store.claims.open_code(channel, now=now or utcnow(), ttl_s=CLAIM_TTL_S)
        if code is not None:
            lines.append(claim_line(code, telegram_bot=telegram_bot))
    return lines


async def current_claim_line(
    store: Store, config: Config, *, now: datetime | None = None, telegram_bot: str = ""
) -> str:
    """The claim line(s) to show in the terminal ("" when every chat channel has an admin);
    several channels: one line each, joined by newlines. `telegram_bot`: the bot's username
    (getMe), when the caller knows it: the line adds a t.me link that claims in one tap."""
    return "\n".join(await claim_lines(store, config, now=now, telegram_bot=telegram_bot))


async def start_claims(
    store: Store, config: Config, policy: AccessPolicy, *, now: datetime | None = None, upgrading: bool = True
) -> None:
    """At the start: the policy learns the claimed admins, the log says what is missing (an
    admin per chat channel; `upgrading`: the database is from before) and shows a claim line per
    channel that has none."""
    await refresh_admins(store, policy)
    log_start_notes(config, claimed=policy.admin_ids.keys(), upgrading=upgrading)
    for line in await claim_lines(store, config, now=now):
        log.warning("%s", line)


def _minutes(until: datetime, now: datetime) -> str:
    return f"{max(1, round((until - now).total_seconds() / 60))} min"


@dataclass(frozen=True)
class ClaimAnswer:
    text: str
    claimed: bool = False


class Claims:
    """Claim attempts in direct messages, before the access check (a stranger may be the owner)."""

    def __init__(self, store: Store, config: Config, policy: AccessPolicy, *, clock: Clock = SYSTEM_CLOCK):
        self.store = store
        self.config = config
        self.policy = policy
        self.clock = clock

    def claimable(self, channel: str) -> bool:
        return claimable(self.config, self.policy, channel)

    async def attempt(self, thread: ThreadKey, said: Said) -> ClaimAnswer | None:
        """The answer to a claim attempt; None when the message is not one (the policy's
        claimed admins must be current: see refresh_admins)."""
        sender_id, name = said.sender.id, said.sender.name or said.sender.username
        code = code_sent(said.text) if sender_id else None
        if code is None or not self.claimable(thread.channel):
            return None
        if not said.private:  # only a DM claims; the right code sent where others read it is spent
            if await self.store.claims.void(thread.channel, code):
                log.warning("claim: the %s claim code was sent in a group by %s:%s: void, the next one is in "
                            "`gateway status`", thread.channel, thread.channel, sender_id)
                return ClaimAnswer(VOIDED)
            return None
        now = self.clock.now()
        result = await self.store.claims.attempt(
            thread.channel, sender_id, code, name=name, now=now, max_wrong=MAX_WRONG, lockout_s=LOCKOUT_S
        )
        if result.kind == "claimed":
            await refresh_admins(self.store, self.policy)
            log.warning("claim: %s:%s (%s) is now an admin of %s (`gateway access list`; remove with "
                        "`gateway access revoke %s:%s`)", thread.channel, sender_id, name, thread.channel,
                        thread.channel, sender_id)
            return ClaimAnswer(CLAIMED.format(channel=thread.channel.capitalize()), claimed=True)
        if result.kind == "wrong":
            log.warning("claim: a wrong code from %s:%s (%s)", thread.channel, sender_id, name)
            if result.locked_until is not None:
                return ClaimAnswer(LOCKED.format(wait=_minutes(result.locked_until, now)))
            return ClaimAnswer(WRONG.format(tries=result.tries_left, lockout=_minutes_of(LOCKOUT_S)))
        if result.kind == "locked" and result.locked_until is not None:
            return ClaimAnswer(LOCKED.format(wait=_minutes(result.locked_until, now)))
        if result.kind == "expired":
            return ClaimAnswer(EXPIRED)
        return ClaimAnswer(TAKEN)


def _minutes_of(seconds: float) -> str:
    return f"{round(seconds / 60)} min"


CLAIMED = (
    "✅ You are now this assistant's admin on {channel}: you decide approval requests (your own included) "
    "and who may talk to me. Admins are listed by `gateway access list`."
)
WRONG = (
    "❌ That is not this assistant's claim code (" + WHERE_CODES_ARE + "). "
    "{tries} more wrong codes and you wait {lockout}."
)
LOCKED = "⏳ Too many wrong claim codes: try again in {wait}."
EXPIRED = "⌛ That claim code has expired: the gateway's start log and `gateway status` show a new one."
TAKEN = "This assistant has an admin already."
VOIDED = (
    "That claim code works only in a direct message, and it is void now that others may have read it: "
    "`gateway status` shows a new one. Send it to me in a direct message."
)


def start_text(channel: str, name: str, *, admin: bool, claimable: bool) -> str:
    """The answer to `/start` for someone let in."""
    shown = name_shown(name)
    hello = f"👋 Hello{', ' + shown if shown else ''}! I'm an AI assistant: write to me here (in a group, mention me) "
    lines = [hello + "and I'll answer. /help lists the commands."]
    if admin:
        lines.append("You are an admin here: you decide approval requests (tools such as `shell` ask first) "
                     "and who may talk to me.")
    elif claimable:
        lines.append(claim_hint(channel))
    return "\n".join(lines)
