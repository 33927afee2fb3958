"""What a file is, from its first bytes: the sender's name and claimed type are not trusted."""

from __future__ import annotations

import codecs

# (offset, magic, mime), most specific first.
_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\xff\xd8\xff", "image/jpeg"),
    (0, b"\x89PNG\r\n\x1a\n", "image/png"),
    (0, b"GIF87a", "image/gif"),
    (0, b"GIF89a", "image/gif"),
    (0, b"BM", "image/bmp"),
    (0, b"II*\x00", "image/tiff"),
    (0, b"MM\x00*", "image/tiff"),
    (0, b"%PDF-", "application/pdf"),
    (0, b"OggS", "audio/ogg"),
    (0, b"ID3", "audio/mpeg"),
    (0, b"fLaC", "audio/flac"),
    (0, b"\x1a\x45\xdf\xa3", "video/webm"),
    (0, b"PK\x03\x04", "application/zip"),
    (0, b"\x1f\x8b", "application/gzip"),
    (0, b"\x7fELF", "application/x-executable"),
)
TEXT_MIMES = ("application/json", "application/xml", "application/x-yaml", "application/javascript", "application/sql")
_TEXT_EXTENSIONS = {
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".csv": "text/csv",
    ".tsv": "text/tab-separated-values",
    ".json": "application/json",
    ".xml": "application/xml",
    ".yaml": "application/x-yaml",
    ".yml": "application/x-yaml",
    ".html": "text/html",
    ".htm": "text/html",
}
IMAGE_MIMES_FOR_MODELS = ("image/jpeg", "image/png", "image/gif", "image/webp")


def sniff(data: bytes, name: str = "") -> str:
    """The MIME type of `data`: magic numbers first, then "is it text?", else octet-stream.
    The name only refines text (a CSV is text either way, but the model likes to know)."""
    head = data[:64]
    for offset, magic, mime in _MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return mime
    if head[:4] == b"RIFF" and head[8:12] in (b"WEBP", b"WAVE", b"AVI "):
        return {b"WEBP": "image/webp", b"WAVE": "audio/wav", b"AVI ": "video/x-msvideo"}[head[8:12]]
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"M4A ", b"M4B "):
            return "audio/mp4"
        if brand in (b"heic", b"heix", b"mif1"):
            return "image/heic"
        return "video/mp4"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        return "audio/mpeg"  # an MPEG audio frame without an ID3 tag
    if looks_like_text(data):
        suffix = name[name.rfind(".") :].lower() if "." in name else ""
        return _TEXT_EXTENSIONS.get(suffix, "text/plain")
    return "application/octet-stream"


def looks_like_text(data: bytes, probe: int = 8192) -> bool:
    """UTF-8 (or UTF-16 with a BOM) without NUL bytes in the first `probe` bytes."""
    sample = data[:probe]
    if sample.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return True
    if b"\0" in sample:
        return False
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(sample) - 4  # a multi-byte character cut by the probe
    return True


def decode_text(data: bytes) -> str:
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return data.decode("utf-16", errors="replace")
    return data.decode("utf-8-sig", errors="replace")


def is_text(mime: str) -> bool:
    return mime.startswith("text/") or mime in TEXT_MIMES


def extension_for(mime: str) -> str:
    special = {
        "image/jpeg": ".jpg",
        "audio/mpeg": ".mp3",
        "audio/ogg": ".ogg",
        "text/plain": ".txt",
        "text/markdown": ".md",
        "application/octet-stream": ".bin",
        "audio/mp4": ".m4a",
    }
    return special.get(mime, "." + mime.rsplit("/", 1)[-1].removeprefix("x-"))
