"""The web_fetch built-in (named http_fetch before; that name still reaches it): GET an http(s)
URL with size and time caps and an SSRF guard. An HTML page comes back as its readable text
(gateway/tools/readable.py), anything else textual as it is, binary content not at all.

Every hop (the first request and each redirect, followed by hand and at most MAX_REDIRECTS) is
checked the same way: the scheme must be http or https, every address the host resolves to must
be public, unless `agent.http_fetch_allow_private`, and a redirect may only go to the host first
asked for (the one on `agent.http_allow_hosts`, or the one a person approved) or to another host
on that list: the approval of one host is no approval of wherever it sends the request on.
The connection then goes to the address that was checked (Host header and TLS server name keep
the original host), so a second DNS answer cannot swap in a private address between the check
and the request.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import ipaddress
import socket
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.tools.readable import is_html, readable
from gateway.tools.registry import ToolContext, ToolError, ToolSpec, build_spec

MAX_REDIRECTS = 5
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml", "+json", "+xml", "javascript")
_USER_AGENT = "chat-gateway-web-fetch/1"


@functools.cache
def trust_store() -> ssl.SSLContext:
    """The TLS context every fetch verifies with, made once: building one loads the CA bundle,
    ~50 ms of CPU, which a 1-minute url check would otherwise pay at every firing."""
    return httpx.create_ssl_context()


@dataclass(frozen=True)
class Hop:
    url: httpx.URL  # what was asked for
    connect_url: httpx.URL  # the same URL with the checked address as its host


async def web_fetch(ctx: ToolContext, url: str, max_bytes: int | None = None, raw: bool = False) -> str:
    """Fetch a web page or API response over http or https (GET) and return its status, type and body.
    An HTML page comes back as its readable text: the main content as Markdown with its links,
    without scripts, styles, navigation and boilerplate.

    Args:
        url: the http:// or https:// URL to fetch
        max_bytes: read at most this many bytes of the body (default and maximum: the configured cap)
        raw: true for an HTML page's source as it came instead of its readable text
    """
    cfg = ctx.agent
    cap = cfg.http_fetch_max_bytes if max_bytes is None else min(max_bytes, cfg.http_fetch_max_bytes)
    if cap < 1:
        raise ToolError("max_bytes must be at least 1")
    try:
        async with asyncio.timeout(cfg.http_fetch_timeout_s):
            async with httpx.AsyncClient(
                follow_redirects=False, trust_env=False, timeout=cfg.http_fetch_timeout_s, verify=trust_store()
            ) as client:
                fetched = await _fetch(client, url, cap, cfg.http_fetch_allow_private, cfg.http_allow_hosts)
    except TimeoutError:
        raise ToolError(f"fetching {url} timed out after {cfg.http_fetch_timeout_s:g}s") from None
    except httpx.HTTPError as exc:
        raise ToolError(f"fetching {url} failed: {type(exc).__name__}: {exc}") from None
    return await _render(fetched, cap, raw)


@dataclass(frozen=True)
class Fetched:
    url: httpx.URL  # where the body came from (after redirects)
    status: int
    reason: str
    content_type: str
    charset: str | None
    body: bytes
    truncated: bool
    etag: str = ""  # the validators the server gave, for a conditional GET next time
    last_modified: str = ""


async def guarded_get(
    url: str,
    *,
    cap: int,
    timeout_s: float,
    allow_private: bool,
    allow_hosts: Sequence[str],
    headers: Mapping[str, str] | None = None,
) -> Fetched:
    """A GET under web_fetch's rules (every hop's address checked, redirects only to the first
    host or the allow list), for callers other than the tool (a job's check). `headers` are
    added to each hop (If-None-Match...). Raises ToolError (refused, failed) or TimeoutError."""
    async with asyncio.timeout(timeout_s):
        async with httpx.AsyncClient(
            follow_redirects=False, trust_env=False, timeout=timeout_s, verify=trust_store()
        ) as client:
            try:
                return await _fetch(client, url, cap, allow_private, allow_hosts, headers)
            except httpx.HTTPError as exc:
                raise ToolError(f"fetching {url} failed: {type(exc).__name__}: {exc}") from None


async def _fetch(
    client: httpx.AsyncClient,
    url: str,
    cap: int,
    allow_private: bool,
    allow_hosts: Sequence[str],
    headers: Mapping[str, str] | None = None,
) -> Fetched:
    current = _parse(url)
    first_host = (current.host or "").lower()
    for _ in range(MAX_REDIRECTS + 1):
        hop = await check_hop(current, allow_private)
        response = await client.send(_request(client, hop, headers), stream=True)
        try:
            if response.is_redirect and "location" in response.headers:
                current = _parse(str(current.join(response.headers["location"])))
                _check_redirect_host(current, first_host, allow_hosts)
                continue
            body, truncated = await _read_capped(response, cap)
            return Fetched(
                current, response.status_code, response.reason_phrase, response.headers.get("content-type", ""),
                response.charset_encoding, body, truncated, response.headers.get("etag", ""),
                response.headers.get("last-modified", ""),
            )
        finally:
            await response.aclose()
    raise ToolError(f"more than {MAX_REDIRECTS} redirects; stopped at {current}")


def _check_redirect_host(url: httpx.URL, first_host: str, allow_hosts: Sequence[str]) -> None:
    host = (url.host or "").lower()
    if host == first_host or host_allowed(host, allow_hosts):
        return
    raise ToolError(
        f"refused: redirected to {host}, which is not on agent.http_allow_hosts; "
        f"fetch {url} directly if it is needed (a person is then asked)"
    )


def host_allowed(host: str, allow_hosts: Sequence[str]) -> bool:
    return bool(host) and any(fnmatch.fnmatchcase(host, pattern.lower()) for pattern in allow_hosts)


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


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
# Ranges that are no destination on the internet but that Python's is_global (3.11) calls global:
# deprecated forms that carry an IPv4 address or reach inside a site, and special-purpose blocks.
_NOT_GLOBAL = tuple(
    ipaddress.ip_network(n)
    for n in (
        "::/96",  # IPv4-compatible (RFC 4291, deprecated): ::7f00:1 is 127.0.0.1 to a stack that still maps it
        "::ffff:0:0:0/96",  # IPv4-translated (RFC 2765, SIIT): ::ffff:0:7f00:1 is 127.0.0.1 to a translator
        "fec0::/10",  # site-local (RFC 3879, deprecated): routed inside the site, like a private range
        "5f00::/16",  # SRv6 segment identifiers (RFC 9602): not globally reachable
        "3fff::/20",  # documentation (RFC 9637)
        "192.88.99.0/24",  # 6to4 relay anycast (RFC 7526, deprecated)
    )
)


def is_public(address: str) -> bool:
    """True for globally routable unicast addresses. IPv6 addresses that carry an IPv4 address
    (IPv4-mapped, NAT64, 6to4, Teredo) are judged by every IPv4 address they carry: a gateway
    on the way turns them into it. Deprecated and special ranges Python still calls global
    (`_NOT_GLOBAL`) are not public."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    return all(_global_unicast(a) for a in (ip, *embedded_ipv4(ip)))


def _global_unicast(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    special = any(ip in network for network in _NOT_GLOBAL if network.version == ip.version)
    return ip.is_global and not ip.is_multicast and not special


def embedded_ipv4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    raw = ip.packed
    found: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if ip in _NAT64 or ip in _NAT64_LOCAL:
        found.append(ipaddress.IPv4Address(raw[12:16]))  # the /96 layout (RFC 6052)
    if ip in _NAT64_LOCAL:
        found.append(ipaddress.IPv4Address(raw[6:8] + raw[9:11]))  # the /48 layout, around the u octet
    return found


def _request(client: httpx.AsyncClient, hop: Hop, extra: Mapping[str, str] | None = None) -> httpx.Request:
    extensions = {"sni_hostname": hop.url.host} if hop.url.scheme == "https" else {}
    headers = {**(extra or {}), "Host": hop.url.netloc.decode("ascii"), "User-Agent": _USER_AGENT}
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


async def _render(page: Fetched, cap: int, raw: bool) -> str:
    head = f"HTTP {page.status} {page.reason}\nURL: {page.url}\nContent-Type: {page.content_type or '-'}"
    size = f"{len(page.body)}{'+' if page.truncated else ''} bytes"
    note = f"\n[truncated: only the first {cap} bytes were read]" if page.truncated else ""
    if _looks_binary(page.content_type, page.body):
        return f"{head}\n\n[binary content, {size}, not shown]"
    if not raw and is_html(page.content_type, page.body):
        # decoded here when the header names the charset; else the page's own <meta> decides
        html = decode(page.body, page.charset) if page.charset else page.body
        text = await readable(html, str(page.url))
        title = f"\nTitle: {text.title}" if text.title else ""
        body = text.text or "[the page has no readable text: only navigation and boilerplate, or nothing]"
        how = "readable text: the main content, scripts, styles and navigation left out"
        return f"{head}{title}\n\n{body}\n[{how}; {size} of HTML; raw=true gives the source]{note}"
    return f"{head}\n\n{decode(page.body, page.charset)}{note}"


def decode(body: bytes, charset: str | None) -> str:
    try:
        return body.decode(charset or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know: most pages are UTF-8 anyway
        return body.decode("utf-8", errors="replace")


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
        if host_allowed(host, allow_hosts):
            return None
        return f"{host or 'the host'} is not on agent.http_allow_hosts"

    return check


def http_specs(allow_hosts: Sequence[str] = ()) -> list[ToolSpec]:
    return [build_spec(web_fetch, classes={"network"}, lod="head", needs_approval=outside_allow_list(allow_hosts))]
