"""The SSE line splitter and decoder over raw byte chunks: however the network cuts the body,
the same lines and the same payloads come out."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.llm import LLMError
from gateway.llm.stream import SSEDecoder, SSELineSplitter

LINE_ENDS = (b"\n", b"\r\n", b"\r")
# Multi-byte UTF-8, and Unicode separators that str.splitlines would break at but SSE must not.
TEXT = st.text(alphabet=st.sampled_from("ab :{}\"é€😀\u2028\u2029\u0085\x1c\x0b\x0c"), max_size=12)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[start:end] for start, end in zip([0, *points], [*points, len(data)], strict=False)]


def lines_of(chunks: list[bytes]) -> list[bytes]:
    splitter = SSELineSplitter()
    lines = [line for chunk in chunks for line in splitter.feed(chunk)]
    return lines + splitter.flush()


async def payloads_of(chunks: list[bytes]) -> list[dict]:
    async def source():
        for chunk in chunks:
            yield chunk

    decoder = SSEDecoder(source())
    found = []
    while (payload := await decoder.next()) is not None:
        found.append(payload)
    await decoder.drain()
    return found


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.tuples(TEXT, st.sampled_from(LINE_ENDS)), max_size=8),
    tail=TEXT,
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
)
def test_any_split_of_the_bytes_gives_the_same_lines(lines, tail, cuts):
    body = b"".join(text.encode() + end for text, end in lines) + tail.encode()
    expected = body.splitlines()  # bytes know only the SSE line ends: LF, CRLF and CR
    assert lines_of([body]) == expected
    assert lines_of(split_at(body, cuts)) == expected


def test_only_lf_crlf_and_cr_end_lines():
    text = "a\u2028b\u2029c\u0085d\x1ce\x0bf\x0cg"
    body = f"{text}\n{text}\r\n{text}\r{text}".encode()
    assert lines_of([body]) == [text.encode()] * 4


def test_cr_at_the_end_of_a_chunk_and_lf_at_the_start_of_the_next_is_one_line_end():
    assert lines_of([b"data: 1\r", b"\ndata: 2\r", b"\r", b"\n"]) == [b"data: 1", b"data: 2", b""]


def test_a_character_split_across_chunks_stays_whole():
    body = 'data: {"t": "€😀"}\n\n'.encode()
    cut = body.index("€".encode()) + 1
    assert asyncio.run(payloads_of([body[:cut], body[cut:]])) == [{"t": "€😀"}]


@settings(max_examples=150, deadline=None)
@given(
    texts=st.lists(TEXT, min_size=1, max_size=5),
    end=st.sampled_from(LINE_ENDS),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=15),
)
def test_any_split_and_any_line_end_give_the_same_payloads(texts, end, cuts):
    payloads = [{"choices": [{"index": 0, "delta": {"content": text}}]} for text in texts]
    parts = [b": ping"]
    for payload in payloads:
        parts += [b"data: " + json.dumps(payload, ensure_ascii=False).encode(), b""]
    parts += [b"data: [DONE]", b""]
    body = b"".join(part + end for part in parts)
    assert asyncio.run(payloads_of([body])) == payloads
    assert asyncio.run(payloads_of(split_at(body, cuts))) == payloads


def test_multi_line_data_comments_and_event_names():
    body = b": hello\r\nevent: message\r\ndata: {\"a\":\r\ndata:  1}\r\n\r\ndata:{\"b\": 2}\n\n"
    assert asyncio.run(payloads_of([body])) == [{"a": 1}, {"b": 2}]


def test_a_last_event_without_a_blank_line_is_still_read():
    assert asyncio.run(payloads_of([b'data: {"a": 1}'])) == [{"a": 1}]


def test_nothing_is_read_after_done():
    body = b'data: [DONE]\n\ndata: {"a": 1}\n\n'
    assert asyncio.run(payloads_of([body])) == []


def test_what_the_standard_parser_accepts_is_still_accepted():
    body = b'data: {"logprob": -Infinity, "x": NaN, "s": "\\ud800"}\n\n'
    [payload] = asyncio.run(payloads_of([body]))
    assert payload["logprob"] == float("-inf") and payload["s"] == "\ud800"


def test_invalid_utf8_is_replaced_as_before():
    assert asyncio.run(payloads_of([b'data: {"t": "a\xffb"}\n\n'])) == [{"t": "a\ufffdb"}]


@pytest.mark.parametrize(
    ("body", "message"),
    [(b"data: {not json\n\n", "malformed stream chunk from the LLM server: '{not json'"),
     (b"data: [1, 2]\n\n", "unexpected stream chunk from the LLM server: '[1, 2]'")],
)
def test_bad_chunks_are_stream_errors(body, message):
    with pytest.raises(LLMError) as caught:
        asyncio.run(payloads_of([body]))
    assert caught.value.message == message and caught.value.kind == "stream"
