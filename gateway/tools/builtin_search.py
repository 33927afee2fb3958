"""The web_search built-in: one query to the configured provider (`search.provider`), its results
as title, URL and snippet.

The request goes to `search.url` (or the provider's own endpoint): an address the operator wrote,
never one the model chose, so it is not put through web_fetch's SSRF check (a SearXNG on
127.0.0.1 is a normal deployment). What keeps that safe: the model sets only the query and the
count; redirects are not followed (one would carry the request, and the key, somewhere else);
the answer is read up to `search.max_response_bytes` and only the titles, URLs and snippets of
its results reach the model, never the rest of what the endpoint sent. Every text a call
returns is scrubbed of the key. The pages behind the results are web_fetch's, with its checks.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import httpx

from gateway.config import SearchConfig
from gateway.config.redaction import redact_url, scrub
from gateway.tools.registry import ToolContext, ToolError, ToolSpec, build_spec
from gateway.tools.search_providers import PROVIDERS, Provider, SearchHit

MAX_QUERY_CHARS = 400  # Brave's limit; a longer query is no search-box query anyway
_USER_AGENT = "chat-gateway-web-search/1"


def search_specs(config: SearchConfig) -> list[ToolSpec]:
    """`web_search` when a provider is configured, else nothing (the model is not offered a tool
    that can only fail)."""
    if config.provider == "none":
        return []
    provider = PROVIDERS[config.provider]

    async def web_search(ctx: ToolContext, query: str, count: int | None = None) -> str:
        """Search the web.

        Args:
            query: what to search for, in plain words as in a search box (at most 400 characters)
            count: how many results to return
        """
        return await search(config, provider, query, count)

    spec = build_spec(
        web_search,
        description=(
            f"Search the web ({provider.label}). Returns results as title, URL and snippet; "
            "read a result's page with web_fetch."
        ),
        classes={"network"},
        lod="head",
    )
    default = min(config.default_results, config.max_results)
    count_schema = spec.parameters["properties"]["count"]
    count_schema["description"] = f"how many results to return (1 to {config.max_results}; default {default})"
    return [spec]


async def search(config: SearchConfig, provider: Provider, query: str, count: int | None) -> str:
    query = " ".join(query.split())
    if not query:
        raise ToolError("query is empty: say what to search for")
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"query is {len(query)} characters long, at most {MAX_QUERY_CHARS} are searched: shorten it")
    limit = config.max_results
    wanted = min(config.default_results, limit) if count is None else count
    if wanted < 1:
        raise ToolError(f"count must be between 1 and {limit}, got {count}")
    capped = wanted > limit
    wanted = min(wanted, limit)
    secrets = _secrets(config)
    try:
        payload = await _ask(config, provider, query, wanted)
        hits = provider.hits(payload)[:wanted]
    except ToolError as exc:
        raise ToolError(scrub(str(exc), secrets)) from None
    except ValueError as exc:  # the answer's JSON is not in the provider's shape
        raise ToolError(f"{provider.label} answered in an unexpected shape ({exc}); it cannot be read") from None
    return scrub(render(query, provider, hits, provider.notes(payload), capped, limit), secrets)


async def _ask(config: SearchConfig, provider: Provider, query: str, count: int) -> Any:
    where = redact_url(config.endpoint)
    try:
        async with asyncio.timeout(config.timeout_s):
            async with httpx.AsyncClient(
                follow_redirects=False, trust_env=False, timeout=config.timeout_s,
                headers={"User-Agent": _USER_AGENT},
            ) as client:
                response = await client.send(provider.request(client, config, query, count), stream=True)
                try:
                    body = await _read(response, config.max_response_bytes, provider)
                finally:
                    await response.aclose()
    except TimeoutError:
        raise ToolError(
            f"{provider.label} did not answer within {config.timeout_s:g}s; try again later or answer without it"
        ) from None
    except httpx.HTTPError as exc:
        raise ToolError(f"{provider.label} at {where} cannot be reached: {type(exc).__name__}: {exc}") from None
    payload = _json(body)
    if response.status_code != 200:
        raise ToolError(_failure(provider, response, payload))
    if payload is None:
        raise ToolError(f"{provider.label} answered HTTP 200 with something that is not JSON; it cannot be read")
    return payload


async def _read(response: httpx.Response, cap: int, provider: Provider) -> bytes:
    if response.is_redirect:
        target = response.headers.get("location", "")
        raise ToolError(
            f"{provider.label} redirected the search to {redact_url(target) or 'another address'}; "
            "redirects are not followed (set search.url to the address that answers)"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise ToolError(f"{provider.label}'s answer is larger than search.max_response_bytes ({cap}); not read")
        chunks.append(chunk)
    return b"".join(chunks)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def _failure(provider: Provider, response: httpx.Response, payload: Any) -> str:
    status = response.status_code
    said = provider.problem(status, payload)
    what = f"HTTP {status} {response.reason_phrase}".rstrip() + (f": {said}" if said else "")
    if provider.refused_key(status, payload):
        return (
            f"{provider.label} refused the search key ({what}). Web search is unavailable until the operator "
            "fixes search.api_key: tell the user instead of searching again."
        )
    if status in provider.limit_statuses:
        return f"{provider.label} refused the search for a rate or usage limit ({what}){_retry_after(response)}. " \
               "Try again later or answer without searching."
    return f"{provider.label} failed to search ({what})."


def _retry_after(response: httpx.Response) -> str:
    """`; try again in N s`, from Retry-After or Brave's X-RateLimit-Reset ("1, 1419704": per second first)."""
    raw = response.headers.get("retry-after") or response.headers.get("x-ratelimit-reset") or ""
    first = raw.split(",")[0].strip()
    return f"; it says to wait {first}s" if first.isdigit() else ""


def _secrets(config: SearchConfig) -> list[str]:
    found = [config.api_key]
    try:
        parts = urlsplit(config.url)
        found += [parts.username or "", parts.password or ""]
    except ValueError:
        pass
    return [text for text in found if len(text) >= 4]


def render(query: str, provider: Provider, hits: list[SearchHit], notes: str, capped: bool, limit: int) -> str:
    if not hits:
        lines = [f'No results for "{query}" ({provider.label}).']
    else:
        lines = [f'{len(hits)} result{"s" if len(hits) != 1 else ""} for "{query}" ({provider.label}):']
        for i, hit in enumerate(hits, 1):
            lines += ["", f"{i}. {hit.title}", f"   {hit.url}"] + ([f"   {hit.snippet}"] if hit.snippet else [])
    tail = ([f"(count is at most {limit} a call)"] if capped else []) + ([notes] if notes else [])
    return "\n".join(lines + ([""] + tail if tail else []))
