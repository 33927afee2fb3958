"""Agent Skills (docs/skills.md): folders with a SKILL.md, pinned by the SHA-256 of every file,
refused at the door when they carry the known attacks, offered by name and description and read
on demand with `skill_read`."""

from gateway.skills.catalog import SkillCatalog, SkillState
from gateway.skills.door import Finding, inspect
from gateway.skills.folder import SkillFormatError, SkillMeta, changes, digest_of, manifest, read_meta
from gateway.skills.tools import skill_specs

__all__ = [
    "Finding",
    "SkillCatalog",
    "SkillFormatError",
    "SkillMeta",
    "SkillState",
    "changes",
    "digest_of",
    "inspect",
    "manifest",
    "read_meta",
    "skill_specs",
]
