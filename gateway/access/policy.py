"""Who someone is to the gateway, from the configuration alone: admin, a listed person, their
role, and what that role lets their turns do.

People are named `<channel>:<user id>` ("telegram:123456789", "slack:U012ABCDEF"). Admins are
`approvals.admins` and the people who claimed a channel that had none (gateway/access/claim.py:
kept in the database, handed in by `use_claimed` before each check that matters); `access.users`
gives others a role; everyone else is a "member". Roles
come from `access.roles` over two built-ins: `admin` (everything) and `member` (every tool,
no approving others' requests, no /new over someone else's session).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence

from gateway.access.notes import groups_by_chat_only
from gateway.config import Config, RoleConfig
from gateway.tools import ToolSpec, matches_any

log = logging.getLogger(__name__)

ADMIN, MEMBER = "admin", "member"
BUILTIN_ROLES: dict[str, RoleConfig] = {
    ADMIN: RoleConfig(
        tools=["*"], deny_tools=[], approve=True, compact=True, new_for_others=True, schedule=True, skills=["*"]
    ),
    MEMBER: RoleConfig(),
}
# Channels whose people are not strangers: the local terminal and the scheduler's sessions.
TRUSTED_CHANNELS = frozenset({"console", "cron", "tick"})
SCHEDULE_TOOL = "schedule"


def role_denial_text(tool: str, role: str) -> str:
    """The tool result when a person's role does not allow a tool (even if the model calls it)."""
    return f"Tool call denied: the role {role!r} may not use {tool!r}."


