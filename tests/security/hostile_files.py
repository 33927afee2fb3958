"""A corpus of hostile files, made in the test (nothing is shipped): each is small on the wire
and costly, broken or lying once a parser opens it.

- `shared_stream_pdf`: many pages whose /Contents all name one large compressed content
  stream, so every page re-runs the whole stream (a few KB, seconds per page in pypdf);
- `broken_xref_pdf`: a PDF header and a cross-reference table pointing nowhere;
- `encrypted_pdf`: a real PDF with a user password;
- `bomb_png`: an image whose header claims more pixels than any reader should decode
  (1-bit pixels, so the file stays small and generating it stays quick);
- `truncated_jpeg`: a JPEG cut in the middle of its scan data;
- `zip_named_pdf`: a zip archive called report.pdf, sent as application/pdf.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib


def shared_stream_pdf(pages: int = 40, operators: int = 30_000) -> bytes:
    content = zlib.compress(b"BT /F1 1 Tf 1 0 0 1 1 1 Tm (x) Tj ET\n" * operators, 9)
    kids = " ".join(f"{4 + n} 0 R" for n in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Count {pages} /Kids [{kids}] >>".encode(),
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(content) + content + b"\nendstream",
    ]
    font = "<< /Font << /F1 << /Type /Font /Subtype /Type1 /BaseFont /Helvetica >> >> >>"
    page = f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R /Resources {font} >>".encode()
    objects += [page] * pages
    return _pdf(objects)


def _pdf(objects: list[bytes]) -> bytes:
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def broken_xref_pdf() -> bytes:
    return (
        b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n"
        b"xref\n0 3\n0000000000 65535 f \n0000099999 00000 n \n0000088888 00000 n \n"
        b"trailer\n<< /Size 3 /Root 1 0 R >>\nstartxref\n77777\n%%EOF\n"
    )


def encrypted_pdf(text: str = "the secret plan") -> bytes:
    from media import pdf_bytes
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf_bytes(text))))
    writer.encrypt("correct horse", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def bomb_png(width: int = 11_000, height: int = 11_000) -> bytes:
    """A valid 1-bit greyscale PNG of `width` x `height` zero pixels (a few KB)."""
    row = b"\x00" * (1 + (width + 7) // 8)
    packer = zlib.compressobj(9)
    body = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")


def truncated_jpeg() -> bytes:
    from media import image_bytes

    whole = image_bytes(900, 700)
    return whole[: len(whole) // 2]


def zip_named_pdf() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", "<w:document>not a pdf</w:document>")
    return out.getvalue()
