"""One skill folder on disk: its `SKILL.md` front matter, its files and their SHA-256.

The format is the open Agent Skills one (agentskills.io): a folder named like the skill with a
`SKILL.md` whose YAML front matter holds `name` (lowercase letters, digits and single hyphens, at
most 64) and `description` (at most 1024 characters), instructions below it, and optional
`scripts/`, `references/` and `assets/` folders. Everything else in it is read as it is.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

SKILL_FILE = "SKILL.md"
NAME = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?!-)){0,63}$")
MAX_DESCRIPTION = 1024
MAX_FILES = 500  # a skill is instructions and a few helpers, not a repository
MAX_FILE_BYTES = 5_000_000


class SkillFormatError(ValueError):
    """A folder that is not a readable skill; its message is one line with the fix."""


@dataclass(frozen=True)
class SkillMeta:
    name: str
    description: str
    body: str  # the instructions below the front matter


@dataclass(frozen=True)
class Change:
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def lines(self) -> list[str]:
        return (
            [f"  added    {path}" for path in self.added]
            + [f"  removed  {path}" for path in self.removed]
            + [f"  changed  {path}" for path in self.changed]
        )

    def summary(self) -> str:
        parts = [f"{len(v)} {k}" for k, v in (("added", self.added), ("removed", self.removed),
                                               ("changed", self.changed)) if v]
        return ", ".join(parts) or "unchanged"


def parse_skill_md(text: str, where: str = SKILL_FILE) -> SkillMeta:
    """The front matter's name and description, and the body. One-line errors with the fix."""
    if not text.startswith("---"):
        raise SkillFormatError(f"{where}: no front matter; start it with --- then name: and description:, then ---")
    _, _, rest = text.partition("\n")
    head, sep, body = rest.partition("\n---")
    if not sep:
        raise SkillFormatError(f"{where}: the front matter is not closed; end it with a line ---")
    try:
        front = yaml.safe_load(head) or {}
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", 0) + 2
        raise SkillFormatError(f"{where}:{line}: the front matter is not valid YAML; fix it") from None
    if not isinstance(front, dict):
        raise SkillFormatError(f"{where}: the front matter must be a mapping (name: ..., description: ...)")
    name, description = front.get("name"), front.get("description")
    if not isinstance(name, str) or not NAME.match(name):
        raise SkillFormatError(
            f"{where}: name {name!r} is not a skill name; use 1-64 lowercase letters, digits and single hyphens"
        )
    if not isinstance(description, str) or not description.strip():
        raise SkillFormatError(f"{where}: no description; say in one sentence what the skill does and when to use it")
    if len(description) > MAX_DESCRIPTION:
        raise SkillFormatError(f"{where}: the description is {len(description)} characters; keep it under 1024")
    return SkillMeta(name, " ".join(description.split()), body.partition("\n")[2])


def read_meta(folder: Path) -> SkillMeta:
    path = folder / SKILL_FILE
    if not path.is_file() or path.is_symlink():
        raise SkillFormatError(f"{folder}: no {SKILL_FILE}; a skill is a folder with a {SKILL_FILE} file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SkillFormatError(f"{path}: not UTF-8 text; save it as UTF-8") from None
    meta = parse_skill_md(text, str(path))
    return meta


def walk(folder: Path) -> list[str]:
    """Every entry of the folder (files and links, not directories) as sorted POSIX paths
    relative to it. Links are listed, never followed: a link is content the door judges."""
    found: list[str] = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        here = Path(root)
        for name in [*files, *(d for d in dirs if (here / d).is_symlink())]:
            found.append((here / name).relative_to(folder).as_posix())
            if len(found) > MAX_FILES:
                raise SkillFormatError(f"{folder}: more than {MAX_FILES} files; a skill is instructions and helpers")
        dirs[:] = [d for d in dirs if not (here / d).is_symlink()]
    return sorted(found)


def file_hash(path: Path) -> str:
    """SHA-256 of a file's bytes; of `link:<target>` for a link (never followed)."""
    if path.is_symlink():
        return hashlib.sha256(b"link:" + os.readlink(path).encode()).hexdigest()
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 16):
            digest.update(chunk)
    return digest.hexdigest()


def manifest(folder: Path) -> dict[str, str]:
    """Each file's SHA-256 by its relative path: what `gateway skills add` pins."""
    return {rel: file_hash(folder / rel) for rel in walk(folder)}


def digest_of(files: dict[str, str]) -> str:
    """One hash for a whole skill: of its sorted (path, hash) lines."""
    lines = "".join(f"{sha}  {path}\n" for path, sha in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def changes(pinned: dict[str, str], now: dict[str, str]) -> Change:
    return Change(
        added=tuple(sorted(set(now) - set(pinned))),
        removed=tuple(sorted(set(pinned) - set(now))),
        changed=tuple(sorted(p for p in set(now) & set(pinned) if now[p] != pinned[p])),
    )


def inside(folder: Path, relative: str) -> Path | None:
    """The file `relative` names in the folder, or None when it would leave it: an absolute path,
    `..`, or any link on the way (a link could point anywhere on the machine)."""
    if not relative or relative.startswith(("/", "\\")) or "\\" in relative or "\0" in relative:
        return None
    parts = Path(relative).parts
    if any(part in ("..", ".", "") for part in parts):
        return None
    path = folder
    for part in parts:
        path = path / part
        if path.is_symlink():
            return None
    try:
        real_root = folder.resolve(strict=True)
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if real_root not in real.parents or not real.is_file():
        return None
    return real
