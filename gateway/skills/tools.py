"""`skill_read` (progressive disclosure: a skill's SKILL.md, then its references/, on demand) and
`skill_write` (an interactive session drafts a new skill; the owner approves each one).

What `skill_read` returns is a tool result: material the skill's author wrote, never the
owner's words (memory saves from a turn that read it ask first, gateway/memory/provenance.py).
Nothing in a skill runs by itself: its scripts run only when the model calls the shell with
them, which meets the sandbox and the approval rules like any command.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gateway.skills.catalog import SkillCatalog
from gateway.skills.door import ASSETS, inspect_bytes
from gateway.skills.folder import NAME, SKILL_FILE, SkillFormatError, digest_of, manifest, parse_skill_md
from gateway.tools.registry import ToolContext, ToolError, ToolSpec, build_spec

WRITE_NEEDS_OWNER = "a new skill is kept and offered to later sessions: its owner approves each draft"
NOT_SCHEDULED = "Scheduled sessions cannot write skills; ask for it in a chat, where the owner can approve it."
STANDING_NOT_ENOUGH = (
    "skill_write needs the owner's approval of this very draft, and a standing approval does not give it; "
    "nothing was written. Call it again to ask."
)
_DRAFT_FOLDERS = ("references/", "scripts/")


class SkillTools:
    def __init__(self, catalog: SkillCatalog):
        self.catalog = catalog

    async def skill_read(self, ctx: ToolContext, name: str, file: str = SKILL_FILE, offset: int = 0) -> str:
        """Load a skill's instructions (its SKILL.md), or one of the files under its references/ that they name.

        Args:
            name: the skill's name, as listed in the system prompt
            file: SKILL.md (the default) or a path under references/, e.g. references/api.md
            offset: where to continue a long file (the previous result says)
        """
        try:
            allowed = self.catalog.allowed(ctx.person, f"{ctx.thread.channel}:{ctx.thread.chat}")
            return await self.catalog.read(name, file, allowed, offset=offset)
        except LookupError as exc:
            raise ToolError(str(exc)) from None

    async def skill_write(
        self,
        ctx: ToolContext,
        name: str,
        description: str,
        instructions: str,
        files: dict[str, str] | None = None,
    ) -> str:
        """Draft a new skill (instructions for a kind of task); once the owner approves it, later sessions get it.

        Args:
            name: 1-64 lowercase letters, digits and single hyphens, e.g. weekly-report
            description: one sentence: what the skill does and when to use it
            instructions: the body of its SKILL.md (Markdown)
            files: optional text files by path under references/ or scripts/, e.g. {"references/steps.md": "..."}
        """
        if not ctx.interactive:
            raise ToolError(NOT_SCHEDULED)
        if ctx.approved_by in ("", "bypass"):
            raise ToolError(STANDING_NOT_ENOUGH)
        directories = self.catalog.dirs
        if not directories:
            raise ToolError("No skills directory is configured (skills.dirs); the owner sets one to keep skills.")
        document = _skill_md(name, description, instructions)
        try:
            parse_skill_md(document)
        except SkillFormatError as exc:
            raise ToolError(f"Not written: {str(exc).removeprefix(SKILL_FILE + ': ')}") from None
        contents = {SKILL_FILE: document, **_checked_files(files or {})}
        findings = [f for rel, text in contents.items() for f in inspect_bytes(rel, text.encode())]
        if findings:
            lines = "\n".join(f"- {f}" for f in findings)
            raise ToolError(f"Not written: the skill has what the skills door refuses:\n{lines}")
        if await self.catalog.store.skills.get(name) is not None:
            raise ToolError(f"A skill named {name!r} exists already; choose another name.")
        folder = directories[0] / name
        if folder.exists():
            raise ToolError(f"{folder.name} exists already in the skills directory; choose another name.")
        _write(folder, contents)
        files_now = manifest(folder)
        await self.catalog.store.skills.pin(
            name, origin="agent", path=str(folder), files=files_now, digest=digest_of(files_now),
            approved_by=ctx.approved_by,
        )
        return f"Skill {name!r} written and pinned ({len(files_now)} files); later turns are offered it."

    async def write_needs_owner(self, session_id: int, requested_by: str) -> str:
        """Every call asks, even where a rule allows skill_write (`ToolSpec.needs_approval_in`)."""
        return WRITE_NEEDS_OWNER


def _skill_md(name: str, description: str, instructions: str) -> str:
    front = yaml.safe_dump({"name": name, "description": " ".join(description.split())}, sort_keys=False)
    return f"---\n{front}---\n\n{instructions.strip()}\n"


def _checked_files(files: Mapping[str, Any]) -> dict[str, str]:
    checked: dict[str, str] = {}
    for rel, text in files.items():
        parts = Path(rel).parts
        if (
            not rel.startswith(_DRAFT_FOLDERS)
            or rel.startswith(ASSETS)
            or any(p in ("..", ".", "") for p in parts)
            or "\\" in rel
            or len(parts) < 2
        ):
            raise ToolError(f"Not written: {rel!r} is not a path under references/ or scripts/.")
        if not isinstance(text, str):
            raise ToolError(f"Not written: the content of {rel!r} must be text.")
        checked[rel] = text
    return checked


def _write(folder: Path, contents: dict[str, str]) -> None:
    folder.mkdir(parents=True)
    for rel, text in contents.items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)  # a fresh folder: no link on the way
        target.write_text(text, encoding="utf-8")


def skill_specs(catalog: SkillCatalog, *, write: bool) -> list[ToolSpec]:
    tools = SkillTools(catalog)
    specs = [build_spec(tools.skill_read, classes={"fs_read"})]
    if write:
        specs.append(
            build_spec(
                tools.skill_write,
                side_effects=True,
                classes={"fs_write", "interactive_only"},
                needs_approval_in=tools.write_needs_owner,
            )
        )
    return specs


__all__ = ["NAME", "SkillTools", "skill_specs"]
