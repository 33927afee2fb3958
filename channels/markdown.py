"""The model's Markdown parsed for the channels' renderers: markdown-it-py, CommonMark.

CommonMark (linear time) plus the two GitHub extensions models use: tables and ~~strike~~.
Raw HTML is not recognised (it is shown as the text it is: no channel renders HTML), except for
the one construct models write for a collapsible section, `<details><summary>…</summary>…
</details>` on lines of its own, which `sections` takes apart for the renderers. The
renderers walk the syntax tree; what they share lives here: the gap between two blocks (a
blank line where the source had one, so the reply keeps its line structure), list numbers,
and the layout of a table as aligned monospaced columns.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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


# --- collapsible sections ---------------------------------------------------------------------

_DETAILS_START = re.compile(r"^ {0,3}<details(\s+open)?\s*>(.*)$", re.IGNORECASE)
_DETAILS_END = re.compile(r"</details\s*>", re.IGNORECASE)
_SUMMARY = re.compile(r"^\s*<summary>(.*?)</summary>(.*)$", re.IGNORECASE | re.DOTALL)
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
DETAILS_LINE = re.compile(r"^ {0,3}<details(\s+open)?\s*>", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Details:
    """A collapsible section: its summary (inline Markdown) and its body (Markdown)."""

    summary: str
    body: str
    open: bool = False


def sections(markdown: str) -> list[str | Details]:
    """The Markdown in order, with each `<details>` section (starting a line outside a code
    block, with a `<summary>`, closed by `</details>`) apart. One left open, or without a
    summary, stays text: it is shown as written rather than guessed at."""
    if "<details" not in markdown.lower():  # every streamed update is rendered: the common case is one test
        return [markdown] if markdown.strip() else []
    lines = markdown.split("\n")
    parts: list[str | Details] = []
    text: list[str] = []
    fence = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        opened = None if fence else _DETAILS_START.match(line)
        found = _section_at(lines, i, opened) if opened else None
        if found is None:
            fence = _fence_after(line, fence)
            text.append(line)
            i += 1
            continue
        details, i = found
        if text:
            parts.append("\n".join(text))
            text = []
        parts.append(details)
    if text:
        parts.append("\n".join(text))
    return [p for p in parts if not isinstance(p, str) or p.strip()]


def _fence_after(line: str, fence: str) -> str:
    match = _FENCE.match(line)
    if match is None:
        return fence
    marker = match.group(1)
    if not fence:
        return marker
    return "" if marker[0] == fence[0] and len(marker) >= len(fence) else fence


def _section_at(lines: list[str], start: int, opened: re.Match[str]) -> tuple[Details, int] | None:
    """The section that opens at `lines[start]` and the index after its closing line."""
    rest = [opened.group(2), *lines[start + 1:]]
    depth, fence = 1, ""
    for n, line in enumerate(rest):
        if n and not fence and _DETAILS_START.match(line):
            depth += 1
        fence = _fence_after(line, fence) if n else fence
        if fence or not _DETAILS_END.search(line):
            continue
        depth -= len(_DETAILS_END.findall(line))
        if depth > 0:
            continue
        inner = "\n".join([*rest[:n], _DETAILS_END.split(line)[0]])
        summary = _SUMMARY.match(inner)
        if summary is None:
            return None
        details = Details(summary.group(1).strip(), summary.group(2).strip("\n"), bool(opened.group(1)))
        return details, start + n + 1
    return None


@functools.cache
def _html_parser() -> MarkdownIt:
    """CommonMark to HTML, an image shown as the link it is (a rich message's media are files
    uploaded with it, not URLs for Telegram to fetch)."""
    parser = _commonmark()

    def image(renderer: object, tokens: list, idx: int, options: object, env: object) -> str:
        token = tokens[idx]
        src = html.escape(str(token.attrs.get("src", "")))
        alt = html.escape(token.content or str(token.attrs.get("src", "")))
        return f'<a href="{src}">{alt}</a>'

    parser.add_render_rule("image", image)
    return parser


def rich_html(markdown: str) -> str:
    """The reply as HTML for a rich message (Telegram's html form): the Markdown rendered with
    raw HTML escaped, and only the collapsible sections made `<details>` here."""
    parser = _html_parser()
    out = []
    for part in sections(markdown):
        if isinstance(part, str):
            out.append(parser.render(part))
            continue
        opened = " open" if part.open else ""
        summary = parser.renderInline(part.summary)
        out.append(f"<details{opened}><summary>{summary}</summary>{rich_html(part.body)}</details>")
    return "".join(out) or html.escape(markdown)
