"""What an audio file really is, read from its bytes: the container (Ogg, MP3, M4A, WAV) and,
for Ogg Opus, its length from the last page's granule position (RFC 7845: 48 kHz samples, less
the header's pre-skip). Used by the fake Bot API's sendVoice and by the tests that check a
voice note is real audio of the right length."""

from __future__ import annotations

import struct

from fakes.llm_speech import ogg_crc


def audio_kind(data: bytes) -> str:
    """"ogg", "mp3", "m4a", "wav" or "" (not audio Telegram plays as a voice note)."""
    if data.startswith(b"OggS"):
        return "ogg"
    if data.startswith(b"ID3") or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    if data[4:8] == b"ftyp":
        return "m4a"
    if data.startswith(b"RIFF") and data[8:12] == b"WAVE":
        return "wav"
    return ""


def ogg_pages(data: bytes) -> list[tuple[int, bytes]]:
    """(granule position, payload) of each page; ValueError when the stream is broken."""
    pages = []
    at = 0
    while at < len(data):
        if data[at : at + 4] != b"OggS" or len(data) < at + 27:
            raise ValueError(f"no Ogg page at byte {at}")
        granule = struct.unpack_from("<q", data, at + 6)[0]
        segments = data[at + 26]
        table = data[at + 27 : at + 27 + segments]
        start = at + 27 + segments
        size = sum(table)
        if len(data) < start + size:
            raise ValueError("the last Ogg page is cut short")
        page = data[at : start + size]
        if struct.unpack_from("<I", page, 22)[0] != ogg_crc(page[:22] + b"\0\0\0\0" + page[26:]):
            raise ValueError(f"the Ogg page at byte {at} fails its CRC")
        pages.append((granule, data[start : start + size]))
        at = start + size
    return pages


def opus_seconds(data: bytes) -> float:
    """The length of an Ogg Opus stream; ValueError when it is not one."""
    pages = ogg_pages(data)
    if not pages or not pages[0][1].startswith(b"OpusHead"):
        raise ValueError("not an Ogg Opus stream (no OpusHead)")
    pre_skip = struct.unpack_from("<H", pages[0][1], 10)[0]
    return max(pages[-1][0] - pre_skip, 0) / 48_000
