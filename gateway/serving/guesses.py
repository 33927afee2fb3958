"""Guesses at the admin token: compared in constant time, and limited per client address. One
limiter serves the console's login form, the admin API's bearer check and the bearer check of
/readyz and /metrics, so a client gets one budget of guesses, not one per door.

An IPv4 client is one address; an IPv6 client is its /64 (one host is usually given a whole /64,
and rotating addresses inside it must not buy new guesses)."""

from __future__ import annotations

import hmac
import ipaddress
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

LOGIN_FAILURES = 5  # per client address and window, then refused until the window passes
LOGIN_WINDOW_S = 300.0


def client_bytes(text: str) -> bytes:
    """A string a client sent, as bytes that never fail to encode: a header's bytes that are not
    UTF-8 reach us as lone surrogates, which become bytes no valid token or id can equal."""
    return text.encode("utf-8", "surrogatepass")


def token_matches(given: str, expected: str) -> bool:
    """Constant time: how much of a guess was right is not measurable. Any text the client sent
    is a guess (one that is not UTF-8 is a wrong one, not an error)."""
    return bool(expected) and hmac.compare_digest(client_bytes(given), expected.encode())


def bearer(header: str) -> str:
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


MAX_CLIENTS = 10_000  # addresses remembered at once; stale ones are forgotten first
IPV6_PREFIX = 64


def bucket(client: str) -> str:
    """The key a client's guesses are counted under: an IPv4 address (IPv4-mapped IPv6 too) as
    it is, an IPv6 address as its /64, anything else (a client the proxies could not name) as
    given."""
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return client
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, IPV6_PREFIX), strict=False))
    return str(address)


@dataclass
class LoginLimiter:
    """Failed guesses per client address over a sliding window (in memory, per instance)."""

    failures: int = LOGIN_FAILURES
    window_s: float = LOGIN_WINDOW_S
    clock: Callable[[], float] = time.monotonic
    _seen: dict[str, deque[float]] = field(default_factory=dict)

    def _recent(self, client: str) -> deque[float]:
        now = self.clock()
        times = self._seen.get(client, deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return times

    def blocked(self, client: str) -> float:
        """Seconds until this client may try again (0: it may)."""
        times = self._recent(bucket(client))
        if len(times) < self.failures:
            return 0.0
        return max(0.0, times[0] + self.window_s - self.clock())

    def failed(self, client: str) -> None:
        client = bucket(client)
        if client not in self._seen and len(self._seen) >= MAX_CLIENTS:
            self._forget_stale()
        times = self._recent(client)
        times.append(self.clock())
        self._seen[client] = times

    def succeeded(self, client: str) -> None:
        self._seen.pop(bucket(client), None)

    def _forget_stale(self) -> None:
        """Clients with no failure in the window; failing that, the oldest half (rotating
        addresses must not grow the table without bound)."""
        for client in [c for c in self._seen if not self._recent(c)]:
            del self._seen[client]
        if len(self._seen) >= MAX_CLIENTS:
            for client in sorted(self._seen, key=lambda c: self._seen[c][-1])[: MAX_CLIENTS // 2]:
                del self._seen[client]
