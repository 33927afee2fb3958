"""The model's Markdown parsed for the channels' renderers: markdown-it-py, CommonMark.

CommonMark (linear time) plus the two GitHub extensions models use: tables and ~~strike~~.
Raw HTML is not recognised (it is shown as the text it is: no channel renders HTML). The
renderers walk the syntax tree; what they share lives here: the gap between two blocks (a
blank line where the source had one, so the reply keeps its line structure), list numbers,
and the layout of a table as aligned monospaced columns.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # markdown-it is imported with the first reply rendered, not at a start
    from markdown_it import MarkdownIt
    from markdown_it.rules_inline import StateInline
    from markdown_it.tree import SyntaxTreeNode as Node


def _commonmark() -> MarkdownIt:
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
    # Every link destination is a link here; each renderer decides which schemes it may show
    # as links (a `javascript:` one is shown as text with its URL, not dropped).
    parser.validateLink = lambda url: True  # type: ignore[method-assign]
    return parser


_SLACK_MENTION = re.compile(r"<([@#][A-Z0-9]+)(?:\|([^<>\n]*))?>")


def _slack_mention(state: StateInline, silent: bool) -> bool:
    """`<@U123>`, `<#C123|general>`: Slack's own mention syntax, kept as one token."""
    if state.src[state.pos] != "<":
        return False
    match = _SLACK_MENTION.match(state.src, state.pos)
    if match is None:
        return False
    if not silent:
        token = state.push("slack_mention", "", 0)
        token.meta = {"target": match.group(1), "label": match.group(2) or ""}
        token.content = match.group(0)
    state.pos = match.end()
    return True


@functools.cache
def _parser(slack: bool) -> tuple[MarkdownIt, type[Node]]:
    """The parser (Slack's knows its mention syntax) and the tree's node class, made once."""
    from markdown_it.tree import SyntaxTreeNode

    parser = _commonmark()
    if slack:
        parser.inline.ruler.before("autolink", "slack_mention", _slack_mention)
    return parser, SyntaxTreeNode


def parse(markdown: str, *, slack: bool = False) -> Node:
    """The document's syntax tree (block nodes under the root)."""
    parser, node = _parser(slack)
    return node(parser.parse(markdown))


def parse_inline(text: str, *, slack: bool = False) -> Node:
    """`text` as inline content only (no blocks: line starts like `#` or `-` stay text); the
    returned node is an `inline` node (newlines are soft breaks)."""
    parser, node = _parser(slack)
    root = node(parser.parseInline(text))
    return root.children[0] if root.children else root


def gap(previous: Node | None, node: Node) -> str:
    """What goes between two sibling blocks: nothing before the first, a blank line where the
    source had one, else a line break."""
    if previous is None:
        return ""
    before, after = previous.map, node.map
    return "\n\n" if before and after and after[0] > before[1] else "\n"


def blocks(node: Node) -> Iterator[tuple[str, Node]]:
    """The children of a block container, each with the gap that precedes it."""
    previous = None
    for child in node.children:
        yield gap(previous, child), child
        previous = child


def list_numbers(ordered: Node) -> Iterator[int]:
    """The numbers of an ordered list's items: CommonMark counts up from the first."""
    start = int(ordered.attrs.get("start", 1) or 1)
    return iter(range(start, start + len(ordered.children)))


def table_rows(table: Node, cell_text: Callable[[Node], str]) -> list[list[str]]:
    """A table's header and body rows, each cell as the text `cell_text` makes of its inline."""
    rows = []
    for section in table.children:  # thead, tbody
        for row in section.children:
            rows.append([cell_text(cell.children[0]) if cell.children else "" for cell in row.children])
    return rows


def aligned_table(rows: list[list[str]]) -> list[str]:
    """Rows as aligned columns with a rule under the header (chat apps have no tables, and a
    monospaced block reads best)."""
    columns = max(len(row) for row in rows)
    rows = [row + [""] * (columns - len(row)) for row in rows]
    widths = [max(len(row[c]) for row in rows) for c in range(columns)]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return lines


def fence_language(fence: Node) -> str:
    return fence.info.split()[0] if fence.info.strip() else ""


def code_text(block: Node) -> str:
    """A fenced or indented code block's text, without the final line break."""
    content = block.content
    return content[:-1] if content.endswith("\n") else content


def plain_inline(inline: Node, *, urls: bool) -> str:
    """Inline content as plain text (for table cells): markers dropped, a link's text kept
    (followed by its URL in parentheses when `urls`)."""
    parts: list[str] = []

    def walk(node: Node) -> None:
        kind = node.type
        if kind in ("text", "code_inline", "text_special", "html_inline"):
            parts.append(node.content)
        elif kind in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif kind == "slack_mention":
            parts.append(node.content)
        else:
            for child in node.children:
                walk(child)
            if kind == "link" and urls and node.markup != "autolink":
                parts.append(f" ({node.attrs.get('href', '')})")

    walk(inline)
    return "".join(parts)
