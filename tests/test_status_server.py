"""The small status server (gateway/serving/status_server.py), spoken to over raw sockets the way
clients and scanners really write: probes, HEAD, query strings, headers sent twice, and the
requests it must refuse without hanging or raising (oversized heads, bodies, garbage, a client
that never finishes)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from test_metrics import StoreOnly

from gateway.config import HttpConfig
from gateway.serving.status import StatusPages
from gateway.serving.status_server import StatusServer


@asynccontextmanager
async def status_server(store, **http) -> AsyncIterator[StatusServer]:  # noqa: ANN001
    pages = StatusPages(StoreOnly(store), HttpConfig(host="127.0.0.1", port=0, **http))
    server = StatusServer(pages, read_timeout_s=0.5)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def exchange(server: StatusServer, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `raw` and read the whole answer (the server closes the connection after it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, body


def get(path: str, *headers: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: x", *headers]) + "\r\n\r\n").encode()


async def test_the_three_pages_for_a_local_client(sqlite_store) -> None:
    async with status_server(sqlite_store) as server:
        status, headers, body = await exchange(server, get("/healthz"))
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        assert headers["Connection"] == "close" and headers["Content-Length"] == str(len(body))
        status, _, body = await exchange(server, get("/readyz?verbose=1"))
        ready = json.loads(body)
        assert status == 200 and ready["ready"] is True and ready["database"] is True
        status, headers, body = await exchange(server, get("/metrics"))
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        assert b"gateway_inbox_pending" in body and b'gateway_event_loop_lag_seconds{quantile="0.99"}' in body


async def test_head_answers_the_headers_only(sqlite_store) -> None:
    async with status_server(sqlite_store) as server:
        status, headers, body = await exchange(server, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0


async def test_a_second_forwarded_for_line_is_not_passed_over(sqlite_store) -> None:
    """Behind a trusted proxy, a client that sends its own X-Forwarded-For: 127.0.0.1 line
    beside the proxy's must not pass for local."""
    async with status_server(sqlite_store, trusted_proxies=["127.0.0.1"]) as server:
        forged = get("/metrics", "X-Forwarded-For: 127.0.0.1", "X-Forwarded-For: 203.0.113.9")
        assert (await exchange(server, forged))[0] == 401
        remote = await exchange(server, get("/readyz", "X-Forwarded-For: 203.0.113.9"))
        assert (remote[0], json.loads(remote[2])) == (200, {"ready": True})


async def test_what_is_not_a_page_gets_its_status_code(sqlite_store) -> None:
    async with status_server(sqlite_store) as server:
        assert (await exchange(server, get("/admin")))[0] == 404
        assert (await exchange(server, get("/telegram/webhook")))[0] == 404
        status, headers, _ = await exchange(server, b"DELETE /readyz HTTP/1.1\r\n\r\n")
        assert (status, headers["Allow"]) == (405, "GET, HEAD")
        assert (await exchange(server, b"POST /readyz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"))[0] == 413
        assert (await exchange(server, b"GET /readyz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"))[0] == 413
        assert (await exchange(server, b"\x16\x03\x01\x02\x00garbage\r\n\r\n"))[0] == 400  # TLS to a plain port
        assert (await exchange(server, b"GET /readyz\r\n\r\n"))[0] == 400
        assert (await exchange(server, b"GET /readyz HTTP/1.1\r\nno colon here\r\n\r\n"))[0] == 400
        huge = get("/readyz", "X-Padding: " + "a" * 20_000)
        assert (await exchange(server, huge))[0] == 431
        # After all of that it still answers.
        assert (await exchange(server, get("/healthz")))[0] == 200


async def test_a_client_that_never_finishes_its_request_is_dropped(sqlite_store) -> None:
    async with status_server(sqlite_store) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n")  # and then nothing
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed after the read timeout
        writer.close()


async def test_a_stop_closes_connections_still_waiting(sqlite_store) -> None:
    server = StatusServer(StatusPages(StoreOnly(sqlite_store), HttpConfig(host="127.0.0.1", port=0)))  # 10 s timeout
    await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /readyz HTTP/1.1\r\n")
    await writer.drain()
    await asyncio.sleep(0.05)
    await asyncio.wait_for(server.stop(), 2)
    assert await asyncio.wait_for(reader.read(), 2) == b""
    writer.close()


async def test_not_accepting_says_not_ready(sqlite_store) -> None:
    async with status_server(sqlite_store) as server:
        await server.stop_intake()
        status, _, body = await exchange(server, get("/readyz"))
        assert status == 503 and json.loads(body)["accepting"] is False


class Broken(StoreOnly):
    def channels_started(self) -> dict[str, bool]:
        raise RuntimeError("a page that fails")


async def test_a_page_that_fails_is_a_500_and_the_server_goes_on(sqlite_store, caplog) -> None:
    server = StatusServer(StatusPages(Broken(sqlite_store), HttpConfig(host="127.0.0.1", port=0)))
    await server.start()
    try:
        assert (await exchange(server, get("/readyz")))[0] == 500
        assert "answering a request failed" in caplog.text
        assert (await exchange(server, get("/healthz")))[0] == 200
    finally:
        await server.stop()
