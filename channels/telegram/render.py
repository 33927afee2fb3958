"""The model's Markdown -> Telegram text with message entities.

We render to plain text plus entities (no `parse_mode`): nothing needs escaping, the
4,096 limit is measured on exactly the text Telegram counts, and a long reply can be cut
anywhere by clipping entities, so every chunk is self-contained.

Offsets here are Python string indices; `utf16_entities` converts them to the UTF-16
code units Telegram expects, at the edge.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Literal

EntityType = Literal[
    "bold", "italic", "underline", "strikethrough", "code", "pre", "text_link", "blockquote"
]


@dataclass(frozen=True)
class Entity:
    type: EntityType
    offset: int  # string index into Rendered.text
    length: int
    url: str = ""
    language: str = ""

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class Rendered:
    text: str
    entities: tuple[Entity, ...] = ()

    def __add__(self, other: Rendered) -> Rendered:
        shift = len(self.text)
        moved = tuple(replace(e, offset=e.offset + shift) for e in other.entities)
        return Rendered(self.text + other.text, self.entities + moved)


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def utf16_prefix(text: str) -> list[int]:
    """prefix[i] = UTF-16 length of text[:i]."""
    return [0, *accumulate(2 if ord(c) > 0xFFFF else 1 for c in text)]


def utf16_entities(rendered: Rendered) -> list[Entity]:
    """The entities with offsets and lengths in UTF-16 code units."""
    prefix = utf16_prefix(rendered.text)
    return [
        replace(e, offset=prefix[e.offset], length=prefix[e.end] - prefix[e.offset])
        for e in rendered.entities
    ]


class TextBuilder:
    """Appends text and records the entities that cover what was appended."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._pos = 0
        self._entities: list[Entity] = []

    @property
    def pos(self) -> int:
        return self._pos

    def text(self, value: str) -> None:
        self._parts.append(value)
        self._pos += len(value)

    def wrap(self, kind: EntityType, fill: Callable[[], None], url: str = "", language: str = "") -> None:
        start = self._pos
        fill()
        if self._pos > start:
            self._entities.append(Entity(kind, start, self._pos - start, url, language))

    def styled(self, kind: EntityType, value: str, language: str = "") -> None:
        self.wrap(kind, lambda: self.text(value), language=language)

    def build(self) -> Rendered:
        text = "".join(self._parts)
        entities = sorted(self._entities, key=lambda e: (e.offset, -e.length))
        return Rendered(text, tuple(entities))


# --- inline -------------------------------------------------------------------------

_INLINE: list[tuple[str, re.Pattern[str]]] = [
    ("escape", re.compile(r"\\([\\`*_{}\[\]()#+\-.!~|>])")),
    ("code", re.compile(r"(`+)([^`\n](?:.*?[^`])?)\1(?!`)")),
    ("link", re.compile(r"\[([^\]\n]+)\]\(([^()\s]+)\)")),
    ("bold", re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")),
    ("bold", re.compile(r"__(?=\S)(.+?)(?<=\S)__")),
    ("strikethrough", re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")),
    ("italic", re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])")),
    ("italic", re.compile(r"(?<![\w_])_(?=[^\s_])(.+?)(?<=[^\s_])_(?![\w_])")),
]
_LINK_SCHEMES = ("http://", "https://", "tg://", "mailto:")


def _next_match(text: str, pos: int) -> tuple[str, re.Match[str]] | None:
    best: tuple[str, re.Match[str]] | None = None
    for kind, pattern in _INLINE:
        found = pattern.search(text, pos)
        if found and (best is None or found.start() < best[1].start()):
            best = (kind, found)
    return best


def render_inline(out: TextBuilder, text: str) -> None:
    """Inline Markdown (code, links, bold, italic, strikethrough, escapes) into `out`."""
    pos = 0
    while pos < len(text):
        found = _next_match(text, pos)
        if found is None:
            break
        kind, match = found
        out.text(text[pos : match.start()])
        _render_span(out, kind, match)
        pos = match.end()
    out.text(text[pos:])


def _render_span(out: TextBuilder, kind: str, match: re.Match[str]) -> None:
    if kind == "escape":
        out.text(match.group(1))
    elif kind == "code":
        body = match.group(2)
        if len(body) > 2 and body.startswith(" ") and body.endswith(" "):
            body = body[1:-1]
        out.styled("code", body)
    elif kind == "link":
        label, url = match.group(1), match.group(2)
        if url.lower().startswith(_LINK_SCHEMES):
            out.wrap("text_link", lambda: render_inline(out, label), url=url)
        else:  # Telegram rejects relative or odd URLs: keep both visible instead
            render_inline(out, label)
            out.text(f" ({url})")
    else:
        out.wrap(kind, lambda: render_inline(out, match.group(1)))  # type: ignore[arg-type]


# --- blocks --------------------------------------------------------------------------

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*).*$")
_HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_RULE = re.compile(r"^ {0,3}([-*_])(\s*\1){2,}\s*$")
_QUOTE = re.compile(r"^ {0,3}>\s?(.*)$")
_ITEM = re.compile(r"^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$")
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def render_markdown(markdown: str) -> Rendered:
    """The model's Markdown as Telegram text + entities. Line structure is kept."""
    lines = markdown.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    out = TextBuilder()
    i, first = 0, True
    while i < len(lines):
        if not first:
            out.text("\n")
        first = False
        i = _render_block(out, lines, i)
    rendered = out.build()
    return _strip(rendered)


