"""Files of the fake Bot API: what people send (getFile, then GET /file/bot<token>/<path>) and
what the bot uploads (sendPhoto; sendDocument lives beside sendMessage).

Strict like Telegram: getFile refuses an unknown file id and anything over 20 MB ("file is
too big"); a download needs the right token in its path. `fail_downloads(n)` makes the next
n downloads answer 500; `hold_downloads()` makes them hang until `release_downloads()`, to
stand for a gateway that dies while fetching. Bodies are streamed in many small writes.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from fakes.streaming import streamed

GET_FILE_LIMIT = 20 * 1024 * 1024


@dataclass
class StoredFile:
    file_id: str
    content: bytes
    file_path: str
    size: int  # what Telegram reports (may be set larger than the content, for oversize tests)


class FakeFiles:
    def __init__(self, token: str) -> None:
        self.token = token
        self.files: dict[str, StoredFile] = {}
        self.downloads: list[str] = []  # file ids whose download completed
        self.download_attempts: list[str] = []  # file ids whose download was requested
        self._ids = itertools.count(1)
        self._failures = 0
        self._open = asyncio.Event()
        self._open.set()
        self.download_started = asyncio.Event()

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)

    # --- scripting ---------------------------------------------------------------

    def add(self, content: bytes, folder: str = "documents", *, size: int | None = None, suffix: str = "") -> str:
        n = next(self._ids)
        file_id = f"F{n:04d}-{folder}"
        self.files[file_id] = StoredFile(
            file_id, content, f"{folder}/file_{n}{suffix}", len(content) if size is None else size
        )
        return file_id

    def photo(self, content: bytes, width: int, height: int, *, sizes: tuple[int, ...] = ()) -> list[dict[str, Any]]:
        """The PhotoSize list Telegram sends: a thumbnail, `sizes` (the longer side of each
        smaller copy, as Telegram makes 320, 800 and 1280 px ones: real JPEGs), the full size."""
        thumb = self.add(content[:64], "thumbnails", suffix=".jpg")
        scale = 90 / max(width, height)
        listed = [self._size(thumb, max(1, int(width * scale)), max(1, int(height * scale)))]
        for side in sizes:
            w, h = max(1, width * side // max(width, height)), max(1, height * side // max(width, height))
            listed.append(self._size(self.add(_scaled_jpeg(content, w, h), "photos", suffix=".jpg"), w, h))
        listed.append(self._size(self.add(content, "photos", suffix=".jpg"), width, height))
        return listed

    def _size(self, file_id: str, width: int, height: int) -> dict[str, Any]:
        return {
            "file_id": file_id,
            "file_unique_id": f"u{file_id}",
            "width": width,
            "height": height,
            "file_size": self.files[file_id].size,
        }

    def document(self, content: bytes, name: str, mime: str, *, size: int | None = None) -> dict[str, Any]:
        file_id = self.add(content, "documents", size=size)
        return {
            "file_id": file_id,
            "file_unique_id": f"u{file_id}",
            "file_name": name,
            "mime_type": mime,
            "file_size": self.files[file_id].size,
        }

    def voice(self, content: bytes, duration: int, mime: str = "audio/ogg") -> dict[str, Any]:
        file_id = self.add(content, "voice", suffix=".oga")
        return {
            "file_id": file_id,
            "file_unique_id": f"u{file_id}",
            "duration": duration,
            "mime_type": mime,
            "file_size": len(content),
        }

    def fail_downloads(self, times: int) -> None:
        self._failures += times

    def hold_downloads(self) -> None:
        self._open.clear()

    def release_downloads(self) -> None:
        self._open.set()

    # --- Bot API -------------------------------------------------------------------

    def get_file(self, params: dict[str, Any]) -> dict[str, Any]:
        stored = self.files.get(str(params.get("file_id", "")))
        if stored is None:
            raise LookupError("Bad Request: wrong file_id or the file is temporarily unavailable")
        result = {"file_id": stored.file_id, "file_unique_id": f"u{stored.file_id}", "file_size": stored.size}
        if stored.size > GET_FILE_LIMIT:
            raise LookupError("Bad Request: file is too big")
        return {**result, "file_path": stored.file_path}

    async def _download(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return web.json_response({"ok": False, "error_code": 404, "description": "Not Found"}, status=404)
        path = request.match_info["path"]
        stored = next((f for f in self.files.values() if f.file_path == path), None)
        if stored is None:
            return web.json_response({"ok": False, "error_code": 404, "description": "Not Found"}, status=404)
        self.download_attempts.append(stored.file_id)
        self.download_started.set()
        await self._open.wait()
        if self._failures > 0:
            self._failures -= 1
            return web.Response(status=500, text="Internal Server Error")
        self.downloads.append(stored.file_id)
        return await streamed(request, stored.content, "application/octet-stream")


def _scaled_jpeg(content: bytes, width: int, height: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.open(io.BytesIO(content)).convert("RGB").resize((width, height)).save(out, "JPEG")
    return out.getvalue()
