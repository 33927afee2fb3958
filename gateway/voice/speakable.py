"""The model's Markdown as text to be heard: code, tables and links are said to be in the
text rather than read out symbol by symbol, the marks of emphasis go, and an answer longer
than the limit is cut at the end of a sentence (the text answer always has all of it)."""

from __future__ import annotations

import re

CODE_NOTE = "(There is code here; it is in the text.)"
TABLE_NOTE = "(There is a table here; it is in the text.)"
CUT_NOTE = " The rest is in the text."

_FENCE = re.compile(r"^\s*(```|~~~)")
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_URL = re.compile(r"<?\bhttps?://[^\s>)]+>?")
_INLINE_CODE = re.compile(r"`([^`]+)`")
_EMPHASIS = re.compile(r"(\*\*|__|~~|\*|_)(?=\S)(.+?)(?<=\S)\1")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+")
_BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_QUOTE = re.compile(r"^\s*>\s?")
_RULE = re.compile(r"^\s*([-*_])(\s*\1){2,}\s*$")
_SPACES = re.compile(r"[ \t]+")
_SENTENCE_END = re.compile(r"[.!?…](?=\s|$)")


def speakable(markdown: str, max_chars: int) -> str:
    """What a voice note of `markdown` says: at most `max_chars` characters."""
    spoken = " ".join(line for line in _lines(markdown) if line)
    return _cut(_SPACES.sub(" ", spoken).strip(), max_chars)


def _lines(markdown: str) -> list[str]:
    lines: list[str] = []
    in_code = in_table = False
    for raw in markdown.splitlines():
        if _FENCE.match(raw):
            if not in_code:
                lines.append(CODE_NOTE)
            in_code = not in_code
            continue
        if in_code:
            continue
        if _TABLE_ROW.match(raw):
            if not in_table:
                lines.append(TABLE_NOTE)
            in_table = True
            continue
        in_table = False
        if _RULE.match(raw):
            continue
        lines.append(_sentence(_inline(raw)))
    return lines


def _inline(line: str) -> str:
    line = _HEADING.sub("", _QUOTE.sub("", _BULLET.sub("", line)))
    line = _IMAGE.sub(lambda m: m.group(1), line)
    line = _LINK.sub(lambda m: m.group(1), line)
    line = _URL.sub("a link", line)
    line = _INLINE_CODE.sub(lambda m: m.group(1), line)
    for _ in range(3):  # nested emphasis (***bold italic***)
        line = _EMPHASIS.sub(lambda m: m.group(2), line)
    return line.strip()


def _sentence(line: str) -> str:
    """A heading or a list item ends where it ends: heard as its own sentence."""
    if line and line[-1].isalnum():
        return line + "."
    return line


def _cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    room = max_chars - len(CUT_NOTE)
    ends = [m.end() for m in _SENTENCE_END.finditer(text, 0, room)]
    if ends and ends[-1] >= room // 3:  # a sentence end not too far back
        return text[: ends[-1]] + CUT_NOTE
    head = text[:room].rsplit(" ", 1)[0].rstrip(",;:")  # one long sentence: at a word
    return head + "…" + CUT_NOTE
