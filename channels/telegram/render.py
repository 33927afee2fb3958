"""The model's Markdown -> Telegram text with message entities.

We render to plain text plus entities (no `parse_mode`): nothing needs escaping, the
4,096 limit is measured on exactly the text Telegram counts, and a long reply can be cut
anywhere by clipping entities, so every chunk is self-contained.

Offsets here are Python string indices; `utf16_entities` converts them to the UTF-16
code units Telegram expects, at the edge.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import TYPE_CHECKING, Literal

from channels.markdown import (
    aligned_table,
    blocks,
    code_text,
    fence_language,
    list_numbers,
    parse,
    parse_inline,
    plain_inline,
    sections,
    table_rows,
)

if TYPE_CHECKING:
    from channels.markdown import Details, Node

EntityType = Literal[
    "bold", "italic", "underline", "strikethrough", "code", "pre", "text_link", "blockquote", "expandable_blockquote"
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


# --- the syntax tree -> text + entities ---------------------------------------------------

_LINK_SCHEMES = ("http://", "https://", "tg://", "mailto:")
_STYLES: dict[str, EntityType] = {"strong": "bold", "em": "italic", "s": "strikethrough"}
_LISTS = ("bullet_list", "ordered_list")
RULE = "──────────"


def render_markdown(markdown: str) -> Rendered:
    """The model's Markdown (CommonMark) as Telegram text + entities; blocks keep the source's
    line structure (a blank line between two blocks where it had one)."""
    out = TextBuilder()
    _document(out, markdown, quoted=False)
    return _strip(out.build())


def _document(out: TextBuilder, markdown: str, quoted: bool) -> None:
    """Markdown with its collapsible sections (`channels.markdown.sections`)."""
    for n, part in enumerate(sections(markdown)):
        out.text("\n\n" if n else "")
        if isinstance(part, str):
            _blocks(out, parse(part), depth=0, quoted=quoted)
        else:
            _details(out, part, quoted)


def _details(out: TextBuilder, details: Details, quoted: bool) -> None:
    """The summary in bold over the body in an expandable quotation (Bot API 7.4), collapsed
    until tapped; a quote open from the start for `<details open>`. Inside a quote, where
    quotes do not nest, the body is part of it."""
    out.wrap("bold", lambda: _inline(out, parse_inline(details.summary)))
    if not details.body.strip():
        return
    out.text("\n")
    if quoted:
        _document(out, details.body, quoted)
    else:
        kind: EntityType = "blockquote" if details.open else "expandable_blockquote"
        out.wrap(kind, lambda: _document(out, details.body, True))


def _blocks(out: TextBuilder, container: Node, depth: int, quoted: bool) -> None:
    for gap, node in blocks(container):
        out.text(gap)
        _block(out, node, depth, quoted)


def _block(out: TextBuilder, node: Node, depth: int, quoted: bool) -> None:
    kind = node.type
    if kind == "paragraph":
        _inline(out, node.children[0])
    elif kind == "heading":
        out.wrap("bold", lambda: _inline(out, node.children[0]))
    elif kind in _LISTS:
        _list(out, node, depth, quoted)
    elif kind == "blockquote":
        if quoted:  # Telegram's quotes do not nest: an inner quote is part of the outer one
            _blocks(out, node, depth, quoted)
        else:
            out.wrap("blockquote", lambda: _blocks(out, node, depth, True))
    elif kind in ("fence", "code_block"):
        language = fence_language(node) if kind == "fence" else ""
        out.styled("pre", code_text(node) or " ", language=language)
    elif kind == "hr":
        out.text(RULE)
    elif kind == "table":
        # Telegram has no tables: a monospaced block with aligned columns reads best.
        rows = table_rows(node, lambda cell: plain_inline(cell, urls=False))
        out.styled("pre", "\n".join(aligned_table(rows)))
    elif node.children:
        _blocks(out, node, depth, quoted)
    else:
        out.text(node.content.rstrip("\n"))


def _list(out: TextBuilder, node: Node, depth: int, quoted: bool) -> None:
    numbers = list_numbers(node) if node.type == "ordered_list" else None
    for gap, item in blocks(node):
        out.text(gap)
        marker = f"{next(numbers)}{node.markup}" if numbers else ("•" if depth == 0 else "◦")
        out.text("  " * depth + marker + " ")
        for inner_gap, child in blocks(item):
            if child.type in _LISTS:
                out.text(inner_gap)
                _list(out, child, depth + 1, quoted)
            else:  # the first block on the marker's line, later ones indented under it
                out.text(inner_gap + ("  " * (depth + 1) if inner_gap else ""))
                _block(out, child, depth + 1, quoted)


def _inline(out: TextBuilder, node: Node, active: frozenset[str] = frozenset()) -> None:
    """Inline nodes into `out`; `active` holds the styles already applied around them (a style
    nested in itself, like `****a****`, is applied once)."""
    for child in node.children:
        _span(out, child, active)


def _span(out: TextBuilder, node: Node, active: frozenset[str]) -> None:
    kind = node.type
    if kind in ("text", "text_special"):
        out.text(node.content)
    elif kind in ("softbreak", "hardbreak"):
        out.text("\n")
    elif kind == "code_inline":
        out.styled("code", node.content)
    elif kind in _STYLES and kind not in active:
        out.wrap(_STYLES[kind], lambda: _inline(out, node, active | {kind}))
    elif kind in ("link", "image"):
        url = str(node.attrs.get("href" if kind == "link" else "src", ""))
        if url.lower().startswith(_LINK_SCHEMES):
            out.wrap("text_link", lambda: _inline(out, node, active), url=url)
        elif node.markup == "autolink":
            _inline(out, node, active)
        else:  # Telegram rejects relative or odd URLs: keep both visible instead
            _inline(out, node, active)
            out.text(f" ({url})")
    elif node.children:
        _inline(out, node, active)
    else:
        out.text(node.content)


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
