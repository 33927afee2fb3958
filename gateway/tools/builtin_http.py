"""The http_fetch built-in: GET an http(s) URL with size and time caps and an SSRF guard.

Every hop (the first request and each redirect) is checked the same way: the scheme must be
http or https and every address the host resolves to must be public, unless
`agent.http_fetch_allow_private`. The connection then goes to the address that was checked
(Host header and TLS server name keep the original host), so a second DNS answer cannot
swap in a private address between the check and the request.
"""

from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.tools.registry import ToolContext, ToolError, ToolSpec, build_spec

MAX_REDIRECTS = 5
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml", "+json", "+xml", "javascript")
_USER_AGENT = "chat-gateway-http-fetch/1"


@dataclass(frozen=True)
class Hop:
    url: httpx.URL  # what was asked for
    connect_url: httpx.URL  # the same URL with the checked address as its host


async def http_fetch(ctx: ToolContext, url: str, max_bytes: int | None = None) -> str:
    """Fetch a web page or API response over http or https (GET) and return its status, type and body.

    Args:
        url: the http:// or https:// URL to fetch
        max_bytes: read at most this many bytes of the body (default and maximum: the configured cap)
    """
    cfg = ctx.agent
    cap = cfg.http_fetch_max_bytes if max_bytes is None else min(max_bytes, cfg.http_fetch_max_bytes)
    if cap < 1:
        raise ToolError("max_bytes must be at least 1")
    try:
        async with asyncio.timeout(cfg.http_fetch_timeout_s):
            async with httpx.AsyncClient(
                follow_redirects=False, trust_env=False, timeout=cfg.http_fetch_timeout_s
            ) as client:
                return await _fetch(client, url, cap, cfg.http_fetch_allow_private)
    except TimeoutError:
        raise ToolError(f"fetching {url} timed out after {cfg.http_fetch_timeout_s:g}s") from None
    except httpx.HTTPError as exc:
        raise ToolError(f"fetching {url} failed: {type(exc).__name__}: {exc}") from None


async def _fetch(client: httpx.AsyncClient, url: str, cap: int, allow_private: bool) -> str:
    current = _parse(url)
    for _ in range(MAX_REDIRECTS + 1):
        hop = await check_hop(current, allow_private)
        response = await client.send(_request(client, hop), stream=True)
        try:
            if response.is_redirect and "location" in response.headers:
                current = _parse(str(current.join(response.headers["location"])))
                continue
            body, truncated = await _read_capped(response, cap)
            return _render(current, response, body, truncated, cap)
        finally:
            await response.aclose()
    raise ToolError(f"more than {MAX_REDIRECTS} redirects; stopped at {current}")


def _parse(raw: str) -> httpx.URL:
    try:
        url = httpx.URL(raw)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ToolError(f"not a valid URL: {raw!r} ({exc})") from None
    if url.scheme not in ("http", "https"):
        raise ToolError(f"only http:// and https:// URLs can be fetched, not {url.scheme or 'no scheme'}: {raw}")
    if not url.host:
        raise ToolError(f"the URL has no host: {raw}")
    return url


async def check_hop(url: httpx.URL, allow_private: bool) -> Hop:
    """Resolve the host and refuse private, loopback and link-local addresses."""
    addresses = await resolve(url.host, url.port or (443 if url.scheme == "https" else 80))
    if not allow_private:
        for address in addresses:
            if not is_public(address):
                raise ToolError(
                    f"refused: {url.host} resolves to {address}, a private, loopback or link-local "
                    "address (set agent.http_fetch_allow_private to allow it)"
                )
    return Hop(url=url, connect_url=url.copy_with(host=addresses[0]))


async def resolve(host: str, port: int) -> list[str]:
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ToolError(f"cannot resolve host {host}: {exc.strerror or exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise ToolError(f"cannot resolve host {host}: no addresses")
    return addresses


def is_public(address: str) -> bool:
    """True for globally routable unicast addresses (IPv4-mapped IPv6 judged as IPv4)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _request(client: httpx.AsyncClient, hop: Hop) -> httpx.Request:
    extensions = {"sni_hostname": hop.url.host} if hop.url.scheme == "https" else {}
    headers = {"Host": hop.url.netloc.decode("ascii"), "User-Agent": _USER_AGENT}
    return client.build_request("GET", hop.connect_url, headers=headers, extensions=extensions)


async def _read_capped(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > cap:
            return b"".join(chunks)[:cap], True
    return b"".join(chunks), False


def _render(url: httpx.URL, response: httpx.Response, body: bytes, truncated: bool, cap: int) -> str:
    content_type = response.headers.get("content-type", "")
    head = f"HTTP {response.status_code} {response.reason_phrase}\nURL: {url}\nContent-Type: {content_type or '-'}"
    if _looks_binary(content_type, body):
        return f"{head}\n\n[binary content, {len(body)}{'+' if truncated else ''} bytes, not shown]"
    text = body.decode(response.charset_encoding or "utf-8", errors="replace")
    note = f"\n[truncated: only the first {cap} bytes were read]" if truncated else ""
    return f"{head}\n\n{text}{note}"


def _looks_binary(content_type: str, body: bytes) -> bool:
    lowered = content_type.lower()
    if any(marker in lowered for marker in _TEXT_TYPES):
        return False
    return b"\0" in body[:8192]


def outside_allow_list(allow_hosts: Sequence[str]) -> Callable[[Mapping[str, Any]], str | None]:
    """A fetch sends data out (in its URL): one to a host not on `agent.http_allow_hosts`
    (globs, e.g. "*.wikipedia.org") needs approval."""

    def check(args: Mapping[str, Any]) -> str | None:
        try:
            host = (httpx.URL(str(args.get("url", ""))).host or "").lower()
        except (httpx.InvalidURL, TypeError):
            return "the URL cannot be read"
        if host and any(fnmatch.fnmatchcase(host, pattern.lower()) for pattern in allow_hosts):
            return None
        return f"{host or 'the host'} is not on agent.http_allow_hosts"

    return check


def http_specs(allow_hosts: Sequence[str] = ()) -> list[ToolSpec]:
    return [build_spec(http_fetch, classes={"network"}, lod="head", needs_approval=outside_allow_list(allow_hosts))]
