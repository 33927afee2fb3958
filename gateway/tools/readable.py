"""The readable text of an HTML page, for web_fetch: the main content as Markdown with its links
kept (made absolute against the page's URL), scripts, styles, navigation, footers and cookie
banners left out. trafilatura (and lxml under it) is imported with the first page fetched: a
start never pays for it. The extraction runs in a worker thread, so a large page does not hold
up the event loop the other threads' turns run on."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

HTML_TYPES = ("text/html", "application/xhtml+xml")


@dataclass(frozen=True)
class Readable:
    title: str
    text: str  # "" when the page has none (only navigation and boilerplate, or nothing)


def is_html(content_type: str, body: bytes) -> bool:
    lowered = content_type.lower()
    if any(kind in lowered for kind in HTML_TYPES):
        return True
    if lowered:
        return False
    start = body[:512].lstrip().lower()
    return start.startswith((b"<!doctype html", b"<html"))  # no type given: the page says what it is


async def readable(page: str | bytes, url: str) -> Readable:
    return await asyncio.to_thread(extract, page, url)


def extract(page: str | bytes, url: str) -> Readable:
    import trafilatura  # here, not at the top: see the module's docstring

    tree = trafilatura.load_html(page)
    if tree is None:
        return Readable("", "")
    title = " ".join((tree.findtext(".//title") or "").split())
    try:
        text = trafilatura.extract(
            tree, url=url, output_format="markdown", include_links=True, include_comments=False,
            include_tables=True, include_images=False,
        )
    except Exception:  # a page the extractor chokes on: said so, raw=true still has the source
        log.warning("the readable text of %s could not be extracted", url, exc_info=True)
        text = None
    return Readable(title, (text or "").strip())
