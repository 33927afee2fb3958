"""What the start log says about access: which rule lets people in on each channel, and who
decides approvals (the defaults changed: existing set-ups are told what to set)."""

from __future__ import annotations

import logging

from gateway.config import Config

log = logging.getLogger("gateway.access")


def explicit_dm_policy(config: Config) -> bool:
    """`access.dm_policy` written in the configuration (not the default): it then wins over a
    channel's fixed `allowed_users` for direct messages of people not listed."""
    return "dm_policy" in config.access.model_fields_set


def _fixed_users(config: Config) -> dict[str, list[str]]:
    found = {}
    if config.telegram.enabled and config.telegram.allowed_users:
        found["telegram"] = config.telegram.allowed_users
    if config.slack.enabled and config.slack.allowed_users:
        found["slack"] = config.slack.allowed_users
    return found


def admission_lines(config: Config) -> list[str]:
    """One line per chat channel with a fixed `allowed_users`: which rule applies to the others."""
    lines = []
    policy = config.access.dm_policy
    for channel in _fixed_users(config):
        if not explicit_dm_policy(config):
            lines.append(
                f"{channel}: only allowed_users are answered; anyone else's direct message is refused "
                f"(set access.dm_policy: pairing to pair them, or open to answer everyone)"
            )
        elif policy == "pairing":
            lines.append(f"{channel}: allowed_users are answered; anyone else's direct message gets a pairing code "
                         "(access.dm_policy: pairing)")
        else:
            lines.append(f"{channel}: allowed_users are answered; anyone else's direct message is handled by "
                         f"access.dm_policy: {policy}")
    return lines


def log_start_notes(config: Config) -> None:
    for line in admission_lines(config):
        log.info("access: %s", line)
