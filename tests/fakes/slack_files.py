"""Files people share in the fake Slack: `url_private` downloads that need the bot token, and
files.info for a file that was still being processed when its message came.

Bodies are streamed in many small writes, as Slack's file servers send large files.
Strict like Slack: a download without a valid `Authorization: Bearer <bot token>` gets the
HTML sign-in page with status 200 (what Slack really does), not an error code.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from aiohttp import web

from fakes.streaming import streamed

SIGN_IN_PAGE = "<!DOCTYPE html><html><head><title>Slack</title></head><body>Sign in to Slack</body></html>"


class SharedFiles:
    def __init__(self, token: str) -> None:
        self.token = token
        self.url = ""
        self.content: dict[str, bytes] = {}
        self.info: dict[str, dict[str, Any]] = {}
        self.downloads: list[tuple[str, str]] = []  # (file id, Authorization header) of each request
        self._ids = itertools.count(1)
        self._failures = 0
        self._open = asyncio.Event()
        self._open.set()
        self.declare_length = True  # False: bodies come chunked, without a Content-Length

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/files-pri/{team_file}/{name}", self._download)

    def share(
        self,
        content: bytes,
        name: str,
        mimetype: str,
        *,
        size: int | None = None,
        processing: bool = False,
        **fields: Any,
    ) -> dict[str, Any]:
        """The file object of a message event. `processing`: Slack sends only the id and
        `file_access: check_file_info`; files.info has the URLs. `fields`: more of the file
        object (an audio clip's `subtype` and `duration_ms`)."""
        file_id = f"F{next(self._ids):08d}"
        url = f"{self.url}/files-pri/T1-{file_id}/{name}"
        self.content[file_id] = content
        self.info[file_id] = {
            "id": file_id,
            "name": name,
            "title": name,
            "mimetype": mimetype,
            "filetype": name.rsplit(".", 1)[-1],
            "size": len(content) if size is None else size,
            "url_private": url,
            "url_private_download": url + "?download=1",
            "mode": "hosted",
            **fields,
        }
        if processing:
            return {"id": file_id, "mode": "hosted", "file_access": "check_file_info"}
        return dict(self.info[file_id])

    def fail_downloads(self, times: int) -> None:
        self._failures += times

    def files_info(self, params: dict[str, Any]) -> dict[str, Any]:
        from fakes.slack import SlackError

        info = self.info.get(str(params.get("file", "")))
        if info is None:
            raise SlackError("file_not_found")
        return {"file": dict(info)}

    async def _download(self, request: web.Request) -> web.Response:
        file_id = request.match_info["team_file"].split("-", 1)[-1]
        auth = request.headers.get("Authorization", "")
        self.downloads.append((file_id, auth))
        if auth != f"Bearer {self.token}":
            return web.Response(text=SIGN_IN_PAGE, content_type="text/html")
        if file_id not in self.content:
            return web.Response(status=404, text="file not found")
        await self._open.wait()
        if self._failures > 0:
            self._failures -= 1
            return web.Response(status=503, text="Service Unavailable")
        mimetype = self.info[file_id]["mimetype"]
        return await streamed(request, self.content[file_id], mimetype, declare_length=self.declare_length)
