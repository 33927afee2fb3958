"""OpenAI's `POST /v1/audio/speech` as the fake model server answers it: the request checked
as OpenAI checks it (model, input up to 4,096 characters, a known voice, a known format), and
an answer of real-shaped audio, chunked: an Ogg Opus stream (OpusHead, OpusTags, pages with CRCs
and granule positions) as long as the text would take to say, or MP3 frames.

`SpeechServer` keeps what was asked and can fail or stall like a real one."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse"})
CONTENT_TYPES = {
    "opus": "audio/ogg", "mp3": "audio/mpeg", "aac": "audio/aac", "flac": "audio/flac", "wav": "audio/wav",
    "pcm": "audio/pcm",
}
MAX_INPUT = 4096
CHARS_PER_SECOND = 15  # about how fast speech goes
PRE_SKIP = 312


@dataclass
class SpeechServer:
    requests: list[dict[str, Any]] = field(default_factory=list)
    failures: int = 0  # the next N requests answer 500 (OpenAI's server_error)
    delay_s: float = 0.0  # each answer waits this long first
    api_key: str | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error(401, "Incorrect API key provided.", "invalid_request_error", code="invalid_api_key")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "We could not parse the JSON body of your request.", "invalid_request_error")
        self.requests.append(body)
        problem = _problem(body)
        if problem:
            return _error(400, problem[1], "invalid_request_error", param=problem[0])
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.failures > 0:
            self.failures -= 1
            return _error(500, "The server had an error while processing your request.", "server_error")
        audio_format = body.get("response_format", "mp3")
        audio = ogg_opus(len(body["input"]) / CHARS_PER_SECOND) if audio_format == "opus" else mp3_frames(body["input"])
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPES[audio_format]})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for at in range(0, len(audio), 1000):  # in pieces, as a synthesiser streams its audio
            await response.write(audio[at : at + 1000])
        await response.write_eof()
        return response


def _problem(body: Any) -> tuple[str, str] | None:
    if not isinstance(body, dict):
        return "input", "The body must be a JSON object."
    if not body.get("model"):
        return "model", "you must provide a model parameter"
    text = body.get("input")
    if not isinstance(text, str) or not text:
        return "input", "Missing required parameter: 'input'."
    if len(text) > MAX_INPUT:
        return "input", f"String should have at most {MAX_INPUT} characters"
    if body.get("voice") not in VOICES:
        return "voice", f"Invalid value for 'voice' = {body.get('voice')!r}."
    if body.get("response_format", "mp3") not in CONTENT_TYPES:
        return "response_format", f"Invalid value for 'response_format' = {body.get('response_format')!r}."
    return None


def _error(status: int, message: str, kind: str, *, param: str | None = None, code: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}}, status=status)


def ogg_opus(seconds: float) -> bytes:
    """A valid Ogg Opus stream of `seconds` (silent frames): what an Opus muxer writes."""
    head = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, PRE_SKIP, 48_000, 0, 0)
    tags = b"OpusTags" + struct.pack("<I", 4) + b"fake" + struct.pack("<I", 0)
    pages = [_page(head, 0, 0, 2), _page(tags, 0, 1, 0)]
    frames = max(1, round(seconds / 0.02))  # 20 ms frames
    silent = b"\xf8\xff\xfe"  # one Opus silence frame (TOC 0xf8: CELT FB 20 ms)
    per_page, sequence, granule = 50, 2, PRE_SKIP
    for start in range(0, frames, per_page):
        count = min(per_page, frames - start)
        granule += count * 960
        last = start + count >= frames
        pages.append(_page_of_packets([silent] * count, granule, sequence, 4 if last else 0))
        sequence += 1
    return b"".join(pages)


def mp3_frames(text: str) -> bytes:
    """An ID3 header and MPEG-1 Layer III frame headers: enough for anything that sniffs MP3."""
    frame = b"\xff\xfb\x90\x64" + bytes(413)  # 128 kbit/s, 44.1 kHz: 417 bytes, 26 ms
    return b"ID3\x04\x00\x00\x00\x00\x00\x00" + frame * max(1, round(len(text) / CHARS_PER_SECOND / 0.026))


def _page(packet: bytes, granule: int, sequence: int, flags: int) -> bytes:
    return _page_of_packets([packet], granule, sequence, flags)


def _page_of_packets(packets: list[bytes], granule: int, sequence: int, flags: int) -> bytes:
    lacing = b"".join(bytes([255] * (len(p) // 255) + [len(p) % 255]) for p in packets)
    header = b"OggS" + struct.pack("<BBqIIIB", 0, flags, granule, 1, sequence, 0, len(lacing)) + lacing
    page = header + b"".join(packets)
    crc = ogg_crc(page)
    return page[:22] + struct.pack("<I", crc) + page[26:]


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        r = i << 24
        for _ in range(8):
            r = ((r << 1) ^ 0x04C11DB7) if r & 0x80000000 else (r << 1)
        table.append(r & 0xFFFFFFFF)
    return table


_TABLE = _crc_table()


def ogg_crc(page: bytes) -> int:
    """The CRC of an Ogg page (its CRC field zeroed), as RFC 3533 defines it."""
    crc = 0
    for byte in page:
        crc = ((crc << 8) ^ _TABLE[((crc >> 24) & 0xFF) ^ byte]) & 0xFFFFFFFF
    return crc
