"""Text from people and the model shown to the people who decide: names that cannot format
the message they appear in, arguments whose invisible characters are visible.

Prompt texts are Markdown (each channel renders them): a display name such as
`[Approve](https://evil.example)` must read as itself, not as a link; a `\\u202e` (right-to-left
override) in an argument must not turn `txt.sh` into `hs.txt` on the decider's screen.
"""

from __future__ import annotations

import re
import unicodedata

_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~=>&])")
_SPACES = re.compile(r"\s+")
NAME_CHARS = 64


def _hidden(ch: str) -> bool:
    """Characters that change or hide what is around them: format (bidi controls, zero-width),
    controls other than newline and tab, line and paragraph separators, private use."""
    if ch in "\n\t":
        return False
    return unicodedata.category(ch) in ("Cf", "Cc", "Co", "Cs", "Zl", "Zp")


def escape_invisible(text: str) -> str:
    """Each hidden character as its `\\uXXXX` escape, so the decider sees it is there."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(f"\\u{ord(ch):04x}" if _hidden(ch) and ord(ch) <= 0xFFFF else
                   (f"\\U{ord(ch):08x}" if _hidden(ch) else ch) for ch in text)


def escape_markdown(text: str) -> str:
    """Text that renders as itself in a Markdown message (backslash escapes: CommonMark)."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", text)


def name_shown(name: str, limit: int = NAME_CHARS, *, markdown: bool = True) -> str:
    """A display name (a person's, a chat's) inside a prompt: one line, at most `limit`
    characters, hidden characters escaped, Markdown escaped (unless for the terminal)."""
    text = escape_invisible(_SPACES.sub(" ", name).strip())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return escape_markdown(text) if markdown else text


def head_and_tail(text: str, limit: int) -> tuple[str, int]:
    """`text` cut to about `limit` characters keeping its head and its tail (what a long
    argument hides at its end is what a decider must see), and how many were left out."""
    if len(text) <= limit:
        return text, 0
    keep = max(limit - 40, 2)
    head, tail = text[: keep * 2 // 3], text[len(text) - keep // 3 :]
    omitted = len(text) - len(head) - len(tail)
    return f"{head}\n… {omitted} characters not shown …\n{tail}", omitted


_FORMATTING = re.compile(r"[\\`*_\[\]<>~|]")  # no brackets, so no link; parentheses are plain text


def plain_name(name: str, limit: int = NAME_CHARS) -> str:
    """A display name inside an outcome line, which some channels show as plain text and others
    render: one line, hidden characters escaped, and no characters that could format it."""
    return _FORMATTING.sub("", name_shown(name, limit, markdown=False))
