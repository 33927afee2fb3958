"""Markdown (as the model writes it) -> Slack mrkdwn, and splitting under Slack's limits.

Slack treats `&`, `<` and `>` as control characters everywhere (also inside code), so every
piece of text is escaped; the only raw `<…>` left are the links and mentions built here and
the only raw `>` at a line start is a block quote. Fenced code lines are exactly ``` so the
splitter can close a block at a chunk end and reopen it in the next chunk.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from channels.markdown import (
    aligned_table,
    blocks,
    code_text,
    list_numbers,
    parse,
    parse_inline,
    plain_inline,
    sections,
    table_rows,
)

if TYPE_CHECKING:
    from channels.markdown import Details, Node

# Section text and chat.postMessage text are kept at 3,000 characters (Block Kit section
# limit); Slack truncates message text only at 40,000, so this is the safe common bound.
SAFE_CHUNK = 3000
FENCE = "```"
_ZWSP = "\u200b"
_FENCE_ROOM = len(FENCE) * 2 + 2  # a reopened fence line plus the closing one

_SAFE_URL = re.compile(r"^(?:https?|mailto):", re.IGNORECASE)
_STYLES = {"strong": "*", "em": "_", "s": "~"}
_LISTS = ("bullet_list", "ordered_list")
_TASK = re.compile(r"^\[([ xX])\]\s+")
RULE = "──────────"


def escape(text: str) -> str:
    """Slack's three control characters as entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _neutralise_fences(line: str) -> str:
    # A ``` inside a line would open a code block Slack-side that the splitter cannot see.
    return line.replace(FENCE, "``" + _ZWSP + "`")


def _safe_url(url: str) -> str | None:
    if not _SAFE_URL.match(url):
        return None
    url = url.replace("&", "&amp;")
    return url.replace("<", "%3C").replace(">", "%3E").replace("|", "%7C")


def _link(text: str, url: str) -> str:
    safe = _safe_url(url)
    if safe is None:
        return f"{escape(text)} ({escape(url)})"
    return f"<{safe}|{escape(text)}>"


def render_inline(text: str) -> str:
    """Inline Markdown (code, links, bold, italic, strike) -> mrkdwn, escaping the rest."""
    return _neutralise_fences(_inline(parse_inline(text, slack=True)))


def _inline(node: Node, active: frozenset[str] = frozenset()) -> str:
    """Inline nodes as mrkdwn; `active` holds the styles already applied around them (a
    heading is bold all through; `****a****` is bold once)."""
    return "".join(_span(child, active) for child in node.children)


def _span(node: Node, active: frozenset[str]) -> str:
    kind = node.type
    if kind in ("text", "text_special"):
        return escape(node.content)
    if kind in ("softbreak", "hardbreak"):
        return "\n"
    if kind == "code_inline":
        body = node.content.strip() or node.content
        return "`" + escape(body.replace("`", "\u02cb")) + "`"
    if kind in _STYLES:
        if kind in active:
            return _inline(node, active)
        return _STYLES[kind] + _inline(node, active | {kind}) + _STYLES[kind]
    if kind == "link" and node.markup == "autolink" and plain_inline(node, urls=False) == node.attrs.get("href"):
        safe = _safe_url(str(node.attrs["href"]))
        return f"<{safe}>" if safe else escape(str(node.attrs["href"]))
    if kind in ("link", "image"):
        url = str(node.attrs.get("href" if kind == "link" else "src", ""))
        return _link(plain_inline(node, urls=False), url)
    if kind == "slack_mention":
        target, label = node.meta["target"], node.meta["label"]
        return f"<{target}|{escape(label)}>" if label else f"<{target}>"
    if node.children:
        return _inline(node, active)
    return escape(node.content)


def _code_block(lines: list[str]) -> list[str]:
    body = [_neutralise_fences(escape(line)) for line in lines] or [" "]
    return [FENCE, *body, FENCE]


def render_mrkdwn(markdown: str) -> str:
    """Markdown (CommonMark: fences, tables, headings, lists, quotes) -> mrkdwn; blocks keep the
    source's line structure (a blank line between two blocks where it had one). A collapsible
    section (`<details><summary>`: mrkdwn has none) is its summary in bold over its body quoted."""
    return "\n\n".join(
        "".join(_blocks(parse(part, slack=True), depth=0)) if isinstance(part, str) else _details(part)
        for part in sections(markdown)
    )


def _details(details: Details) -> str:
    summary = _neutralise_fences("*" + _inline(parse_inline(details.summary, slack=True), frozenset({"strong"})) + "*")
    body = render_mrkdwn(details.body)
    return f"{summary}\n{_quoted(body)}" if body.strip() else summary


def _quoted(text: str) -> str:
    return "\n".join("> " + line.replace(FENCE, "``" + _ZWSP + "`") for line in text.split("\n"))


def _blocks(container: Node, depth: int) -> list[str]:
    out: list[str] = []
    for gap, node in blocks(container):
        out.append(gap)
        out.append(_block(node, depth))
    return out