class AccessPolicy:
    def __init__(self, config: Config):
        self.config = config
        self.roles = {**BUILTIN_ROLES, **config.access.roles}
        for person, role in config.access.users.items():
            if role not in self.roles:
                log.error("access.users[%s]: unknown role %r; treated as %r", person, role, MEMBER)
        self._fixed_users = {
            "telegram": set(config.telegram.allowed_users),
            "slack": set(config.slack.allowed_users),
        }
        self._fixed_chats = {
            "telegram": set(config.telegram.allowed_chats),
            "slack": set(config.slack.allowed_channels),
        }
        self._groups_by_chat_only = groups_by_chat_only(config)
        self._claimed: dict[str, frozenset[str]] = {}
        self.admin_ids = AdminIds(self)  # `approvals.admins` with the claimed admins, where a mapping is read

    # ---- who ------------------------------------------------------------------------------
    def use_claimed(self, admins: Mapping[str, Iterable[str]]) -> None:
        """The admins claimed with a code, as the database has them now (a removal included)."""
        self._claimed = {channel: frozenset(str(user) for user in ids) for channel, ids in admins.items()}

    def is_admin(self, channel: str, user_id: str) -> bool:
        user = str(user_id)
        return user in _ids(self.config.approvals.admins, channel) or user in self._claimed.get(channel, ())

    def admins(self, channel: str) -> list[str]:
        return sorted(_ids(self.config.approvals.admins, channel) | self._claimed.get(channel, frozenset()))

    def admin_channels(self) -> list[str]:
        return sorted(channel for channel in {*self.config.approvals.admins, *self._claimed} if self.admins(channel))

    def role_name(self, channel: str, user_id: str) -> str:
        if self.is_admin(channel, user_id):
            return ADMIN
        named = self.config.access.users.get(f"{channel}:{user_id}")
        return named if named in self.roles else MEMBER

    def role(self, channel: str, user_id: str) -> RoleConfig:
        return self.roles[self.role_name(channel, user_id)]

    def listed(self, channel: str, user_id: str, username: str = "") -> bool:
        """Allowed by the configuration: an admin, a person in `access.users`, or in the
        channel's fixed `allowed_users` (ids, or Telegram @usernames)."""
        if self.is_admin(channel, user_id) or f"{channel}:{user_id}" in self.config.access.users:
            return True
        fixed = self._fixed_users.get(channel, set())
        return str(user_id) in fixed or (bool(username) and f"@{username.lower()}" in {u.lower() for u in fixed})

    def admitted_by_name(self, channel: str, user_id: str, username: str = "", *, private: bool) -> bool:
        """Let in for who they are: an admin anywhere; a listed person in a direct message, and in a
        group too unless `access.group_policy: allowlist` is written in the configuration (then
        the group must be listed or approved, as for everyone in it)."""
        if self.is_admin(channel, user_id):
            return True
        if not private and self._groups_by_chat_only:
            return False
        return self.listed(channel, user_id, username)

    def listed_chat(self, channel: str, chat: str) -> bool:
        return chat in self._fixed_chats.get(channel, set())

    # ---- what ------------------------------------------------------------------------------
    def tool_allowed(self, channel: str, user_id: str, tool: str) -> bool:
        """Whether this person's turns may use the tool (people of trusted channels and
        turns nobody started may use whatever the rules allow)."""
        if channel in TRUSTED_CHANNELS or not user_id:
            return True
        role = self.role(channel, user_id)
        if tool == SCHEDULE_TOOL and not role.schedule:
            return False
        return matches_any(tool, role.tools) and not matches_any(tool, role.deny_tools)

    def offered(self, specs: Iterable[ToolSpec], channel: str, user_id: str) -> list[ToolSpec]:
        return [spec for spec in specs if self.tool_allowed(channel, user_id, spec.name)]

    def may_decide(self, channel: str, user_id: str, *, requested_by: str, decided_by_rules: bool) -> bool:
        """The approval gate's rule (`decided_by_rules`, from approvals.may_decide) with roles on
        top: a role with `approve` decides for others; with `approvals.separate_requester` the
        person who asked never decides their own request."""
        user = str(user_id)
        if self.config.approvals.separate_requester and requested_by and user == str(requested_by):
            return False
        if decided_by_rules:
            return True
        return channel not in TRUSTED_CHANNELS and self.role(channel, user).approve

    def model_allowed(self, channel: str, user_id: str, name: str) -> bool:
        """Whether this person's turns may use the named model (`roles.*.models`): asked by /model
        and again by every turn (gateway/access/models.py)."""
        return channel in TRUSTED_CHANNELS or not user_id or matches_any(name, self.role(channel, user_id).models)

    def skill_allowed(self, channel: str, user_id: str, name: str) -> bool:
        """Whether this person's turns are offered the pinned skill (`roles.*.skills`, names or
        globs); the trusted channels and turns nobody started see every pinned skill."""
        return channel in TRUSTED_CHANNELS or not user_id or matches_any(name, self.role(channel, user_id).skills)

    def skill_allowed_for(self, person: str, name: str) -> bool:
        """`skill_allowed` for "<channel>:<user id>" ("" for nobody)."""
        channel, _, user = person.partition(":")
        return self.skill_allowed(channel, user, name)

    def may_compact(self, channel: str, user_id: str) -> bool:
        return channel in TRUSTED_CHANNELS or not user_id or self.role(channel, user_id).compact

    def may_start_over(self, channel: str, user_id: str, *, started_by: str) -> bool:
        """`/new` over a session someone else started needs `new_for_others`."""
        if channel in TRUSTED_CHANNELS or not started_by or str(started_by) == str(user_id):
            return True
        return self.role(channel, user_id).new_for_others


class AdminIds(Mapping[str, Sequence[str]]):
    """Every admin by channel, configured or claimed, read when used: shaped like
    `approvals.admins` for the code that takes that mapping."""

    def __init__(self, policy: AccessPolicy):
        self._policy = policy

    def __getitem__(self, channel: str) -> Sequence[str]:
        found = self._policy.admins(channel)
        if not found:
            raise KeyError(channel)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self._policy.admin_channels())

    def __len__(self) -> int:
        return len(self._policy.admin_channels())


def _ids(config: Mapping[str, Sequence[str | int]], channel: str) -> set[str]:
    return {str(item) for item in (config.get(channel) or ())}
