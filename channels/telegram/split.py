"""Cut rendered text into messages Telegram accepts.

Each chunk is at most `limit` UTF-16 code units and carries at most `max_entities`
entities (Telegram ignores the ones beyond 100). Cuts go, in order of preference, at a
paragraph break outside any entity, a line break outside any entity, a line break inside
one (a long code block becomes several closed blocks), a space, and only then anywhere.
"""

from __future__ import annotations

from bisect import bisect_right

from channels.telegram.render import Rendered, clip, utf16_prefix

MAX_MESSAGE_UTF16 = 4096
MAX_ENTITIES = 100


def split_rendered(
    rendered: Rendered, limit: int = MAX_MESSAGE_UTF16, max_entities: int = MAX_ENTITIES
) -> list[Rendered]:
    """Non-empty chunks, in order, that together hold all of `rendered`'s visible text."""
    text = rendered.text
    prefix = utf16_prefix(text)
    covered = _coverage(rendered)
    chunks: list[Rendered] = []
    start = 0
    while True:
        start = _skip_blank(text, start)
        if start >= len(text):
            return chunks
        end = _window_end(rendered, prefix, start, limit, max_entities)
        cut, resume = (end, end) if end >= len(text) else _best_cut(text, covered, start, end)
        chunk = clip(rendered, start, cut)
        chunk = clip(chunk, 0, len(chunk.text.rstrip()))
        if chunk.text:
            chunks.append(chunk)
        start = resume


def _skip_blank(text: str, start: int) -> int:
    while start < len(text) and text[start] == "\n":
        start += 1
    return start


def _coverage(rendered: Rendered) -> list[int]:
    """covered[p] > 0 when a cut before text[p] would fall inside an entity."""
    diff = [0] * (len(rendered.text) + 2)
    for e in rendered.entities:
        diff[e.offset + 1] += 1
        diff[e.end] -= 1
    covered, depth = [], 0
    for value in diff:
        depth += value
        covered.append(depth)
    return covered


def _window_end(rendered: Rendered, prefix: list[int], start: int, limit: int, max_entities: int) -> int:
    """The furthest end such that text[start:end] fits `limit` and `max_entities`."""
    end = bisect_right(prefix, prefix[start] + limit) - 1
    touching = [e for e in rendered.entities if e.end > start and e.offset < end]
    if len(touching) > max_entities:
        end = max(touching[max_entities].offset, start + 1)
    return max(end, start + 1)


def _best_cut(text: str, covered: list[int], start: int, end: int) -> tuple[int, int]:
    """(cut, resume): the chunk is text[start:cut]; the next one starts at resume."""
    floor = start + max(1, (end - start) // 4)  # don't leave a uselessly short chunk
    for needle, outside_only in (("\n\n", True), ("\n", True), ("\n", False), (" ", True), (" ", False)):
        cut = _last_separator(text, covered, needle, floor, end, outside_only)
        if cut is not None:
            return cut, cut + (1 if needle == " " else 0)
    return end, end


def _last_separator(
    text: str, covered: list[int], needle: str, floor: int, end: int, outside_only: bool
) -> int | None:
    position = text.rfind(needle, floor, end + 1)
    while position >= floor:
        if not outside_only or covered[position] == 0:
            return position
        position = text.rfind(needle, floor, position + len(needle) - 1)
    return None
