"""The settings of Agent Skills (gateway/skills/, docs/skills.md): where skill folders live and
how much of one `skill_read` returns. Which skills a role sees is `access.roles.<name>.skills`;
`chats` narrows what a chat is offered, whoever asks in it."""

from __future__ import annotations

from pydantic import Field

from gateway.config.base import Section


class SkillsConfig(Section):
    # directories of skill folders (each a folder with a SKILL.md), relative to the config file;
    # a skill in them is offered once `gateway skills add` pinned it; the first takes added and written skills
    dirs: list[str] = []
    read_max_chars: int = Field(20_000, ge=500)  # the most one skill_read returns (the rest: ask for a later part)
    # "<channel>:<chat id>" -> names or globs: a chat listed here is offered only these skills (and of
    # them only those the asking person's role lists); a chat not listed follows the roles alone
    chats: dict[str, list[str]] = {}
    write: bool = True  # offer skill_write to interactive sessions (each draft asks the owner)
