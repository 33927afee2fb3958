"""The search providers behind `web_search`: how each is asked and how its answer is read.

SearXNG: `GET <instance>/search?q=…&format=json` (JSON must be among the instance's
`search.formats`, else it answers 403); no count parameter, so its list is cut here.
Brave: `GET https://api.search.brave.com/res/v1/web/search?q=…&count=N` with the key in
`X-Subscription-Token`; results under `web.results`, snippets with `<strong>` marks; errors as
`{"type": "ErrorResponse", "error": {"code", "detail", "status", ...}}` (a bad key is a 422).
Tavily: `POST https://api.tavily.com/search` with a JSON body and `Authorization: Bearer <key>`;
results under `results` with `content`; errors as `{"detail": {"error": "..."}}` (401 a bad key,
429 the rate limit, 432/433 the plan's or the pay-as-you-go limit).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.config import SearchConfig

TITLE_CHARS = 200
SNIPPET_CHARS = 500
_TAG = re.compile(r"<[^>]{0,200}>")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    snippet: str


@dataclass(frozen=True)
class Provider:
    label: str
    request: Callable[[httpx.AsyncClient, SearchConfig, str, int], httpx.Request]
    hits: Callable[[Any], list[SearchHit]]
    problem: Callable[[int, Any], str]  # the provider's own words for a failed answer ("" if none)
    refused_key: Callable[[int, Any], bool]  # the answer says the key (or access) was refused
    limit_statuses: frozenset[int]  # the statuses of a rate or usage limit
    notes: Callable[[Any], str] = lambda payload: ""  # what else is worth saying (engines that failed)


def plain(text: Any, limit: int) -> str:
    """Markup and entities out, whitespace folded, cut at `limit` characters."""
    if not isinstance(text, str):
        return ""
    flat = _SPACE.sub(" ", html.unescape(_TAG.sub("", text))).strip()
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _hit(item: Any, snippet_key: str) -> SearchHit | None:
    if not isinstance(item, dict):
        return None
    url = item.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return None  # a result without a link to follow is no result
    return SearchHit(plain(item.get("title"), TITLE_CHARS) or url, url, plain(item.get(snippet_key), SNIPPET_CHARS))


def _hits(items: Any, snippet_key: str) -> list[SearchHit]:
    if not isinstance(items, list):
        raise ValueError("no result list in the answer")
    return [hit for item in items if (hit := _hit(item, snippet_key)) is not None]


# --- SearXNG ---------------------------------------------------------------------------------


def _searxng_request(client: httpx.AsyncClient, config: SearchConfig, query: str, count: int) -> httpx.Request:
    return client.build_request(
        "GET", config.endpoint, params={"q": query, "format": "json"}, headers={"Accept": "application/json"}
    )


def _searxng_hits(payload: Any) -> list[SearchHit]:
    return _hits(payload.get("results") if isinstance(payload, dict) else None, "content")


def _searxng_problem(status: int, payload: Any) -> str:
    if status == 403:
        return "JSON answers are off on this instance: add json to search.formats in its settings.yml"
    if status == 429:
        return "the instance's limiter refused the request (server.limiter in its settings.yml)"
    return ""


def _searxng_notes(payload: Any) -> str:
    failed = payload.get("unresponsive_engines") if isinstance(payload, dict) else None
    if not isinstance(failed, list) or not failed:
        return ""
    names = [" ".join(str(part) for part in entry) if isinstance(entry, list) else str(entry) for entry in failed]
    return "Engines that did not answer: " + "; ".join(plain(name, 100) for name in names[:10])


# --- Brave ----------------------------------------------------------------------------------


def _brave_request(client: httpx.AsyncClient, config: SearchConfig, query: str, count: int) -> httpx.Request:
    return client.build_request(
        "GET",
        config.endpoint,
        params={"q": query, "count": count},
        headers={"Accept": "application/json", "X-Subscription-Token": config.api_key},
    )


def _brave_hits(payload: Any) -> list[SearchHit]:
    if not isinstance(payload, dict):
        raise ValueError("the answer is not a JSON object")
    web = payload.get("web")
    if web is None:
        return []  # no web results at all (Brave leaves the section out)
    return _hits(web.get("results") if isinstance(web, dict) else None, "description")


def _brave_problem(status: int, payload: Any) -> str:
    if not isinstance(payload, dict):
        return ""
    error = payload.get("error")
    if error is None and isinstance(payload.get("errors"), list) and payload["errors"]:
        error = payload["errors"][0]  # the documented list form
    if not isinstance(error, dict):
        return ""
    code, detail = plain(error.get("code"), 80), plain(error.get("detail"), 300)
    return ": ".join(part for part in (code, detail) if part)


def _brave_refused_key(status: int, payload: Any) -> bool:
    # a bad or missing key is a 422 like a bad request; its code tells them apart
    return status in (401, 403) or "SUBSCRIPTION_TOKEN" in _brave_problem(status, payload)


# --- Tavily ---------------------------------------------------------------------------------


def _tavily_request(client: httpx.AsyncClient, config: SearchConfig, query: str, count: int) -> httpx.Request:
    return client.build_request(
        "POST",
        config.endpoint,
        json={"query": query, "max_results": count, "search_depth": "basic"},
        headers={"Authorization": f"Bearer {config.api_key}", "Accept": "application/json"},
    )


def _tavily_hits(payload: Any) -> list[SearchHit]:
    return _hits(payload.get("results") if isinstance(payload, dict) else None, "content")


def _tavily_problem(status: int, payload: Any) -> str:
    detail = payload.get("detail") if isinstance(payload, dict) else None
    if isinstance(detail, dict):
        return plain(detail.get("error"), 300)
    if isinstance(detail, str):
        return plain(detail, 300)
    return ""


def _statuses(*codes: int) -> Callable[[int, Any], bool]:
    return lambda status, payload: status in codes


PROVIDERS: dict[str, Provider] = {
    "searxng": Provider("SearXNG", _searxng_request, _searxng_hits, _searxng_problem, _statuses(401),
                        frozenset({429}), notes=_searxng_notes),
    "brave": Provider("Brave Search", _brave_request, _brave_hits, _brave_problem, _brave_refused_key,
                      frozenset({429})),
    # 432: the plan's monthly limit, 433: the pay-as-you-go limit
    "tavily": Provider("Tavily", _tavily_request, _tavily_hits, _tavily_problem, _statuses(401, 403),
                       frozenset({429, 432, 433})),
}
