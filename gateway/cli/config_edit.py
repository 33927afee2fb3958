"""Editing `config.yml` and `.env` in place, for `gateway setup`.

A set-up run changes a few keys and must leave everything else a person wrote (comments, order,
other keys, their own edits) as it was. PyYAML cannot write a file back with its comments, so
the edit is on the text: the key's line (and the lines of a block value under it) is replaced,
a missing key is added under its section, a missing section at the end. Then the result is read
back and must equal the original with exactly those keys changed; anything else (a layout this
editor does not understand) refuses the edit instead of guessing.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<rest>(\s.*)?)$")
_ENV_FORM = re.compile(r"^\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*):-(?P<default>.*)\}$")
_ENV_LINE = re.compile(r"^(?P<export>export\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*=")


class EditError(Exception):
    """The file cannot be edited safely; the message says what to set by hand."""


@dataclass(frozen=True)
class Change:
    """One change a run makes, as shown before it is written (secrets masked)."""

    file: str
    key: str
    old: str | None  # None: not set before
    new: str | None  # None: removed

    @property
    def replaces(self) -> bool:
        """It changes or removes something already there (a re-run asks before that)."""
        return self.old is not None

    def describe(self) -> str:
        if self.old is None:
            return f"  + {self.key}: {self.new}"
        if self.new is None:
            return f"  - {self.key} (was {self.old})"
        return f"  ~ {self.key}: {self.old} -> {self.new}"


def render(value: Any) -> str:
    """A value as YAML on one line (flow style), read back as the same value."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30, allow_unicode=True, sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def with_env_form(old: Any, new: str) -> str:
    """Keep a `${VAR:-default}` setting in that form, its default replaced: the variable the
    person (or the README) relies on still overrides it."""
    match = _ENV_FORM.match(old) if isinstance(old, str) else None
    return f"${{{match['name']}:-{new}}}" if match else new


def env_reference(old: Any) -> str | None:
    """The variable a `${VAR}` / `${VAR:-}` setting reads, if it is one."""
    if isinstance(old, str) and (match := re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-)?\}", old)):
        return match.group(1)
    return None


class YamlText:
    """`config.yml` as lines; `set(section, key, value)` edits one two-level key."""

    def __init__(self, text: str, name: str = "config.yml") -> None:
        self.name = name
        self.lines = text.splitlines()
        try:
            self.original = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise EditError(
                f"{name} is not valid YAML ({_where(exc)}): fix it, or move it away and run setup again"
            ) from exc
        if not isinstance(self.original, dict):
            raise EditError(f"{name}: the top level must be a mapping of sections")
        self._set: dict[tuple[str, str], Any] = {}

    def get(self, section: str, key: str) -> Any:
        node = self.original.get(section)
        return node.get(key) if isinstance(node, dict) else None

    def has(self, section: str, key: str) -> bool:
        node = self.original.get(section)
        return isinstance(node, dict) and key in node

    def set(self, section: str, key: str, value: Any) -> None:
        self._set[(section, key)] = value
        span = self._section(section)
        if span is None:
            if self.lines and self.lines[-1].strip():
                self.lines.append("")
            self.lines += [f"{section}:", f"  {key}: {render(value)}"]
            return
        start, end = span
        indent = self._child_indent(start, end)
        found = next((i for i in range(start + 1, end) if _key_at(self.lines[i], indent) == key), None)
        if found is None:  # after the section's last indented line (its comments stay with it)
            last = max((i for i in range(start + 1, end) if self.lines[i][:1].isspace()), default=start)
            self.lines.insert(last + 1, f"{' ' * indent}{key}: {render(value)}")
            return
        last = self._value_end(found, end, indent)
        self.lines[found : last + 1] = [_replace_value(self.lines[found], indent, key, render(value))]

    def text(self) -> str:
        """The edited text, checked: read back it is the original with exactly the set keys changed."""
        text = "\n".join(self.lines) + "\n"
        expected = copy.deepcopy(self.original)
        for (section, key), value in self._set.items():
            if not isinstance(expected.get(section), dict):
                expected[section] = {}
            expected[section][key] = value
        try:
            edited = yaml.safe_load(text)
        except yaml.YAMLError:
            edited = None
        if edited != expected:
            keys = ", ".join(f"{s}.{k}: {render(v)}" for (s, k), v in self._set.items())
            raise EditError(
                f"{self.name}: its layout is not one setup can edit in place; nothing was written. "
                f"Set these by hand: {keys}"
            )
        return text

    # ---- where things are ------------------------------------------------------------------
    def _section(self, section: str) -> tuple[int, int] | None:
        """The lines of a top-level `section:` (its header, and the index past its last line)."""
        for i, line in enumerate(self.lines):
            match = _KEY.match(line)
            if not match or match["indent"] or match["key"] != section:
                continue
            value, comment = split_comment(match["rest"])
            if value.strip() not in ("", "{}", "null", "~"):
                raise EditError(
                    f"{self.name}: {section} is written on one line; write it as a block "
                    f"({section}: then its keys indented below) and run setup again"
                )
            self.lines[i] = f"{section}:{comment}"
            end = i + 1
            while end < len(self.lines) and not _top_level(self.lines[end]):
                end += 1
            return i, end
        return None

    def _child_indent(self, start: int, end: int) -> int:
        for line in self.lines[start + 1 : end]:
            if line.strip() and not line.lstrip().startswith("#"):
                return len(line) - len(line.lstrip(" "))
        return 2

    def _value_end(self, found: int, end: int, indent: int) -> int:
        """The last line of the key's value: the key's own line, or the last line of a block
        value (deeper lines, or `- ` items at the key's indent) under it."""
        value, _ = split_comment(_KEY.match(self.lines[found])["rest"])  # type: ignore[index]
        value = value.strip()
        if value and value[0] not in "|>" and _balanced(value):
            return found
        last = found
        for i in range(found + 1, end):
            line = self.lines[i]
            stripped = line.lstrip(" ")
            if not stripped or stripped.startswith("#"):
                continue
            depth = len(line) - len(stripped)
            if depth > indent or (depth == indent and stripped.startswith("- ") and not value):
                last = i
                continue
            break
        return last


