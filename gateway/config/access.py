"""The settings of who may talk to the agent (roles, pairing) and what it may cost (caps)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from gateway.config.base import Section, parse_duration

DmPolicy = Literal["pairing", "allowlist", "open"]
GroupPolicy = Literal["allowlist", "open"]


class RoleConfig(Section):
    """What a person's turns may do. Tool lists are names or globs."""

    tools: list[str] = ["*"]  # offered (and allowed) tools
    deny_tools: list[str] = []  # never offered, refused if called anyway
    approve: bool = False  # may decide approval requests of other people
    compact: bool = True  # may run /compact
    new_for_others: bool = False  # may run /new in a chat whose session someone else started
    schedule: bool = True  # may use the `schedule` tool
    models: list[str] = ["*"]  # names (or globs) of llm.models its turns may use (checked each turn); default always
    skills: list[str] = ["*"]  # names (or globs) of the pinned skills offered to its turns (docs/skills.md)


class AccessConfig(Section):
    dm_policy: DmPolicy = "pairing"
    group_policy: GroupPolicy = "allowlist"
    pairing_ttl: float = 3600.0
    max_pending_per_channel: int = Field(10, ge=1)  # people with pairing requests waiting at once, per channel
    roles: dict[str, RoleConfig] = {}
    users: dict[str, str] = {}  # "telegram:123456789" -> role name (admin | member | your own)

    _duration = field_validator("pairing_ttl", mode="before")(lambda cls, v: parse_duration(v))

    @field_validator("users", mode="before")
    @classmethod
    def _keys_as_strings(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return value


class CapConfig(Section):
    scope: Literal["user", "chat", "job", "global"]
    period: Literal["day", "week", "month"]
    usd: float | None = Field(None, ge=0)
    tokens: int | None = Field(None, ge=0)

    @field_validator("tokens")
    @classmethod
    def _one_limit(cls, tokens: int | None, info: Any) -> int | None:
        if tokens is None and info.data.get("usd") is None:
            raise ValueError("a cap needs usd or tokens")
        return tokens


class BudgetsConfig(Section):
    caps: list[CapConfig] = []
    alert_at: list[float] = [0.5, 0.8, 1.0]  # shares of a cap at which admins are told, once per period
    unpriced: Literal["deny", "allow"] = "deny"  # a USD cap with a model that has no price
    reply_tokens: int = Field(4096, ge=1)  # a capped call's reply limit when llm.max_tokens is unset
    prompt_bytes_per_token: float = Field(3.0, gt=0)  # the reservation's bound on prompt tokens
    reservation_ttl: float = 3600.0  # a reservation its call never settled (a crash) counts in full after this

    _duration = field_validator("reservation_ttl", mode="before")(lambda cls, v: parse_duration(v))
