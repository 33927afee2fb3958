"""A stdio MCP server's standard error: each line goes to the gateway's log under the server's
name, and the last lines are kept, so a server that exits at start (a bad argument, a missing
repository, a crash on import) says why in its state instead of only "Connection closed".
A line is redacted before it is logged, kept or cut (gateway/config/redaction.py): a server
that echoes its arguments or environment (a usage message) must not put its key in the log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Iterable
from typing import Any

from gateway.config.redaction import redact_error

log = logging.getLogger(__name__)
KEEP_LINES = 4
LINE_CHARS = 200
SETTLE_S = 0.5  # after the process ended, how long its last lines may take to be read


class ServerStderr:
    def __init__(self, server: str, secrets: Iterable[str] = ()):
        self.server = server
        self.secrets = frozenset(secrets)  # the server's configured secrets, scrubbed from every line
        self.lines: deque[str] = deque(maxlen=KEEP_LINES)
        read_fd, write_fd = os.pipe()
        self.file = os.fdopen(write_fd, "w")  # given to the process as its stderr
        self._read = os.fdopen(read_fd, "rb", buffering=0)
        self._pipe: asyncio.BaseTransport | None = None
        self._pump: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ServerStderr:
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        self._pipe, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), self._read)
        self._pump = asyncio.create_task(self._forward(reader), name=f"mcp-{self.server}-stderr")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.spawned()
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        if self._pipe is not None:
            self._pipe.close()

    def spawned(self) -> None:
        """The process holds its own copy of the pipe now: closing ours lets its exit end the
        stream."""
        if not self.file.closed:
            self.file.close()

    async def last_words(self) -> str:
        """The last lines the process wrote, once it has ended (waited for briefly)."""
        self.spawned()
        if self._pump is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._pump), SETTLE_S)
        return " | ".join(self.lines)

    async def _forward(self, reader: asyncio.StreamReader) -> None:
        while line := await reader.readline():
            text = redact_error(line.decode(errors="replace").rstrip(), self.secrets)
            if text:
                self.lines.append(text if len(text) <= LINE_CHARS else text[: LINE_CHARS - 1] + "…")
                log.info("MCP %s: %s", self.server, text)