class DotEnv:
    """`.env` as lines: KEY=VALUE, comments and order kept."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()

    def values(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for line in self.lines:
            stripped = line.strip()
            if not stripped or stripped.startswith("#") or "=" not in stripped:
                continue
            name, _, value = stripped.removeprefix("export ").partition("=")
            found.setdefault(name.strip(), _unquote(value.strip()))  # the first wins, as read_dotenv
        return found

    def set(self, name: str, value: str) -> None:
        if "\n" in value or "\r" in value:
            raise EditError(f"{name}: a value on more than one line cannot go in .env")
        line = f"{name}={_quote(value)}"
        for i, old in enumerate(self.lines):
            if (match := _ENV_LINE.match(old.strip())) and match["name"] == name:
                self.lines[i] = (match["export"] or "") + line
                return
        self.lines.append(line)

    def remove(self, name: str) -> None:
        self.lines = [line for line in self.lines if not ((m := _ENV_LINE.match(line.strip())) and m["name"] == name)]

    def text(self) -> str:
        return "\n".join(self.lines) + "\n" if self.lines else ""


def write_file(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write through a temporary file beside it and rename (never half a file); `mode` 0600 for
    `.env`, else an existing file keeps its own."""
    target = path.resolve() if path.is_symlink() else path
    if mode is None:
        mode = target.stat().st_mode & 0o777 if target.exists() else 0o600
    temporary = target.with_name(f".{target.name}.setup")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, mode)
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, target)


def split_comment(rest: str) -> tuple[str, str]:
    """`' value   # why'` -> (`' value'`, `'   # why'`): a `#` inside quotes is the value's."""
    quote = ""
    i = 0
    while i < len(rest):
        char = rest[i]
        if quote:
            if char == "\\" and quote == '"':
                i += 1
            elif char == quote:
                quote = ""
        elif char in "'\"" and (i == 0 or rest[i - 1] in " \t[{,:"):
            quote = char
        elif char == "#" and (i == 0 or rest[i - 1] in " \t"):
            cut = len(rest[:i].rstrip(" \t"))
            return rest[:cut], rest[cut:]
        i += 1
    return rest, ""


def _replace_value(line: str, indent: int, key: str, value: str) -> str:
    """The key's line with the new value; a comment beside it keeps its column."""
    match = _KEY.match(line)
    old_value, comment = split_comment(match["rest"]) if match else ("", "")
    new = f"{' ' * indent}{key}: {value}"
    if not comment:
        return new
    column = indent + len(key) + 1 + len(old_value) + (len(comment) - len(comment.lstrip()))
    return new + " " * max(1, column - len(new)) + comment.lstrip()


def _key_at(line: str, indent: int) -> str | None:
    match = _KEY.match(line)
    return match["key"] if match and len(match["indent"]) == indent else None


def _top_level(line: str) -> bool:
    """A line that ends a section: text at column 0 that is not a comment."""
    return bool(line) and not line[0].isspace() and not line.startswith("#")


def _balanced(value: str) -> bool:
    plain = re.sub(r"'[^']*'|\"(\\.|[^\"\\])*\"", "", value)
    return plain.count("[") == plain.count("]") and plain.count("{") == plain.count("}")


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f"line {mark.line + 1}" if mark is not None else str(exc).splitlines()[0]


def _quote(value: str) -> str:
    if value and not re.search(r"[\s#'\"\\$`]", value):
        return value
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise EditError("a value with both kinds of quotes cannot go in .env")


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value
