"""Which model APIs a server speaks, found cheaply, and the `api:` to suggest for a model.

Each API's endpoint (`/chat/completions`, `/responses`, `/messages` under the base URL) is sent
an empty JSON object with that API's own headers (its key header, Anthropic's version). Nothing
is generated: a server that has the route refuses the empty request by its validation (400,
422, or a 500 carrying a JSON error, as llama.cpp's server does); one without it answers 404
or 405. A refused key (401, 403) or no answer says nothing either way.

`gateway setup` picks the API it writes from these answers, and `gateway doctor` says when the
configured one is not among them, or when a model would lose its thinking and prompt caching
through Chat Completions while its server speaks its own API.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any, get_args

import httpx

from gateway.config.core import Api
from gateway.config.redaction import redact_url
from gateway.llm.formats import format_for

APIS: tuple[Api, ...] = get_args(Api)  # chat, responses, anthropic: the order a suggestion prefers
PATHS: dict[Api, str] = {"chat": "/chat/completions", "responses": "/responses", "anthropic": "/messages"}
PROBE_TIMEOUT_S = 10.0
OPENAI_REASONING = ("o1", "o3", "o4", "gpt-5")  # OpenAI's reasoning model families
NOT_THERE = (404, 405, 501)
# What a server says of a route it does not have when it answers with another status (LM Studio
# answers 200 with "Unexpected endpoint or method").
NO_ROUTE = re.compile(r"unexpected endpoint|no route|unknown (url|endpoint|path)|invalid url|page not found", re.I)


@dataclass(frozen=True)
class ApiAnswer:
    """What one API's endpoint answered: `speaks` True (the route is there), False (it is not)
    or None (no telling: the key was refused, or no answer)."""

    api: Api
    url: str
    speaks: bool | None
    detail: str  # e.g. "HTTP 400", "HTTP 404", "ConnectError"


def _headers(api: Api, api_key: str) -> dict[str, str]:
    try:
        return format_for(api).headers(api_key)
    except ValueError:  # an API without an adapter in this build: its key goes as a bearer token
        return {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}


async def _ask(http: httpx.AsyncClient, base_url: str, api: Api, api_key: str) -> ApiAnswer:
    url = base_url.rstrip("/") + PATHS[api]
    try:
        response = await http.post(url, content=b"{}", headers=_headers(api, api_key), timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return ApiAnswer(api, url, None, type(exc).__name__)
    status = response.status_code
    detail = f"HTTP {status}"
    if status in NOT_THERE or NO_ROUTE.search(response.text[:500]):
        return ApiAnswer(api, url, False, detail)
    if status in (401, 403):
        return ApiAnswer(api, url, None, f"{detail}, the key refused")
    if status < 500:
        return ApiAnswer(api, url, True, detail)
    return ApiAnswer(api, url, True if _json_error(response) else None, detail)


def _json_error(response: httpx.Response) -> bool:
    """A 5xx that carries a JSON error came from the API's own handler, not a proxy in front."""
    try:
        body: Any = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and ("error" in body or body.get("type") == "error")


async def probe_apis(
    base_url: str, api_key: str = "", *, transport: httpx.AsyncBaseTransport | None = None
) -> dict[Api, ApiAnswer]:
    """Every API's answer to an empty request, asked at once."""
    async with httpx.AsyncClient(transport=transport, follow_redirects=False) as http:
        answers = await asyncio.gather(*(_ask(http, base_url, api, api_key) for api in APIS))
    return {answer.api: answer for answer in answers}


def spoken(answers: dict[Api, ApiAnswer]) -> list[Api]:
    return [api for api in APIS if answers[api].speaks]


def native_api(model: str, base_url: str, answers: dict[Api, ApiAnswer]) -> Api | None:
    """The model's own API when its server speaks it: Anthropic's for a Claude model (Chat
    Completions drops its thinking and cache breakpoints), Responses for an OpenAI reasoning
    model on OpenAI's API (Chat Completions drops its reasoning items between tool calls)."""
    name = model.lower().rsplit("/", 1)[-1]
    if "claude" in name and answers["anthropic"].speaks:
        return "anthropic"
    openai = httpx.URL(base_url).host == "api.openai.com"
    if openai and name.startswith(OPENAI_REASONING) and answers["responses"].speaks:
        return "responses"
    return None


def suggest_api(model: str, base_url: str, answers: dict[Api, ApiAnswer], current: Api = "chat") -> Api | None:
    """The `api:` for this model on this server: its own API when spoken there, else the one
    configured when spoken, else the first spoken (chat, responses, anthropic); None: none is."""
    if native := native_api(model, base_url, answers):
        return native
    speaks = spoken(answers)
    if current in speaks:
        return current
    return speaks[0] if speaks else None


@dataclass(frozen=True)
class ApiFinding:
    """One line of doctor: "ok" (the configured API is right here), "warn" (it works, but the
    model's own API keeps more), "fail" (the server does not speak it) or "unknown"."""

    status: str
    found: str
    fix: str = ""


def judge(configured: Api, model: str, base_url: str, answers: dict[Api, ApiAnswer], setting: str) -> ApiFinding:
    """The configured API against what the server speaks; `setting` names it (llm.api, or
    llm.models.<name>.api) in the fix."""
    speaks = spoken(answers)
    where = redact_url(base_url.rstrip("/"))
    mine = answers[configured]
    others = [api for api in speaks if api != configured]
    also = f" (it also speaks {', '.join(others)})" if others else ""
    if mine.speaks:
        native = native_api(model, base_url, answers)
        if native is not None and native != configured:
            keeps = "its thinking and prompt caching" if native == "anthropic" else "its reasoning between tool calls"
            return ApiFinding(
                "warn", f"{configured} works at {where}, but {model} loses {keeps} through it{also}",
                f"set {setting}: {native}",
            )
        return ApiFinding("ok", f"{setting}: {configured}; {where} speaks it{also}")
    if mine.speaks is None and not speaks:
        return ApiFinding("unknown", f"{mine.url} answered {mine.detail}: what the server speaks is not known")
    if not speaks:
        tried = ", ".join(f"{PATHS[api]} {answers[api].detail}" for api in APIS)
        return ApiFinding(
            "fail", f"{where} answers none of the model APIs ({tried})",
            "check llm.base_url: the address the server's docs give for its OpenAI- or Anthropic-compatible API",
        )
    suggestion = suggest_api(model, base_url, answers, configured) or speaks[0]
    return ApiFinding(
        "fail", f"{setting} is {configured}, but {mine.url} answered {mine.detail}; {where} speaks {', '.join(speaks)}",
        f"set {setting}: {suggestion}",
    )
