"""Text to speech through an OpenAI-compatible `POST {base_url}/audio/speech` (OpenAI, LiteLLM,
LocalAI, Kokoro-FastAPI, openedai-speech, Speaches): JSON in, the audio's bytes out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import httpx

from gateway.llm.errors import LLMError, classify_error
from gateway.llm.wire import json_or_text, transport_error

AudioFormat = Literal["opus", "mp3", "aac", "flac", "wav"]
# What each format is as a file: Telegram plays Ogg Opus (and MP3) as a voice note.
FORMATS: dict[str, tuple[str, str]] = {
    "opus": ("audio/ogg", "ogg"),
    "mp3": ("audio/mpeg", "mp3"),
    "aac": ("audio/aac", "aac"),
    "flac": ("audio/flac", "flac"),
    "wav": ("audio/wav", "wav"),
}


@dataclass(frozen=True)
class Speech:
    audio: bytes
    mime: str
    extension: str
    chars: int  # the characters spoken (what the request is billed by)


async def request_speech(
    http: httpx.AsyncClient,
    base_url: str,
    api_key: str,
    *,
    model: str,
    text: str,
    voice: str,
    audio_format: AudioFormat,
    timeout_s: float,
) -> Speech:
    """The spoken `text`; `LLMError` when the server refuses, cannot be reached, takes longer
    than `timeout_s` or answers with something that is not audio."""
    url = base_url.rstrip("/") + "/audio/speech"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model, "input": text, "voice": voice, "response_format": audio_format}
    try:
        response = await http.post(url, json=body, headers=headers, timeout=timeout_s)
    except httpx.TransportError as exc:
        raise transport_error(exc, url) from exc
    if response.status_code != 200:
        raise classify_error(response.status_code, json_or_text(response.content), response.headers)
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind.startswith(("application/json", "text/")) or not response.content:
        # a proxy's or a server's error page with a 200: not something to send as a voice note
        raise LLMError(f"the speech answer is not audio ({kind or 'no content type'}, {len(response.content)} bytes)",
                       kind="server")
    mime, extension = FORMATS[audio_format]
    return Speech(response.content, mime, extension, len(text))
