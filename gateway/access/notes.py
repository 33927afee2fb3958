"""What the start log says about access: which rule lets people in on each channel, and who
decides approvals (the defaults changed: existing set-ups are told what to set)."""

from __future__ import annotations

import logging
from collections.abc import Collection

from gateway.config import Config

log = logging.getLogger("gateway.access")


def explicit_dm_policy(config: Config) -> bool:
    """`access.dm_policy` written in the configuration (not the default): it then wins over a
    channel's fixed `allowed_users` for direct messages of people not listed."""
    return "dm_policy" in config.access.model_fields_set


def explicit_group_policy(config: Config) -> bool:
    """`access.group_policy` written in the configuration: `allowlist` then decides every group,
    beside a channel's `allowed_users` (a listed person no longer opens a group by mentioning
    the bot there)."""
    return "group_policy" in config.access.model_fields_set


def groups_by_chat_only(config: Config) -> bool:
    """Groups are answered only when listed or approved, whoever writes there (admins aside)."""
    return explicit_group_policy(config) and config.access.group_policy == "allowlist"


def _fixed_users(config: Config) -> dict[str, list[str]]:
    found = {}
    if config.telegram.enabled and config.telegram.allowed_users:
        found["telegram"] = config.telegram.allowed_users
    if config.slack.enabled and config.slack.allowed_users:
        found["slack"] = config.slack.allowed_users
    return found


def admission_lines(config: Config) -> list[str]:
    """One line per chat channel with a fixed `allowed_users`: which rule applies to the others
    in direct messages, and what lets a group in."""
    lines = []
    policy = config.access.dm_policy
    for channel in _fixed_users(config):
        if not explicit_dm_policy(config):
            dms = (
                f"{channel}: only allowed_users are answered; anyone else's direct message is refused "
                f"(set access.dm_policy: pairing to pair them, or open to answer everyone)"
            )
        elif policy == "pairing":
            dms = (f"{channel}: allowed_users are answered; anyone else's direct message gets a pairing code "
                   "(access.dm_policy: pairing)")
        else:
            dms = (f"{channel}: allowed_users are answered; anyone else's direct message is handled by "
                   f"access.dm_policy: {policy}")
        lines.append(f"{dms}; {_group_rule(config)}")
    return lines


def _group_rule(config: Config) -> str:
    if groups_by_chat_only(config):
        return ("in groups only allowed_chats and groups an admin approved are answered, listed people's mentions "
                "included (access.group_policy: allowlist)")
    if config.access.group_policy == "open":
        return "every group is answered (access.group_policy: open)"
    return ("listed people are answered in any group where they mention the bot (set access.group_policy: "
            "allowlist to answer only allowed_chats and groups an admin approved)")


def chat_channels(config: Config) -> list[str]:
    return [name for name, section in (("telegram", config.telegram), ("slack", config.slack)) if section.enabled]


def admins_missing(config: Config, claimed: Collection[str] = ()) -> list[str]:
    """The chat channels with nobody to decide approval requests by default (no admin; `claimed`:
    the channels someone claimed, gateway/access/claim.py)."""
    return [c for c in chat_channels(config) if not config.approvals.admins.get(c) and c not in claimed]


def approval_lines(config: Config, claimed: Collection[str] = (), *, upgrading: bool = True) -> list[tuple[int, str]]:
    """(level, line): who decides approvals; `upgrading` (the database existed before): also that
    this changed for set-ups that relied on self-approval, and how to have the old behaviour."""
    if config.approvals.self_approve:
        return [(logging.INFO, "approvals.self_approve: true: with no approvers, the person who asked decides "
                 "their own requests (shell, write_file, ...): anyone let in can run them")]
    lines = []
    changed = ", no longer by the person who asked" if upgrading else ""
    old = " (or approvals.self_approve: true for the old behaviour)" if upgrading else ""
    for channel in admins_missing(config, claimed):
        others = bool(config.approvals.approvers.get(channel))
        decided = "approvals.approvers" if others else "nobody in the chat (`gateway approvals` from the terminal)"
        lines.append((logging.WARNING, (
            f"{channel}: approval requests are decided by approvals.admins (or approvers, or a role with "
            f"approve: true){changed}; {channel} has no admin, so {decided} decides them. "
            f"Set approvals.admins: {{{channel}: [<your id>]}} or claim it with the code of the claim line{old}"
        )))
    return lines


def doctor_checks(config: Config, claimed: Collection[str] = ()) -> list[tuple[str, str, str, str]]:
    """(name, ok | warn, found, fix) for `gateway doctor`: an admin per chat channel (`claimed`:
    the channels someone claimed)."""
    checks = []
    for channel in chat_channels(config):
        admins = config.approvals.admins.get(channel) or []
        fix = f"set approvals.admins: {{{channel}: [<your id>]}}, or claim it (`gateway status` shows the code)"
        if channel in claimed and not admins:
            checks.append((f"admins ({channel})", "ok", "claimed: `gateway access list` shows who", ""))
        elif admins:
            checks.append((f"admins ({channel})", "ok", f"{len(admins)} admin(s) decide approvals and pairing", ""))
        elif config.approvals.self_approve:
            checks.append((f"admins ({channel})", "warn", "no admin; people approve their own requests "
                           "(approvals.self_approve: true)", fix))
        else:
            checks.append((f"admins ({channel})", "warn", "no admin: approval and pairing requests wait for "
                           "the terminal", fix))
    return checks


def log_start_notes(config: Config, claimed: Collection[str] = (), *, upgrading: bool = True) -> None:
    for line in admission_lines(config):
        log.info("access: %s", line)
    for level, line in approval_lines(config, claimed, upgrading=upgrading):
        log.log(level, "approvals: %s", line)
