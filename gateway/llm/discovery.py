"""What the model server says about itself: the context window and a tokenizer.

`llm.context_window: auto` asks the server once per model (the answer is cached by the client):
- llama.cpp's server: `GET /props` -> `default_generation_settings.n_ctx` (or `n_ctx`);
- vLLM: `GET /v1/models` -> the model's `max_model_len` (OpenRouter and LM Studio put
  `context_length` / `max_context_length` there);
- LM Studio: `GET /api/v0/models/<model>` -> `loaded_context_length`, else `max_context_length`;
- Ollama: `POST /api/show` -> `num_ctx` in `parameters`; without it Ollama serves
  `OLLAMA_DEFAULT_CTX` tokens (and silently drops the start of longer prompts), so the window
  is at most that even when the model's `<arch>.context_length` is larger;
- llama-cpp-python (it has none of these): one prompt longer than any window, sent without
  streaming, which it refuses before evaluating with "maximum context length is N tokens".
- OpenAI (api.openai.com says nothing): the documented windows of its model families;
- Anthropic (api.anthropic.com says nothing either): the documented window of Claude models.
When nothing answers, the window is `FALLBACK_WINDOW`, and a log line says so.

Token counts without usage chunks use the server's own tokenizer where it has one
(llama.cpp `POST /tokenize`, llama-cpp-python `POST /extras/tokenize/count`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.llm.errors import ContextTooLong, classify_error

log = logging.getLogger(__name__)

FALLBACK_WINDOW = 8_192
OLLAMA_DEFAULT_CTX = 4_096
PROBE_TOKENS = 1 << 18  # more than any llama-cpp-python window in use; refused before evaluation
PROBE_TIMEOUT_S = 30.0
_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)", re.M)
# OpenAI's documented context windows by model family (longest prefix first wins).
OPENAI_WINDOWS = (
    ("gpt-4.1", 1_047_576),
    ("gpt-5", 400_000),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("o4-mini", 200_000),
    ("o3", 200_000),
    ("o1", 200_000),
    ("gpt-3.5-turbo", 16_385),
)
ANTHROPIC_WINDOW = 200_000  # every Claude model's documented window (1M only with a beta header)


@dataclass(frozen=True)
class Window:
    tokens: int
    source: str  # where it was found, for logs and `gateway doctor`

    @property
    def discovered(self) -> bool:
        return self.source != "fallback"


@dataclass(frozen=True)
class Tokenizer:
    """A tokenizer endpoint of the server: `kind` is "llama.cpp" or "llama-cpp-python"."""

    url: str
    kind: str


class ServerInfo:
    """Discovery against one server (`base_url` ends in /v1 or similar; the root is above it)."""

    def __init__(self, http: httpx.AsyncClient | Callable[[], httpx.AsyncClient], base_url: str) -> None:
        # A callable gives the client when first asked: making one costs tens of ms at a start.
        self._http = http
        self.base = base_url.rstrip("/")
        self.root = re.sub(r"/v\d+$", "", self.base)

    @property
    def http(self) -> httpx.AsyncClient:
        return self._http if isinstance(self._http, httpx.AsyncClient) else self._http()

    async def window(self, model: str) -> Window:
        probes: list[Callable[[str], Awaitable[Window | None]]] = [
            self._openai,
            self._anthropic,
            self._llamacpp_props,
            self._models_list,
            self._lmstudio,
            self._ollama,
            self._llama_cpp_python,
        ]
        for probe in probes:
            try:
                found = await probe(model)
            except (httpx.HTTPError, ValueError, TypeError, KeyError) as exc:
                log.debug("context window probe %s failed: %s", probe.__name__, exc)
                continue
            if found is not None and found.tokens > 0:
                log.debug("context window of %s: %s tokens (%s)", model, found.tokens, found.source)
                return found
        log.warning(
            "the server at %s did not say the context window of %s: assuming %s tokens "
            "(set llm.context_window to the real value)",
            self.base,
            model,
            FALLBACK_WINDOW,
        )
        return Window(FALLBACK_WINDOW, "fallback")

    async def tokenizer(self) -> Tokenizer | None:
        """The server's tokenizer endpoint, if it has one (tried with a short text)."""
        candidates = (
            (f"{self.root}/tokenize", {"content": "a"}, "llama.cpp"),
            (f"{self.root}/extras/tokenize/count", {"input": "a"}, "llama-cpp-python"),
        )
        for url, body, kind in candidates:
            try:
                response = await self.http.post(url, json=body)
            except httpx.HTTPError:
                continue
            if response.status_code == 200 and _token_count(response.json()) is not None:
                return Tokenizer(url, kind)
        return None

    async def count(self, tokenizer: Tokenizer, text: str, model: str) -> int | None:
        body = {"content": text} if tokenizer.kind == "llama.cpp" else {"input": text, "model": model}
        response = await self.http.post(tokenizer.url, json=body)
        return _token_count(response.json()) if response.status_code == 200 else None

    # ---- the probes ------------------------------------------------------------------------
    async def _get(self, url: str) -> Any:
        response = await self.http.get(url)
        return response.json() if response.status_code == 200 else None

    async def _openai(self, model: str) -> Window | None:
        if httpx.URL(self.base).host != "api.openai.com":
            return None
        for prefix, tokens in OPENAI_WINDOWS:
            if model.startswith(prefix):
                return Window(tokens, f"OpenAI's documented window for {prefix}")
        return None

    async def _anthropic(self, model: str) -> Window | None:
        if httpx.URL(self.base).host != "api.anthropic.com" or not model.startswith("claude"):
            return None
        return Window(ANTHROPIC_WINDOW, "Anthropic's documented window for Claude models")

    async def _llamacpp_props(self, model: str) -> Window | None:
        props = await self._get(f"{self.root}/props")
        if not isinstance(props, dict):
            return None
        settings = props.get("default_generation_settings") or {}
        n_ctx = _int(settings.get("n_ctx")) or _int(props.get("n_ctx"))
        return Window(n_ctx, "llama.cpp /props n_ctx") if n_ctx else None

    async def _models_list(self, model: str) -> Window | None:
        listing = await self._get(f"{self.base}/models")
        entry = _model_entry(listing, model)
        if entry is None:
            return None
        for key, source in (
            ("max_model_len", "vLLM /v1/models max_model_len"),
            ("loaded_context_length", "/v1/models loaded_context_length"),
            ("context_length", "/v1/models context_length"),
            ("max_context_length", "/v1/models max_context_length"),
        ):
            if tokens := _int(entry.get(key)):
                return Window(tokens, source)
        return None

    async def _lmstudio(self, model: str) -> Window | None:
        entry = await self._get(f"{self.root}/api/v0/models/{model}")
        if not isinstance(entry, dict):
            return None
        if tokens := _int(entry.get("loaded_context_length")):
            return Window(tokens, "LM Studio loaded_context_length")
        if tokens := _int(entry.get("max_context_length")):
            return Window(tokens, "LM Studio max_context_length")
        return None

    async def _ollama(self, model: str) -> Window | None:
        response = await self.http.post(f"{self.root}/api/show", json={"model": model})
        if response.status_code != 200:
            return None
        shown = response.json()
        if match := _NUM_CTX.search(str(shown.get("parameters") or "")):
            return Window(int(match.group(1)), "Ollama num_ctx")
        info = shown.get("model_info") or {}
        trained = next((_int(v) for k, v in info.items() if k.endswith(".context_length")), None)
        if trained:
            return Window(min(trained, OLLAMA_DEFAULT_CTX), f"Ollama default num_ctx (the model has {trained})")
        return None

    async def _llama_cpp_python(self, model: str) -> Window | None:
        """llama-cpp-python says its window only when refusing a prompt over it."""
        schema = await self._get(f"{self.root}/openapi.json")
        title = str(((schema or {}).get("info") or {}).get("title", ""))
        if "llama.cpp python" not in title.lower():
            return None
        body = {"model": model, "prompt": " x" * PROBE_TOKENS, "max_tokens": 1, "stream": False}
        response = await self.http.post(f"{self.base}/completions", json=body, timeout=PROBE_TIMEOUT_S)
        error = classify_error(response.status_code, response.json()) if response.status_code >= 400 else None
        if isinstance(error, ContextTooLong) and error.context_window:
            return Window(error.context_window, "llama-cpp-python's refusal of an over-long prompt")
        return None


def _model_entry(listing: Any, model: str) -> dict[str, Any] | None:
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        return None
    entries = [e for e in data if isinstance(e, dict)]
    for entry in entries:
        if entry.get("id") == model:
            return entry
    return entries[0] if len(entries) == 1 else None


def _token_count(payload: Any) -> int | None:
    if not isinstance(payload, dict):
        return None
    if isinstance(payload.get("count"), int):
        return int(payload["count"])
    tokens = payload.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


def _int(value: Any) -> int:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else 0
    except (TypeError, ValueError):
        return 0
