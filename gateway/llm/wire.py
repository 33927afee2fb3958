"""What goes over the wire to the LLM server: the request body's encoding, the TLS a client
needs for the server's scheme, an error body read, a transport failure as an LLMError."""

from __future__ import annotations

import json
import ssl
from typing import Any

import httpx
import orjson

from gateway.config.redaction import redact_url
from gateway.llm.errors import LLMError


def tls_for(url: str) -> ssl.SSLContext | bool:
    """Every request goes to `llm.base_url`'s server. Over plain HTTP (a local llama.cpp or
    vLLM) TLS is never used, so the client gets a context without the trust store, whose
    loading is most of the cost of making a client; it verifies like the default and, having
    no trusted roots, refuses any certificate it is shown."""
    if httpx.URL(url).scheme == "https":
        return True
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and host names checked, no roots


def encode_body(body: dict[str, Any]) -> bytes:
    """The request body as the compact UTF-8 JSON that httpx's `json=` sends, about ten times
    faster on a long context; the standard encoder still takes what orjson refuses (non-str
    keys, integers past 64 bits)."""
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def json_or_text(raw: bytes) -> Any:
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def transport_error(exc: httpx.TransportError, url: str) -> LLMError:
    url = redact_url(url)  # the error goes to the log, the run's record and the console
    if isinstance(exc, httpx.TimeoutException):
        return LLMError(f"the LLM server at {url} timed out ({type(exc).__name__})", kind="timeout", retryable=True)
    detail = str(exc) or type(exc).__name__
    return LLMError(f"cannot reach the LLM server at {url}: {detail}", kind="connection", retryable=True)
