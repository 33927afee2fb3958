"""The text of PDFs, read by `pdf_child.py` in a child process under CPU-time, memory, page
and wall-clock limits (`attachments.pdf_*`): a hostile PDF costs a child, never the gateway's
event loop, threads or memory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
CHILD = Path(__file__).with_name("pdf_child.py")
_MEMORY_EXIT = 3  # pdf_child.MEMORY_EXIT (the child is a script: it is not imported here)


@dataclass(frozen=True)
class PdfLimits:
    max_pages: int = 200
    cpu_s: int = 10
    memory_mb: int = 512
    timeout_s: float = 30.0


@dataclass(frozen=True)
class PdfText:
    text: str  # up to the limit
    pages: int
    total_chars: int  # of the pages read (reading stops once the limit is passed)
    complete: bool  # every page was read and nothing was cut
    error: str = ""  # why there is no text: the file could not be read
    pages_read: int = 0  # fewer than `pages` when `max_pages` stopped the reading


async def pdf_text(data: bytes, limit: int, limits: PdfLimits | None = None) -> PdfText:
    limits = limits or PdfLimits()
    args = (str(limit), str(limits.max_pages), str(max(1, int(limits.cpu_s))), str(limits.memory_mb))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",  # isolated: no PYTHON* variables, no script directory or user site on the path
        str(CHILD),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={},  # the gateway's secrets stay here
    )
    try:
        async with asyncio.timeout(limits.timeout_s):
            out, err = await process.communicate(data)
    except TimeoutError:
        return PdfText("", 0, 0, False, f"reading it took longer than {limits.timeout_s:g} s")
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    return _parsed(process.returncode, out, err, limits)


def _parsed(code: int | None, out: bytes, err: bytes, limits: PdfLimits) -> PdfText:
    if code == 0:
        try:
            found = json.loads(out)
            return PdfText(
                str(found["text"]),
                int(found["pages"]),
                int(found["total_chars"]),
                bool(found["complete"]),
                str(found["error"]),
                int(found.get("pages_read") or found["pages"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            return PdfText("", 0, 0, False, f"the PDF reader answered nonsense ({exc})")
    if code == _MEMORY_EXIT or b"MemoryError" in err:
        return PdfText("", 0, 0, False, f"reading it needed more than {limits.memory_mb} MB of memory")
    if code in (-signal.SIGXCPU, -signal.SIGKILL):  # the soft CPU limit, then the hard one
        return PdfText("", 0, 0, False, f"reading it took more than {limits.cpu_s:g} s of CPU time")
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        return PdfText("", 0, 0, False, f"the PDF reader crashed ({name})")
    tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {code}"]
    log.warning("the PDF reader failed: %s", tail[0])
    return PdfText("", 0, 0, False, f"the PDF reader failed ({tail[0][:200]})")
