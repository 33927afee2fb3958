"""The text of a PDF, read in a child process under limits (the only module that imports pypdf).

Run as a script by `documents.pdf_text` (`python -I pdf_child.py LIMIT MAX_PAGES CPU_S MEMORY_MB`):
the PDF comes on stdin, a JSON object goes to stdout. CPU time and address space are capped
before any byte of the file is parsed, so a hostile PDF (one content stream shared by every
page, a decompression bomb) ends in SIGXCPU or a MemoryError here, not in the gateway.
It imports nothing from the project: a script started by path loads no package and its config.
"""

from __future__ import annotations

import io
import json
import logging
import resource
import sys
from typing import Any

logging.getLogger("pypdf").setLevel(logging.CRITICAL)  # malformed-but-readable files warn loudly
MEMORY_EXIT = 3  # the PDF needed more memory than the limit


def extract(data: bytes, limit: int, max_pages: int) -> dict[str, Any]:
    """text (up to `limit`), pages, total_chars (of the pages read), complete, error."""
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            return _result("", 0, 0, False, "the PDF is encrypted")
        pages = len(reader.pages)
        parts: list[str] = []
        total = 0
        for number, page in enumerate(reader.pages, start=1):
            if number > max_pages:
                return _result("\n\n".join(parts)[:limit], pages, total, False, "", pages_read=max_pages)
            text = (page.extract_text() or "").strip()
            if text:
                parts.append(text)
                total += len(text) + 2
            if total > limit:
                return _result("\n\n".join(parts)[:limit], pages, total, False)
            if number == pages:
                break
        return _result("\n\n".join(parts), pages, total, True)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a broken file raises becomes the reason
        return _result("", 0, 0, False, f"it is not a readable PDF ({type(exc).__name__}: {exc})")


def _result(text: str, pages: int, total: int, complete: bool, error: str = "", pages_read: int = 0) -> dict[str, Any]:
    return {
        "text": text,
        "pages": pages,
        "total_chars": total,
        "complete": complete,
        "error": error,
        "pages_read": pages_read or pages,
    }


def _warm_up() -> None:
    """pypdf imports parts of itself (and of the standard library) on first use: read a blank
    page before the limits, so they count the file's needs, not the interpreter's."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(72, 72)
    out = io.BytesIO()
    writer.write(out)
    PdfReader(io.BytesIO(out.getvalue())).pages[0].extract_text()


def _die_with_parent() -> None:
    """Linux: SIGKILL when the gateway dies (a `kill -9` of it must not leave a parse running)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # elsewhere the CPU limit still ends it


def _limit(cpu_s: int, memory_mb: int) -> None:
    # The soft CPU limit sends SIGXCPU (the process ends); the hard one, a second later, SIGKILL.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    if memory_mb > 0:
        memory = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))


def main(argv: list[str]) -> int:
    limit, max_pages, cpu_s, memory_mb = (int(a) for a in argv[1:5])
    _die_with_parent()
    _warm_up()
    data = sys.stdin.buffer.read()
    _limit(cpu_s, memory_mb)
    try:
        result = extract(data, limit, max_pages)
    except MemoryError:
        return MEMORY_EXIT
    sys.stdout.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