def _render_block(out: TextBuilder, lines: list[str], i: int) -> int:
    """Render the block starting at lines[i]; return the index after it."""
    line = lines[i]
    if fence := _FENCE.match(line):
        return _render_fence(out, lines, i, fence.group(1), fence.group(2))
    if _is_table(lines, i):
        return _render_table(out, lines, i)
    if heading := _HEADING.match(line):
        out.wrap("bold", lambda: render_inline(out, heading.group(1)))
    elif _RULE.match(line):
        out.text("──────────")
    elif _QUOTE.match(line):
        return _render_quote(out, lines, i)
    elif item := _ITEM.match(line):
        _render_item(out, item)
    else:
        render_inline(out, line)
    return i + 1


def _render_fence(out: TextBuilder, lines: list[str], i: int, marker: str, language: str) -> int:
    body: list[str] = []
    j = i + 1
    while j < len(lines) and not lines[j].strip().startswith(marker):
        body.append(lines[j])
        j += 1
    code = "\n".join(body) or " "
    out.styled("pre", code, language=language)
    return j + 1  # an unclosed fence (a reply still streaming) runs to the end


def _render_quote(out: TextBuilder, lines: list[str], i: int) -> int:
    quoted: list[str] = []
    while i < len(lines) and (match := _QUOTE.match(lines[i])):
        quoted.append(match.group(1))
        i += 1

    def fill() -> None:
        for n, text in enumerate(quoted):
            if n:
                out.text("\n")
            render_inline(out, text)

    out.wrap("blockquote", fill)
    return i


def _render_item(out: TextBuilder, item: re.Match[str]) -> None:
    depth = len(item.group(1).replace("\t", "  ")) // 2
    marker = item.group(2)
    bullet = ("•" if depth == 0 else "◦") if marker in "-*+" else marker
    out.text("  " * depth + bullet + " ")
    render_inline(out, item.group(3))


def _is_table(lines: list[str], i: int) -> bool:
    return "|" in lines[i] and i + 1 < len(lines) and "-" in lines[i + 1] and bool(
        _TABLE_SEP.match(lines[i + 1])
    )


def _cells(line: str) -> list[str]:
    line = line.strip()
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") else line
    return [_plain_inline(cell.strip()) for cell in line.split("|")]


def _plain_inline(text: str) -> str:
    cell = TextBuilder()
    render_inline(cell, text)
    return cell.build().text


def _render_table(out: TextBuilder, lines: list[str], i: int) -> int:
    """Telegram has no tables: a monospaced block with aligned columns reads best."""
    rows = [_cells(lines[i])]
    j = i + 2
    while j < len(lines) and "|" in lines[j] and lines[j].strip():
        rows.append(_cells(lines[j]))
        j += 1
    columns = max(len(r) for r in rows)
    rows = [r + [""] * (columns - len(r)) for r in rows]
    widths = [max(len(r[c]) for r in rows) for c in range(columns)]
    shown = [" | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)).rstrip() for r in rows]
    shown.insert(1, "-+-".join("-" * w for w in widths))
    out.styled("pre", "\n".join(shown))
    return j


def _strip(rendered: Rendered) -> Rendered:
    """Drop surrounding blank lines and trailing spaces (Telegram trims them anyway)."""
    text = rendered.text
    start = len(text) - len(text.lstrip("\n"))
    end = len(text.rstrip())
    return clip(rendered, start, max(start, end))


def clip(rendered: Rendered, start: int, end: int) -> Rendered:
    """text[start:end] with the entities cut to it (an entity cut in two stays closed)."""
    entities = []
    for e in rendered.entities:
        s, t = max(e.offset, start), min(e.end, end)
        if t > s:
            entities.append(replace(e, offset=s - start, length=t - s))
    return Rendered(rendered.text[start:end], tuple(entities))


def plain(text: str) -> Rendered:
    return Rendered(text)
