"""A real text-to-speech engine behind OpenAI's `/v1/audio/speech`: espeak-ng speaks the text
into WAV, opusenc makes it Ogg Opus (a Telegram voice note) and lame MP3. The tests that use it
skip, saying which program is missing, where these are not installed (`.ci/run` installs them
from the distribution: espeak-ng, opus-tools, lame)."""

from __future__ import annotations

import asyncio
import shutil

from aiohttp import web

ENCODERS = {"opus": ["opusenc", "--quiet", "-", "-"], "mp3": ["lame", "--quiet", "-", "-"], "wav": []}
CONTENT_TYPES = {"opus": "audio/ogg", "mp3": "audio/mpeg", "wav": "audio/wav"}


def missing() -> str:
    """Why the shim cannot run here ("" when it can)."""
    absent = [name for name in ("espeak-ng", "opusenc", "lame") if shutil.which(name) is None]
    return f"not installed: {', '.join(absent)} (apt-get install espeak-ng opus-tools lame)" if absent else ""


async def _run(command: list[str], data: bytes) -> bytes:
    process = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate(data)
    if process.returncode != 0:
        raise RuntimeError(f"{command[0]} failed: {err.decode(errors='replace')[:200]}")
    return out


class EspeakSpeech:
    """`async with EspeakSpeech() as tts:` then `tts.base_url` is an OpenAI-compatible base URL."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.base_url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> EspeakSpeech:
        app = web.Application()
        app.router.add_post("/v1/audio/speech", self._speak)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _speak(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        audio_format = body.get("response_format", "mp3")
        if audio_format not in ENCODERS:
            error = {"message": f"unsupported response_format {audio_format!r}", "type": "invalid_request_error"}
            return web.json_response({"error": error}, status=400)
        wav = await _run(["espeak-ng", "--stdin", "--stdout"], body["input"].encode())
        audio = await _run(ENCODERS[audio_format], wav) if ENCODERS[audio_format] else wav
        return web.Response(body=audio, content_type=CONTENT_TYPES[audio_format])
