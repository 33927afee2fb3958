"""Images for the model (the only module that imports Pillow): size, downscaling, data URLs,
and the token cost by OpenAI's published rule for image inputs.

Every decode is preceded by a look at the header: an image of more than `max_pixels` pixels
(`attachments.max_image_pixels`) is refused before a byte of it is decompressed, and every
decode runs off the event loop (`read_image` in a thread; `ImageParts.warm` before a context
is built).
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.attachments.sniff import IMAGE_MIMES_FOR_MODELS
from gateway.files.workspace import SESSIONS

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

MAX_IMAGE_PIXELS = 64_000_000  # a decompression bomb is refused, not decoded


class ImageUnreadable(Exception):
    """Why an image cannot be used: too many pixels, truncated, not an image at all."""


def _pillow():  # noqa: ANN202 - PIL.Image, imported with the first image: a start does not wait for it
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS  # Pillow's own guard, behind the explicit check
    warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # `_check_pixels` refuses them
    return Image


def _check_pixels(size: tuple[int, int], max_pixels: int) -> None:
    width, height = size
    if width * height > max_pixels:
        raise ImageUnreadable(
            f"the image is {width}x{height} pixels, over the limit of {max_pixels:,} (attachments.max_image_pixels)"
        )


def _unreadable(*more: type[Exception]) -> tuple[type[Exception], ...]:
    """What Pillow raises on a file it cannot (or must not) decode."""
    from PIL import Image, UnidentifiedImageError

    return (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError, *more)


@dataclass(frozen=True)
class ImageInfo:
    width: int
    height: int


def image_info(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> ImageInfo | None:
    """Dimensions from the header, or None when Pillow cannot read it (corrupt, not really an
    image, or over `max_pixels`). Nothing is decoded."""
    pillow = _pillow()
    try:
        with pillow.open(io.BytesIO(data)) as image:
            _check_pixels(image.size, max_pixels)
            image.verify()
            return ImageInfo(*image.size)
    except _unreadable(SyntaxError, ImageUnreadable):
        return None


def read_image(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> ImageInfo:
    """Dimensions of an image that decodes whole: the header is checked against `max_pixels`
    first, then every pixel is decoded (a truncated file fails here, not when the model needs
    it). Blocking: run it in a thread. Raises ImageUnreadable with the reason."""
    pillow = _pillow()
    try:
        with pillow.open(io.BytesIO(data)) as image:
            _check_pixels(image.size, max_pixels)
            image.load()
            return ImageInfo(*image.size)
    except ImageUnreadable:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a broken file raises becomes the reason
        raise ImageUnreadable(f"the image could not be decoded ({type(exc).__name__}: {exc})") from None


def fitted(width: int, height: int, max_side: int) -> tuple[int, int]:
    """The size after downscaling so the longest side is at most `max_side` (never upscaled)."""
    longest = max(width, height, 1)
    if longest <= max_side:
        return width, height
    scale = max_side / longest
    return max(1, round(width * scale)), max(1, round(height * scale))


def data_url(path: Path, mime: str, max_side: int, max_pixels: int = MAX_IMAGE_PIXELS) -> str | None:
    """`data:<mime>;base64,...` of the image downscaled to `max_side`, re-encoded when the
    model would not accept its format; None when it cannot be read. Blocking (a decode)."""
    pillow = _pillow()
    try:
        raw = path.read_bytes()
        with pillow.open(io.BytesIO(raw)) as image:
            _check_pixels(image.size, max_pixels)
            width, height = image.size
            size = fitted(width, height, max_side)
            if size == image.size and mime in IMAGE_MIMES_FOR_MODELS:
                encoded, out_mime = raw, mime
            else:
                encoded, out_mime = _reencode(image, size, mime)
    except _unreadable(ImageUnreadable):
        return None
    return f"data:{out_mime};base64,{base64.b64encode(encoded).decode('ascii')}"


def _reencode(image: PILImage, size: tuple[int, int], mime: str) -> tuple[bytes, str]:
    image.seek(0)  # the first frame of an animation
    frame = image.resize(size, _pillow().Resampling.LANCZOS) if size != image.size else image.copy()
    out = io.BytesIO()
    if mime == "image/jpeg" or (frame.mode in ("RGB", "L", "CMYK") and mime != "image/png"):
        frame.convert("RGB").save(out, "JPEG", quality=85)
        return out.getvalue(), "image/jpeg"
    frame.save(out, "PNG", optimize=True)
    return out.getvalue(), "image/png"


def image_tokens(width: int, height: int) -> int:
    """OpenAI's rule for a high-detail image: fit in 2048x2048, then shortest side 768, then
    85 tokens plus 170 per 512-pixel tile. Other providers charge less or about the same, so
    the context budget errs on the high side."""
    if width <= 0 or height <= 0:
        return 85 + 170 * 4
    w, h = fitted(width, height, 2048)
    shortest = min(w, h)
    if shortest > 768:
        scale = 768 / shortest
        w, h = math.ceil(w * scale), math.ceil(h * scale)
    return 85 + 170 * math.ceil(w / 512) * math.ceil(h / 512)


class ImageParts:
    """Stored image records -> `image_url` parts for the model, read from the workspace.

    A part is rendered once per session cache (the context builder keeps rendered rows), and
    the last few encodings are kept here too, so a rebuilt cache does not re-encode them.
    `warm` encodes the records a build is about to render in a thread, so the render itself
    (on the event loop) finds them done."""

    def __init__(
        self,
        workspace: Path,
        max_side: int,
        chars_per_token: int,
        keep: int = 16,
        max_pixels: int = MAX_IMAGE_PIXELS,
    ):
        self.workspace = workspace.expanduser().resolve()
        self.max_side = max_side
        self.chars_per_token = chars_per_token
        self.keep = keep
        self.max_pixels = max_pixels
        self._urls: dict[tuple[str, int], str | None] = {}

    def _located(self, relative: str) -> Path | None:
        """Records name their file relative to the workspace, `sessions/<id>/…`; one from before
        per-session directories (`attachments/<id>/<name>`) was moved into that session's
        directory. None when the file (a link, say) resolves outside its own session's directory."""
        parts = Path(relative).parts
        if len(parts) < 3 or not parts[1].isdigit():
            return None
        own = self.workspace / SESSIONS / parts[1]
        if parts[0] == SESSIONS:
            path = (self.workspace / relative).resolve()
            return path if path.is_relative_to(own) else None
        moved = (own / relative).resolve()
        if moved.exists():
            return moved if moved.is_relative_to(own) else None
        old = (self.workspace / relative).resolve()  # not moved (yet): its old folder, and only that
        return old if old.is_relative_to(self.workspace / parts[0] / parts[1]) else None

    def _key(self, record: dict) -> tuple[Path, tuple[str, int]] | None:
        path = self._located(str(record.get("path", "")))
        if path is None or not path.is_file():
            return None  # deleted since, or not ours: the row's text still names it
        return path, (str(path), path.stat().st_mtime_ns)

    def _remember(self, key: tuple[str, int], url: str | None) -> str | None:
        if len(self._urls) >= self.keep:
            self._urls.pop(next(iter(self._urls)))
        self._urls[key] = url
        return url

    async def warm(self, records: list[dict]) -> None:
        """Encode, in a thread, the last `keep` of `records` not encoded yet."""
        for record in records[-self.keep :]:
            found = await asyncio.to_thread(self._key, record)
            if found is not None and found[1] not in self._urls:
                mime = str(record.get("mime", ""))
                url = await asyncio.to_thread(data_url, found[0], mime, self.max_side, self.max_pixels)
                self._remember(found[1], url)

    def __call__(self, record: dict) -> tuple[dict, int] | None:
        found = self._key(record)
        if found is None:
            return None
        path, key = found
        if key in self._urls:
            url = self._urls[key]
        else:  # not warmed (more images than `keep`): encoded here, under the same pixel limit
            url = self._remember(key, data_url(path, str(record.get("mime", "")), self.max_side, self.max_pixels))
        if url is None:
            return None
        width, height = fitted(int(record.get("width") or 0), int(record.get("height") or 0), self.max_side)
        return {"type": "image_url", "image_url": {"url": url}}, image_tokens(width, height) * self.chars_per_token
