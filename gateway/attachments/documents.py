"""The text of PDFs (the only module that imports pypdf)."""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass

logging.getLogger("pypdf").setLevel(logging.ERROR)  # malformed-but-readable files warn loudly


@dataclass(frozen=True)
class PdfText:
    text: str  # up to the limit
    pages: int
    total_chars: int  # of the pages read (reading stops once the limit is passed)
    complete: bool  # every page was read and nothing was cut
    error: str = ""


def pdf_text(data: bytes, limit: int) -> PdfText:
    # Imported on the first PDF: a start does not wait for pypdf.
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            return PdfText("", len(reader.pages), 0, False, "the PDF is encrypted")
        parts: list[str] = []
        total = 0
        pages = len(reader.pages)
        for number, page in enumerate(reader.pages, start=1):
            text = (page.extract_text() or "").strip()
            if text:
                parts.append(text)
                total += len(text) + 2
            if total > limit:
                return PdfText("\n\n".join(parts)[:limit], pages, total, False)
            if number == pages:
                break
        return PdfText("\n\n".join(parts), pages, total, True)
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as exc:
        return PdfText("", 0, 0, False, f"the PDF could not be read ({exc})")
