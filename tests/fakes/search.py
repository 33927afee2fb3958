"""Fake search providers on 127.0.0.1 (aiohttp, random port), each speaking its real API:

- SearXNG: `GET /search?q=…&format=json` -> {query, number_of_results, results[{url, title,
  content, engine, engines, parsed_url, positions, score, category, ...}], answers, corrections,
  infoboxes, suggestions, unresponsive_engines}; a format the instance does not serve is a 403
  with an HTML page, its limiter a 429 with a plain-text body.
- Brave: `GET /res/v1/web/search?q=…&count=N` with `X-Subscription-Token` -> {type: "search",
  query{original, ...}, mixed, web{type, results[{title, url, description (with <strong>
  marks), profile, meta_url, page_age, ...}]}}; errors as {"type": "ErrorResponse", "error":
  {id, status, code, detail, meta}, "time"}: a bad token is a 422 SUBSCRIPTION_TOKEN_INVALID, a
  missing one a 422 VALIDATION, the rate limit a 429 RATE_LIMITED with X-RateLimit-* headers.
- Tavily: `POST /search` with `Authorization: Bearer <key>` and {query, max_results, ...} ->
  {query, follow_up_questions, answer, images, results[{url, title, content, score,
  raw_content}], response_time, request_id}; errors as {"detail": {"error": "..."}} (401 a bad
  key, 400 a bad body, 429 the rate limit, 432 the plan's limit).

    async with FakeSearch(key="BSA-test") as fake:
        fake.index = [Doc("Tidal power", "https://en.wikipedia.org/wiki/Tidal_power", "Tidal power is ...")]
        fake.failure = "rate_limit"   # the next answers fail so, until set back to None
        fake.delay = 2.0              # seconds before each answer (a slow provider)

Every request is kept in `fake.requests` (method, path, query, headers, json body).
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from aiohttp import web

Failure = Literal["bad_key", "rate_limit", "usage_limit", "server_error", "not_json", "redirect", "json_off"]


@dataclass(frozen=True)
class Doc:
    title: str
    url: str
    text: str


@dataclass
class SeenRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    json: Any = None


DEFAULT_INDEX = [
    Doc("Tidal power - Wikipedia", "https://en.wikipedia.org/wiki/Tidal_power",
        "Tidal power or tidal energy is harnessed by converting energy from tides into useful forms of power, "
        "mainly electricity, using various methods."),
    Doc("Sihwa Lake Tidal Power Station", "https://en.wikipedia.org/wiki/Sihwa_Lake_Tidal_Power_Station",
        "The Sihwa Lake Tidal Power Station is the world's largest tidal power installation, with a total "
        "power output capacity of 254 MW."),
    Doc("How tidal energy works | Ocean Power Weekly", "https://opw.example/tidal",
        "Tides are predictable years in advance, which makes tidal plants attractive for grid operators."),
    Doc("Tidal stream generator", "https://en.wikipedia.org/wiki/Tidal_stream_generator",
        "A tidal stream generator, often referred to as a tidal energy converter, is a machine that extracts "
        "energy from moving masses of water."),
]


@dataclass
class FakeSearch:
    key: str = "test-search-key"
    index: list[Doc] = field(default_factory=lambda: list(DEFAULT_INDEX))
    failure: Failure | None = None
    delay: float = 0.0
    requests: list[SeenRequest] = field(default_factory=list)
    base_url: str = ""
    _runner: web.AppRunner | None = None

    async def __aenter__(self) -> FakeSearch:
        app = web.Application()
        app.router.add_get("/search", self._searxng)
        app.router.add_get("/res/v1/web/search", self._brave)
        app.router.add_post("/search", self._tavily)
        app.router.add_get("/elsewhere", self._elsewhere)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # the endpoints as `search.url` names them
    @property
    def searxng_url(self) -> str:
        return self.base_url

    @property
    def brave_url(self) -> str:
        return f"{self.base_url}/res/v1/web/search"

    @property
    def tavily_url(self) -> str:
        return f"{self.base_url}/search"

    # --- what every endpoint shares -------------------------------------------------------

    async def _seen(self, request: web.Request) -> SeenRequest:
        body = await request.json() if request.can_read_body and request.content_type == "application/json" else None
        seen = SeenRequest(request.method, request.path, dict(request.query), dict(request.headers), body)
        self.requests.append(seen)
        if self.delay:
            await asyncio.sleep(self.delay)
        return seen

    def matches(self, query: str) -> list[Doc]:
        words = [w for w in re.findall(r"\w+", query.lower()) if len(w) > 2]
        return [d for d in self.index if any(w in f"{d.title} {d.text}".lower() for w in words)]

    def _common_failure(self) -> web.Response | None:
        if self.failure == "server_error":
            return web.Response(status=502, text="<html><body><h1>502 Bad Gateway</h1></body></html>",
                                content_type="text/html")
        if self.failure == "not_json":
            return web.Response(text="<html><body>maintenance</body></html>", content_type="text/html")
        if self.failure == "redirect":
            return web.Response(status=302, headers={"Location": f"{self.base_url}/elsewhere?token={self.key}"})
        return None

    async def _elsewhere(self, request: web.Request) -> web.Response:
        self.requests.append(SeenRequest(request.method, request.path, dict(request.query), dict(request.headers)))
        return web.json_response({"results": []})

    # --- SearXNG ----------------------------------------------------------------------------

    async def _searxng(self, request: web.Request) -> web.Response:
        seen = await self._seen(request)
        if (failed := self._common_failure()) is not None:
            return failed
        if seen.query.get("format") != "json" or self.failure == "json_off":
            return web.Response(status=403, text="<!DOCTYPE html><html><head><title>403 Forbidden</title></head>"
                                "<body><h1>Forbidden</h1></body></html>", content_type="text/html")
        if self.failure == "rate_limit":
            return web.Response(status=429, text="Too Many Requests", content_type="text/plain")
        query = seen.query.get("q", "")
        found = self.matches(query)
        results = [
            {
                "url": d.url, "title": d.title, "content": d.text, "thumbnail": "", "engine": "duckduckgo",
                "template": "default.html", "parsed_url": list(_parsed(d.url)), "img_src": "", "priority": "",
                "engines": ["duckduckgo", "wikipedia"], "positions": [i + 1, i + 2], "score": round(2.0 / (i + 1), 3),
                "category": "general", "publishedDate": None,
            }
            for i, d in enumerate(found)
        ]
        return web.json_response({
            "query": query, "number_of_results": 0, "results": results, "answers": [], "corrections": [],
            "infoboxes": [], "suggestions": [f"{query} definition"], "unresponsive_engines": [["google", "timeout"]],
        })

    # --- Brave ------------------------------------------------------------------------------

    async def _brave(self, request: web.Request) -> web.Response:
        seen = await self._seen(request)
        if (failed := self._common_failure()) is not None:
            return failed
        token = seen.headers.get("X-Subscription-Token")
        if token is None:
            return _brave_error(422, "VALIDATION", "Unable to validate request parameter(s)",
                                {"errors": [{"type": "missing", "loc": ["header", "x-subscription-token"],
                                             "msg": "Field required"}]})
        if token != self.key or self.failure == "bad_key":
            return _brave_error(422, "SUBSCRIPTION_TOKEN_INVALID", "The provided subscription token is invalid.",
                                {"component": "authentication"})
        if self.failure in ("rate_limit", "usage_limit"):
            code, detail = (("RATE_LIMITED", "Request rate limit exceeded for plan.") if self.failure == "rate_limit"
                            else ("QUOTA_LIMITED", "Request quota limit exceeded for plan."))
            reply = _brave_error(429, code, detail, {"plan": "Free", "rate_limit": 1, "rate_current": 2,
                                                     "quota_limit": 2000, "quota_current": 7,
                                                     "component": "rate_limiter"})
            reply.headers.update({"X-RateLimit-Limit": "1, 2000", "X-RateLimit-Policy": "1;w=1, 2000;w=2592000",
                                  "X-RateLimit-Remaining": "0, 1993", "X-RateLimit-Reset": "1, 1419704"})
            return reply
        query, count = seen.query.get("q", ""), seen.query.get("count", "20")
        if not query or len(query) > 400 or not count.isdigit() or not 1 <= int(count) <= 20:
            return _brave_error(422, "VALIDATION", "Unable to validate request parameter(s)",
                                {"errors": [{"loc": ["query", "count" if query else "q"], "msg": "invalid"}]})
        found = self.matches(query)[: int(count)]
        payload: dict[str, Any] = {
            "query": {"original": query, "show_strict_warning": False, "is_navigational": False,
                      "is_news_breaking": False, "spellcheck_off": True, "country": "us", "bad_results": False,
                      "should_fallback": False, "postal_code": "", "city": "", "header_country": "",
                      "more_results_available": len(found) == int(count), "state": ""},
            "mixed": {"type": "mixed", "main": [{"type": "web", "index": i, "all": False} for i in range(len(found))],
                      "top": [], "side": []},
            "type": "search",
        }
        if found:  # with no web result Brave leaves the section out
            payload["web"] = {"type": "search", "family_friendly": True, "results": [
                _brave_result(d, query) for d in found
            ]}
        return web.json_response(payload, headers={"X-RateLimit-Remaining": "0, 1999"})

    # --- Tavily -----------------------------------------------------------------------------

    async def _tavily(self, request: web.Request) -> web.Response:
        seen = await self._seen(request)
        if (failed := self._common_failure()) is not None:
            return failed
        if seen.headers.get("Authorization") != f"Bearer {self.key}" or self.failure == "bad_key":
            return _tavily_error(401, "Unauthorized: missing or invalid API key.")
        if self.failure == "rate_limit":
            return _tavily_error(429, "Your request has been blocked due to excessive requests. Please reduce the "
                                      "rate of requests.")
        if self.failure == "usage_limit":
            return _tavily_error(432, "This request exceeds your plan's set usage limit. Please upgrade your plan "
                                      "or contact support@tavily.com")
        body = seen.json if isinstance(seen.json, dict) else {}
        query, wanted = body.get("query"), body.get("max_results", 5)
        if not isinstance(query, str) or not query.strip():
            return _tavily_error(400, "Query is missing.")
        if not isinstance(wanted, int) or not 0 <= wanted <= 20:
            return _tavily_error(400, "max_results must be between 0 and 20.")
        started = time.monotonic()
        found = self.matches(query)[:wanted]
        return web.json_response({
            "query": query, "follow_up_questions": None, "answer": None, "images": [],
            "results": [{"url": d.url, "title": d.title, "content": d.text, "score": round(0.9 - i * 0.1, 3),
                         "raw_content": None} for i, d in enumerate(found)],
            "response_time": round(time.monotonic() - started + 0.8, 2), "request_id": str(uuid.uuid4()),
        })


def _parsed(url: str) -> tuple[str, ...]:
    parts = urlsplit(url)
    return (parts.scheme, parts.netloc, parts.path, "", parts.query, parts.fragment)


def _brave_result(doc: Doc, query: str) -> dict[str, Any]:
    parts = urlsplit(doc.url)
    marked = doc.text
    for word in {w for w in re.findall(r"\w+", query) if len(w) > 2}:
        marked = re.sub(rf"\b({re.escape(word)})\b", r"<strong>\1</strong>", marked, flags=re.IGNORECASE)
    return {
        "title": doc.title, "url": doc.url, "is_source_local": False, "is_source_both": False,
        "description": marked, "page_age": "2024-11-02T08:15:00", "language": "en", "family_friendly": True,
        "type": "search_result", "subtype": "generic", "is_live": False,
        "profile": {"name": parts.hostname, "url": doc.url, "long_name": parts.hostname,
                    "img": "https://imgs.search.brave.com/favicon.png"},
        "meta_url": {"scheme": parts.scheme, "netloc": parts.netloc, "hostname": parts.hostname,
                     "favicon": "https://imgs.search.brave.com/favicon.png",
                     "path": " › ".join([""] + [p for p in parts.path.split("/") if p]).strip()},
        "age": "November 2, 2024",
    }


def _brave_error(status: int, code: str, detail: str, meta: dict[str, Any]) -> web.Response:
    return web.json_response({
        "type": "ErrorResponse",
        "error": {"id": str(uuid.uuid4()), "status": status, "code": code, "detail": detail, "meta": meta},
        "time": int(time.time()),
    }, status=status)


def _tavily_error(status: int, message: str) -> web.Response:
    return web.json_response({"detail": {"error": message}}, status=status)
