"""Markdown -> Telegram text + entities, and splitting into messages."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from channels.telegram.render import Rendered, render_markdown, utf16_entities, utf16_len
from channels.telegram.split import split_rendered


def spans(rendered: Rendered) -> list[tuple[str, str]]:
    return [(e.type, rendered.text[e.offset : e.end]) for e in rendered.entities]


def test_inline_markup_becomes_entities() -> None:
    r = render_markdown("Some **bold _and italic_** text, ~~gone~~, `x < y & z` and [docs](https://ex.org/a).")
    assert r.text == "Some bold and italic text, gone, x < y & z and docs."
    assert ("bold", "bold and italic") in spans(r)
    assert ("italic", "and italic") in spans(r)
    assert ("strikethrough", "gone") in spans(r)
    assert ("code", "x < y & z") in spans(r)
    link = next(e for e in r.entities if e.type == "text_link")
    assert (r.text[link.offset : link.end], link.url) == ("docs", "https://ex.org/a")


def test_block_markup() -> None:
    md = "# Plan\n\n- one\n  - nested\n2. two\n\n> quoted **word**\n> more\n\n```python\nprint('hi')\n```\n---"
    r = render_markdown(md)
    assert r.text.splitlines()[:5] == ["Plan", "", "• one", "  ◦ nested", "2. two"]
    assert ("bold", "Plan") in spans(r)
    assert ("blockquote", "quoted word\nmore") in spans(r)
    assert ("bold", "word") in spans(r)
    pre = next(e for e in r.entities if e.type == "pre")
    assert (r.text[pre.offset : pre.end], pre.language) == ("print('hi')", "python")
    assert "#" not in r.text and "```" not in r.text and "**" not in r.text


def test_table_becomes_an_aligned_monospaced_block() -> None:
    r = render_markdown("| name | n |\n|---|--:|\n| **alpha** | 1 |\n| b | 22 |")
    (pre,) = r.entities
    assert pre.type == "pre"
    assert r.text.splitlines() == ["name  | n", "------+---", "alpha | 1", "b     | 22"]


def test_literal_text_is_left_alone() -> None:
    r = render_markdown("snake_case_name and 2 * 3 * 4 and a_b, \\*not italic\\*, [rel](docs/x)")
    assert r.text == "snake_case_name and 2 * 3 * 4 and a_b, *not italic*, rel (docs/x)"
    assert r.entities == ()


def test_where_commonmark_differs_from_a_line_scanner() -> None:
    assert spans(render_markdown("2*3*4")) == [("italic", "3")]  # `*` between digits emphasises
    assert spans(render_markdown("Title\n---")) == [("bold", "Title")]  # a setext heading, not a rule
    assert spans(render_markdown("    indented")) == [("pre", "indented")]  # an indented code block
    assert render_markdown("1. a\n1. b\n1. c").text == "1. a\n2. b\n3. c"  # numbered from the first
    assert render_markdown("a\n\n\n\nb").text == "a\n\nb"  # blank lines between blocks count once
    r = render_markdown("<https://ex.org/a> and &amp; &lt;b&gt;")  # autolinks; entities decoded
    assert r.text == "https://ex.org/a and & <b>" and spans(r) == [("text_link", "https://ex.org/a")]


def test_unclosed_fence_while_streaming_is_code_to_the_end() -> None:
    r = render_markdown("Here:\n```sh\nls -la\necho hi")
    assert spans(r) == [("pre", "ls -la\necho hi")]


def test_utf16_offsets_count_astral_characters_twice() -> None:
    r = render_markdown("😀😀 **bold**")
    (bold,) = utf16_entities(r)
    assert (bold.offset, bold.length) == (5, 4)
    assert utf16_len(r.text) == 9


def test_paragraphs_are_kept_together_when_splitting() -> None:
    paragraphs = [f"Paragraph {n}: " + "word " * 30 for n in range(40)]
    chunks = split_rendered(render_markdown("\n\n".join(paragraphs)), limit=500)
    assert len(chunks) > 5
    for chunk in chunks:
        assert utf16_len(chunk.text) <= 500
        assert chunk.text.startswith("Paragraph ") and chunk.text.rstrip().endswith("word")


def test_long_code_block_becomes_several_closed_blocks() -> None:
    code = "\n".join(f"line {n:04d} = compute({n})" for n in range(600))
    chunks = split_rendered(render_markdown(f"Before\n\n```python\n{code}\n```\n\nAfter"))
    assert len(chunks) >= 4
    blocks = [e for c in chunks for e in c.entities if e.type == "pre"]
    assert len(blocks) >= 3 and {b.language for b in blocks} == {"python"}
    for chunk in chunks:
        assert utf16_len(chunk.text) <= 4096
        for line in chunk.text.splitlines():  # cut between lines, not inside them
            assert line in ("Before", "After", "") or re.fullmatch(r"line \d{4} = compute\(\d+\)", line)


def test_entity_count_per_message_is_bounded() -> None:
    chunks = split_rendered(render_markdown(" ".join(f"**b{n}**" for n in range(250))), max_entities=100)
    assert len(chunks) >= 3
    assert all(len(c.entities) <= 100 for c in chunks)
    assert sum(len(c.entities) for c in chunks) == 250


def test_nothing_to_send_gives_no_chunks() -> None:
    assert split_rendered(render_markdown("  \n\n \n")) == []


# --- property: any Markdown-ish text splits into valid, complete chunks ---------------

pieces = st.sampled_from([
    "word", "**bold**", "_it_", "~~s~~", "`code`", "[l](https://e.org)", "\n", "\n\n", " ",
    "# head\n", "- item\n", "> quote\n", "```py\nx = 1\ny = 2\n```\n", "😀", "ü", "<&>",
    "| a | b |\n|---|---|\n| 1 | 2 |\n",
])
documents = st.lists(pieces, max_size=300).map("".join)


def _nested_properly(rendered: Rendered) -> bool:
    for a in rendered.entities:
        for b in rendered.entities:
            overlap = a.offset < b.end and b.offset < a.end
            nested = (a.offset <= b.offset and b.end <= a.end) or (b.offset <= a.offset and a.end <= b.end)
            if overlap and not nested:
                return False
    return True


@settings(max_examples=150, deadline=None)
@given(documents, st.integers(min_value=20, max_value=4096))
def test_split_chunks_fit_are_balanced_and_keep_the_text(markdown: str, limit: int) -> None:
    rendered = render_markdown(markdown)
    chunks = split_rendered(rendered, limit=limit)
    for chunk in chunks:
        assert 0 < utf16_len(chunk.text) <= limit and chunk.text.strip()
        for e in utf16_entities(chunk):
            assert e.length > 0 and 0 <= e.offset and e.offset + e.length <= utf16_len(chunk.text)
        assert _nested_properly(chunk)
    squeeze = lambda text: re.sub(r"\s", "", text)  # noqa: E731 - cuts drop only whitespace
    assert squeeze("".join(c.text for c in chunks)) == squeeze(rendered.text)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="*_~`[]\\#>|-+!.()0123456789<&=\r\x00"), max_size=300)
       .map(lambda text: "\n".join(line.lstrip() for line in text.split("\n"))))  # indented = code
def test_text_without_markup_is_preserved(text: str) -> None:
    rendered = render_markdown(text)
    squeeze = lambda value: re.sub(r"\s", "", value)  # noqa: E731
    assert squeeze(rendered.text) == squeeze(text)
    assert rendered.entities == ()


DETAILS = (
    "Summary first.\n\n<details>\n<summary>The **full** log</summary>\n\n> step one\n\n```\nok </details>\n```\n"
    "</details>\n\nAfter."
)


def test_a_collapsible_section_is_a_bold_summary_over_an_expandable_quote() -> None:
    r = render_markdown(DETAILS)
    assert r.text == "Summary first.\n\nThe full log\nstep one\n\nok </details>\n\nAfter."
    assert ("bold", "The full log") in spans(r) and ("bold", "full") in spans(r)
    # the whole body, its own quote and code block included, collapsed until tapped (quotes do not nest)
    assert ("expandable_blockquote", "step one\n\nok </details>") in spans(r)
    assert not any(kind == "blockquote" for kind, _ in spans(r))


def test_an_open_section_is_a_plain_quote_and_tags_elsewhere_stay_text() -> None:
    opened = render_markdown("<details open><summary>S</summary>\nbody\n</details>")
    assert spans(opened) == [("bold", "S"), ("blockquote", "body")]
    for written in ("Use `<details>` here", "```\n<details><summary>x</summary>y</details>\n```",
                    "<details>\n<summary>never closed</summary>\nbody", "<details>\nno summary\n</details>"):
        shown = render_markdown(written)
        assert "<details>" in shown.text or "&lt;" in shown.text, written  # as written, nothing guessed
        assert not any(e.type == "expandable_blockquote" for e in shown.entities)


def test_nested_sections_collapse_into_the_outer_one() -> None:
    nested = "<details><summary>Out</summary>\n\n<details><summary>In</summary>\n\ndeep\n</details>\n</details>"
    r = render_markdown(nested)
    assert r.text == "Out\nIn\ndeep"
    assert spans(r) == [("bold", "Out"), ("expandable_blockquote", "In\ndeep"), ("bold", "In")]


def test_a_long_collapsible_section_splits_into_messages_each_with_its_part_collapsed() -> None:
    body = "\n\n".join(f"line {n} " + "x" * 60 for n in range(120))
    chunks = split_rendered(render_markdown(f"<details><summary>Log</summary>\n\n{body}\n</details>"))
    assert len(chunks) > 1
    for chunk in chunks:
        assert any(e.type == "expandable_blockquote" for e in chunk.entities)
        assert utf16_len(chunk.text) <= 4096