def _block(node: Node, depth: int) -> str:
    kind = node.type
    if kind == "paragraph":
        return _neutralise_fences(_inline(node.children[0]))
    if kind == "heading":
        return _neutralise_fences("*" + _inline(node.children[0], frozenset({"strong"})) + "*")
    if kind in _LISTS:
        return _list(node, depth)
    if kind == "blockquote":
        return _quoted("".join(_blocks(node, depth)))
    if kind in ("fence", "code_block"):
        return "\n".join(_code_block(code_text(node).split("\n") if code_text(node) else []))
    if kind == "hr":
        return RULE
    if kind == "table":
        rows = table_rows(node, lambda cell: plain_inline(cell, urls=True))
        return "\n".join(_code_block(aligned_table(rows)))
    if node.children:
        return "".join(_blocks(node, depth))
    return _neutralise_fences(escape(node.content.rstrip("\n")))


_QUOTE_MARKERS = re.compile(r"(?m)^(?:> )+")


def _list(node: Node, depth: int) -> str:
    numbers = list_numbers(node) if node.type == "ordered_list" else None
    indent = "    " * depth
    out: list[str] = []
    for gap, item in blocks(node):
        out.append(gap)
        marker = f"{next(numbers)}." if numbers else "•"
        for inner_gap, child in blocks(item):
            if child.type in _LISTS:
                out.append(inner_gap + _list(child, depth + 1))
                continue
            text = _block(child, depth + 1)
            if child.type == "blockquote":  # a quote marker counts only at a line start, never in a list
                text = _QUOTE_MARKERS.sub(lambda m: "&gt; " * (len(m.group(0)) // 2), text)
            if inner_gap:  # a later block of the item, under its first line
                out.append(inner_gap + "    " * (depth + 1) + text)
                continue
            if not numbers and child.type == "paragraph" and (task := _TASK.match(text)):
                marker, text = ("☐" if task.group(1) == " " else "☑"), text[task.end():]
            out.append(f"{indent}{marker} {text}")
        if not item.children:
            out.append(f"{indent}{marker} ")
    return "".join(out)


def _cut_point(line: str, width: int) -> int:
    """Where to cut a too-long line: at a space, never inside `<…>` or an `&…;` entity.
    0 means a link at the start is longer than the whole width."""
    cut = line.rfind(" ", width // 2, width + 1)
    if cut <= 0:
        cut = width
    opening = line.rfind("<", 0, cut)
    if opening >= 0 and line.rfind(">", opening, cut) == -1:
        cut = opening
    amp = line.rfind("&", max(0, cut - 5), cut)
    if amp > 0 and ";" not in line[amp:cut]:
        cut = amp
    return cut


_LEADING_CONSTRUCT = re.compile(r"<([^<>|]*)(?:\|([^<>]*))?>")


def _unlink_first(line: str) -> str:
    """A link too long for any chunk is shown as `text (url)` so it can be cut safely."""
    match = _LEADING_CONSTRUCT.match(line)
    if match is None:  # not one of ours; never leave a raw `<` behind
        return "&lt;" + line[1:]
    target, label = match.group(1), match.group(2)
    return (f"{label} ({target})" if label else target) + line[match.end():]


def _fit_line(line: str, width: int) -> list[str]:
    pieces: list[str] = []
    while len(line) > width:
        cut = _cut_point(line, width)
        if cut == 0:
            line = _unlink_first(line)
            continue
        pieces.append(line[:cut])
        line = line[cut:]
    pieces.append(line)
    return pieces


def split_mrkdwn(text: str, limit: int = SAFE_CHUNK) -> list[str]:
    """Chunks of at most `limit` characters; a code block cut at a chunk end is closed there
    and reopened at the start of the next chunk. Whitespace-only chunks are dropped."""
    if limit <= _FENCE_ROOM + 8:
        raise ValueError(f"limit {limit} is too small to split code blocks")
    chunks: list[str] = []
    current: list[str] = []
    length = 0
    in_code = False

    def flush() -> None:
        nonlocal current, length
        closing = in_code
        if in_code and current and current[-1] == FENCE:
            current.pop()  # an opening fence with nothing after it is reopened in the next chunk
            closing = False
        if current:
            chunks.append("\n".join(current) + ("\n" + FENCE if closing else ""))
        current = [FENCE] if in_code else []
        length = len("\n".join(current))

    for line in text.split("\n"):
        for piece in _fit_line(line, limit - _FENCE_ROOM):
            code_after = in_code != (piece == FENCE)
            added = length + (1 if current else 0) + len(piece)
            if current and added + (len(FENCE) + 1 if code_after else 0) > limit:
                flush()
                added = length + (1 if current else 0) + len(piece)
            current.append(piece)
            length = added
            in_code = code_after
    if current:
        chunks.append("\n".join(current) + ("\n" + FENCE if in_code else ""))
    return [chunk for chunk in chunks if chunk.strip() and chunk.strip() != FENCE + "\n" + FENCE]


def render_chunks(markdown: str, limit: int = SAFE_CHUNK) -> list[str]:
    """Markdown -> mrkdwn chunks ready to post, each within `limit` characters."""
    return split_mrkdwn(render_mrkdwn(markdown), limit)


def truncate_escaped(raw: str, budget: int) -> tuple[str, int]:
    """The longest prefix of `raw` whose escaped, fence-safe form fits `budget`, and how many
    characters of `raw` were left out."""
    out: list[str] = []
    used = 0
    kept = len(raw)
    for index, char in enumerate(raw):
        piece = escape(char)
        if used + len(piece) > budget:
            kept = index
            break
        out.append(piece)
        used += len(piece)
    text = _neutralise_fences("".join(out))
    if len(text) > budget:  # the fence guards added a few characters: take a little less
        return truncate_escaped(raw[:kept], 2 * budget - len(text))
    return text, len(raw) - kept
