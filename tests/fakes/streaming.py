"""File bodies sent the way real servers send them: in many small writes with pauses, so a
client that takes one read for the whole body gets only its first part.

Slack's and Telegram's file servers stream large files; a fake that answers with one buffered
write hides a reader that stops at whatever has arrived so far.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

CHUNK = 16 * 1024  # bytes a write: what a TLS record or a proxy's buffer hands on at a time


async def streamed(
    request: web.Request, body: bytes, content_type: str, *, declare_length: bool = True
) -> web.StreamResponse:
    """`body` in CHUNK-sized writes with a short pause after each; with `declare_length` the
    Content-Length header is set (Slack's files), else the body is chunked (no length)."""
    response = web.StreamResponse(headers={"Content-Type": content_type})
    if declare_length:
        response.content_length = len(body)
    else:
        response.enable_chunked_encoding()
    await response.prepare(request)
    try:
        for start in range(0, len(body), CHUNK):
            await response.write(body[start : start + CHUNK])
            await asyncio.sleep(0.001)  # let the client's read see a partial body
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client stopped reading (a file over its limit): what a real server sees too
    return response
