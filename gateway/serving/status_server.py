"""The status pages (/healthz, /readyz, /metrics) over a small HTTP/1.1 server on asyncio's
streams, for a gateway that needs no other HTTP: Telegram by long polling, Slack by Socket Mode,
the console off. aiohttp is then never imported (~0.1 s of a cold start).

It answers GET and HEAD of the three paths, one request per connection (`Connection: close`),
and nothing else: a request line or headers past 16 KiB get 431, a body 413, anything slower
than 10 s is dropped. Everything an HTTP server needs to say for a request that is not one of
the pages is a status code."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from http import HTTPStatus

from gateway.serving.proxies import Headers
from gateway.serving.status import Page, StatusPages

log = logging.getLogger(__name__)
MAX_HEAD = 16 * 1024  # the request line and headers
READ_TIMEOUT_S = 10.0
PATHS = ("/healthz", "/readyz", "/metrics")


class BadRequest(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class StatusServer:
    """Serves what `HttpServer` serves when it has no webhook routes and no console."""

    def __init__(self, pages: StatusPages, *, read_timeout_s: float = READ_TIMEOUT_S):
        self.pages = pages
        self.config = pages.config
        self.read_timeout_s = read_timeout_s
        self.loop_lag = self.pages.loop_lag
        self.port: int | None = None
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task] = set()

    @property
    def accepting(self) -> bool:
        return self.pages.accepting

    async def start(self) -> None:
        self.loop_lag.start()
        self._server = await asyncio.start_server(self._serve, self.config.host, self.config.port, limit=MAX_HEAD)
        sockets = self._server.sockets or ()
        self.port = sockets[0].getsockname()[1] if sockets else self.config.port
        log.info("HTTP server on http://%s:%s (healthz, readyz, metrics)", self.config.host, self.port)
        self.pages.log_exposure()

    async def stop_intake(self) -> None:
        self.pages.accepting = False

    async def stop(self) -> None:
        await self.loop_lag.stop()
        if self._server is not None:
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            try:
                method, page = await self._answer(reader, writer)
            except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                return  # a client that went away or never finished its request: nothing to answer
            except Exception:  # a page that failed (the database went away mid-scrape): 500, as aiohttp says
                log.exception("status server: answering a request failed")
                method, page = "GET", _status_page(HTTPStatus.INTERNAL_SERVER_ERROR)
            await _write(writer, page, head_only=method == "HEAD")
        except ConnectionError:
            pass  # gone before the answer was written
        finally:
            if task is not None:
                self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[str, Page]:
        try:
            async with asyncio.timeout(self.read_timeout_s):
                method, path, headers = await read_head(reader)
        except BadRequest as bad:
            return "GET", _status_page(bad.status)
        if path not in PATHS:
            return method, _status_page(HTTPStatus.NOT_FOUND)
        if method not in ("GET", "HEAD"):
            return method, _status_page(HTTPStatus.METHOD_NOT_ALLOWED, {"Allow": "GET, HEAD"})
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        origin = self.pages.proxies.origin(address, headers, https=False)
        authorization = headers.get("Authorization", "")
        if path == "/healthz":
            return method, self.pages.healthz()
        if path == "/readyz":
            return method, await self.pages.readyz(origin, authorization)
        return method, await self.pages.metrics(origin, authorization)


async def read_head(reader: asyncio.StreamReader) -> tuple[str, str, Headers]:
    """The method, the path (without its query) and the headers of one request; a request that
    carries a body is refused (no page takes one)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE) from None
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        raise BadRequest(HTTPStatus.BAD_REQUEST)
    pairs: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or " " in name:
            raise BadRequest(HTTPStatus.BAD_REQUEST)
        pairs.append((name, value.strip()))
    headers = Headers(pairs)
    if headers.get("Content-Length", "0").strip() not in ("", "0") or "Transfer-Encoding" in headers:
        raise BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
    return parts[0], parts[1].split("?", 1)[0], headers


def _status_page(status: int, headers: dict[str, str] | None = None) -> Page:
    return Page.text(f"{status}: {HTTPStatus(status).phrase}\n", status, headers)


async def _write(writer: asyncio.StreamWriter, page: Page, *, head_only: bool) -> None:
    reason = HTTPStatus(page.status).phrase
    content_type = page.content_type + ("; charset=utf-8" if page.content_type.startswith("text/") else "")
    lines = [
        f"HTTP/1.1 {page.status} {reason}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(page.body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in page.headers.items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else page.body))
    await writer.drain()
