"""Real files for the attachment tests: images made with Pillow, a PDF with a text layer."""

from __future__ import annotations

import base64
import io
import random
from typing import Any

from PIL import Image


def image_bytes(width: int, height: int, fmt: str = "JPEG", color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    image = Image.new("RGB", (width, height), color)
    for x in range(0, width, max(1, width // 8)):  # some structure, so it is not one flat colour
        for y in range(height):
            image.putpixel((x, y), (0, 0, 0))
    image.save(out, fmt)
    return out.getvalue()


def noise_png(width: int, height: int, seed: int = 1) -> bytes:
    """A PNG of random pixels: it does not compress, so it is about width x height x 3 bytes."""
    out = io.BytesIO()
    Image.frombytes("RGB", (width, height), random.Random(seed).randbytes(width * height * 3)).save(out, "PNG")
    return out.getvalue()


def pdf_bytes(*pages: str, padding: int = 0) -> bytes:
    """A PDF whose pages hold `pages` as text (Helvetica), with a correct cross-reference table;
    `padding` bytes of noise in an unreferenced stream make a large file that is still valid."""
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>", b""]
    kids = []
    for text in pages:
        stream = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET".encode()
        content_id = len(objects) + 2
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {content_id} 0 R "
            f"/Resources << /Font << /F1 {len(pages) * 2 + 3} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
        kids.append(f"{len(objects) - 1} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(pages)} >>".encode()
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    if padding:
        noise = random.Random(padding).randbytes(padding)
        objects.append(b"<< /Length %d >>\nstream\n" % padding + noise + b"\nendstream")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n".encode() + body + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for offset in offsets:
        out.write(f"{offset:010d} 00000 n \n".encode())
    out.write(f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return out.getvalue()


def voice_bytes(seed: int = 1) -> bytes:
    """Enough of an Ogg/Opus file for sniffing (the fake transcriber keys on the bytes)."""
    return b"OggS\x00\x02" + bytes(range(seed, seed + 64)) * 4


def user_message(request: dict[str, Any]) -> dict[str, Any]:
    """The last thing a person said in a request to the model (not the gateway's context tail)."""
    said = [m for m in request["messages"] if m["role"] == "user" and not text_of(m).startswith("[context]")]
    return said[-1]


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p["type"] == "text")


def image_parts(message: dict[str, Any]) -> list[str]:
    content = message["content"]
    return [] if isinstance(content, str) else [p["image_url"]["url"] for p in content if p["type"] == "image_url"]


def decoded_image(data_url: str) -> Image.Image:
    head, _, data = data_url.partition(",")
    assert head.startswith("data:image/") and head.endswith(";base64")
    return Image.open(io.BytesIO(base64.b64decode(data)))
