"""Who a request comes from when the gateway sits behind reverse proxies (`http.trusted_proxies`).

X-Forwarded-For is a list anyone can start: each proxy appends the address it saw. So it is read
only when the direct peer is a trusted proxy, from the right, skipping trusted proxies: the first
address that is not one is the client (an attacker can write the left part, not the address the
last trusted proxy appended). X-Forwarded-Proto is believed only from a trusted peer too.

Local (the status pages' details, /metrics) means a loopback peer that is the client itself: no
trusted proxy in between, no forwarding header. A request from a trusted proxy is never local:
one that names no client (nginx's bare `proxy_pass` sends no X-Forwarded-For) is an unknown remote
client, counted as `unknown (via <proxy>)`, and a client the proxy names as loopback is loopback
on the proxy's side, or a header the client wrote that the proxy passed on unchanged. So with
loopback among `http.trusted_proxies`, nothing is local: read /metrics with the admin token.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# Headers by which a peer says it is passing on someone else's request.
FORWARDING_HEADERS = ("X-Forwarded-For", "Forwarded", "X-Real-IP")


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.split(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    return address.ipv4_mapped or address if isinstance(address, ipaddress.IPv6Address) else address


@dataclass(frozen=True)
class Origin:
    """Where a request comes from: the client's address (or `unknown (via <proxy>)`), whether it
    came over HTTPS, and whether it is a local client (a loopback peer passing on nobody)."""

    client: str
    https: bool
    local: bool


class Headers(Mapping[str, str]):
    """Header names compared without case; a header sent twice reads as its values joined
    with ", " (RFC 9110 5.3): a client's own X-Forwarded-For line before the one its proxy
    added must not be the one read (the proxy's last address is what tells the client)."""

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self._values: dict[str, str] = {}
        for name, value in pairs:
            key = name.lower()
            self._values[key] = f"{self._values[key]}, {value}" if key in self._values else value

    def __getitem__(self, name: str) -> str:
        return self._values[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


class TrustedProxies:
    def __init__(self, cidrs: Iterable[str] = ()):
        self.networks: tuple[Network, ...] = tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)

    def trusts(self, address: str) -> bool:
        ip = _address(address)
        return ip is not None and any(ip in network for network in self.networks)

    def origin(self, peer: str, headers: Mapping[str, str], https: bool) -> Origin:
        """`peer`: the direct peer's address; `https`: whether the connection itself is TLS."""
        if not self.trusts(peer):
            # A loopback peer passing on a request (a local proxy nobody listed) is not local.
            forwarded = any(headers.get(name) for name in FORWARDING_HEADERS)
            return Origin(peer, https, _is_loopback(peer) and not forwarded)
        hops = [h.strip() for h in headers.get("X-Forwarded-For", "").split(",") if h.strip()]
        client = f"unknown (via {peer})"  # a proxy that names nobody: whoever it is, not the proxy
        for hop in reversed(hops):
            client = hop
            if not self.trusts(hop):
                break
        proto = headers.get("X-Forwarded-Proto", "").split(",")[-1].strip().lower()
        return Origin(client, proto == "https" if proto else https, local=False)


def _is_loopback(address: str) -> bool:
    ip = _address(address)
    return ip is not None and ip.is_loopback
