"""Markdown (as the model writes it) -> Slack mrkdwn, and splitting under Slack's limits.

Slack treats `&`, `<` and `>` as control characters everywhere (also inside code), so every
piece of text is escaped; the only raw `<…>` left are the links and mentions built here and
the only raw `>` at a line start is a block quote. Fenced code lines are exactly ``` so the
splitter can close a block at a chunk end and reopen it in the next chunk.
"""

from __future__ import annotations

import re

# Section text and chat.postMessage text are kept at 3,000 characters (Block Kit section
# limit); Slack truncates message text only at 40,000, so this is the safe common bound.
SAFE_CHUNK = 3000
FENCE = "```"
_ZWSP = "\u200b"
_FENCE_ROOM = len(FENCE) * 2 + 2  # a reopened fence line plus the closing one

_FENCE_OPEN = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_RULE = re.compile(r"^\s{0,3}([-*_])(?:\s*\1){2,}\s*$")
_QUOTE = re.compile(r"^\s{0,3}>\s?(.*)$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_ORDERED = re.compile(r"^(\s*)(\d{1,9})[.)]\s+(.*)$")
_TASK = re.compile(r"^\[([ xX])\]\s+(.*)$")
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
_INLINE = re.compile(
    r"(?P<code>`+)(?P<code_body>.+?)(?P=code)"
    r"|\[(?P<link_text>[^\]\n]+)\]\((?P<link_url>[^()\s]+)(?:\s+\"[^\"]*\")?\)"
    r"|<(?P<auto>(?:https?|mailto):[^>\s]+)>"
    r"|<(?P<mention>[@#][A-Z0-9]+)(?:\|(?P<mention_label>[^<>\n]*))?>"
    r"|(?P<url>https?://[^\s<>]+)"
    r"|(?P<bold>\*\*|__)(?P<bold_body>(?=\S).+?(?<=\S))(?P=bold)"
    r"|~~(?P<strike>(?=\S).+?(?<=\S))~~"
    r"|(?<![\w*])\*(?P<star>(?=[^\s*]).*?(?<=[^\s*]))\*(?![\w*])"
    r"|(?<![\w_])_(?P<under>(?=[^\s_]).*?(?<=[^\s_]))_(?![\w_])"
)
_SAFE_URL = re.compile(r"^(?:https?|mailto):", re.IGNORECASE)
_STRONG = re.compile(r"(\*\*|__)(.+?)\1")


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
    out: list[str] = []
    pos = 0
    while True:
        match = _INLINE.search(text, pos)
        if match is None:
            out.append(escape(text[pos:]))
            return "".join(out)
        out.append(escape(text[pos : match.start()]))
        out.append(_convert(match))
        pos = match.end()


def _convert(match: re.Match[str]) -> str:
    group = match.groupdict()
    if group["code"] is not None:
        body = group["code_body"].strip() or group["code_body"]
        return "`" + escape(body.replace("`", "\u02cb")) + "`"
    if group["link_text"] is not None:
        return _link(group["link_text"], group["link_url"])
    if group["auto"] is not None:
        safe = _safe_url(group["auto"])
        return f"<{safe}>" if safe else escape(match.group(0))
    if group["mention"] is not None:
        label = group["mention_label"]
        return f"<{group['mention']}|{escape(label)}>" if label else f"<{group['mention']}>"
    if group["url"] is not None:
        return escape(group["url"])
    if group["bold"] is not None:
        return "*" + render_inline(group["bold_body"]) + "*"
    if group["strike"] is not None:
        return "~" + render_inline(group["strike"]) + "~"
    body = group["star"] if group["star"] is not None else group["under"]
    return "_" + render_inline(body) + "_"


def _code_block(lines: list[str]) -> list[str]:
    body = [_neutralise_fences(escape(line)) for line in lines] or [" "]
    return [FENCE, *body, FENCE]


def _render_line(line: str) -> str:
    if heading := _HEADING.match(line):
        return "*" + render_inline(_STRONG.sub(r"\2", heading.group(2))) + "*"
    if _RULE.match(line):
        return "──────────"
    if quote := _QUOTE.match(line):
        return "> " + _render_line(quote.group(1))
    if bullet := _BULLET.match(line):
        indent = "    " * (len(bullet.group(1).expandtabs(4)) // 2)
        item = bullet.group(2)
        if task := _TASK.match(item):
            mark = "☐" if task.group(1) == " " else "☑"
            return f"{indent}{mark} {render_inline(task.group(2))}"
        return f"{indent}• {render_inline(item)}"
    if ordered := _ORDERED.match(line):
        indent = "    " * (len(ordered.group(1).expandtabs(4)) // 2)
        return f"{indent}{ordered.group(2)}. {render_inline(ordered.group(3))}"
    return render_inline(line)


def _table_cells(line: str) -> list[str]:
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    cells = re.split(r"(?<!\\)\|", line)
    return [_plain(cell.strip().replace("\\|", "|")) for cell in cells]


def _plain(cell: str) -> str:
    """Table cells go into a code block, where formatting markers would show literally."""
    cell = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r"\1 (\2)", cell)
    return re.sub(r"\*\*|__|~~|`", "", cell)


def _format_table(rows: list[list[str]]) -> list[str]:
    width = max(len(row) for row in rows)
    rows = [row + [""] * (width - len(row)) for row in rows]
    sizes = [max(len(row[i]) for row in rows) for i in range(width)]
    lines = [" | ".join(cell.ljust(sizes[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * size for size in sizes))
    return lines


def _is_table_start(lines: list[str], index: int) -> bool:
    if index + 1 >= len(lines) or "|" not in lines[index]:
        return False
    separator = lines[index + 1]
    return "-" in separator and "|" in separator and bool(_TABLE_SEP.match(separator))


def _take_fenced(lines: list[str], index: int, marker: str) -> tuple[list[str], int]:
    """The body of a fenced block opened at `index`, and the index after its closing fence."""
    body: list[str] = []
    index += 1
    closing = re.compile(r"^\s{0,3}" + re.escape(marker[0]) + "{" + str(len(marker)) + r",}\s*$")
    while index < len(lines):
        if closing.match(lines[index]):
            return body, index + 1
        body.append(lines[index])
        index += 1
    return body, index  # unterminated: the block runs to the end, as in CommonMark


def _take_table(lines: list[str], index: int) -> tuple[list[str], int]:
    rows = [_table_cells(lines[index])]
    index += 2  # header and separator
    while index < len(lines) and "|" in lines[index] and lines[index].strip():
        rows.append(_table_cells(lines[index]))
        index += 1
    return _code_block(_format_table(rows))[1:-1], index


def render_mrkdwn(markdown: str) -> str:
    """Block-level Markdown (fences, tables, headings, lists, quotes) -> mrkdwn."""
    lines = markdown.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if fence := _FENCE_OPEN.match(line):
            body, index = _take_fenced(lines, index, fence.group(1))
            out.extend(_code_block(body))
        elif _is_table_start(lines, index):
            table, index = _take_table(lines, index)
            out.extend([FENCE, *table, FENCE])
        else:
            out.append(_neutralise_fences(_render_line(line)))
            index += 1
    return "\n".join(out)


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
