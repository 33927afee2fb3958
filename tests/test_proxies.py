"""The client and scheme of a request as the trusted proxies tell them (gateway/serving/proxies.py)."""

from __future__ import annotations

from gateway.serving.proxies import TrustedProxies

PROXIES = TrustedProxies(["10.0.0.0/8", "127.0.0.1", "fd00::/8"])


def test_headers_from_a_peer_that_is_not_trusted_are_ignored():
    origin = PROXIES.origin("198.51.100.7", {"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "https"}, False)
    assert (origin.client, origin.https, origin.local) == ("198.51.100.7", False, False)


def test_the_client_is_the_rightmost_address_that_is_not_a_trusted_proxy():
    headers = {"X-Forwarded-For": "forged, 203.0.113.5, 10.1.2.3"}
    assert PROXIES.origin("10.0.0.1", headers, False).client == "203.0.113.5"
    assert PROXIES.origin("10.0.0.1", {"X-Forwarded-For": "10.2.2.2, 10.3.3.3"}, False).client == "10.2.2.2"
    assert PROXIES.origin("fd00::1", {"X-Forwarded-For": "2001:db8::9"}, False).client == "2001:db8::9"
    assert PROXIES.origin("::ffff:10.0.0.1", {"X-Forwarded-For": "203.0.113.5"}, False).client == "203.0.113.5"


def test_https_as_the_trusted_proxy_says():
    assert PROXIES.origin("10.0.0.1", {"X-Forwarded-Proto": "https"}, False).https
    assert not PROXIES.origin("10.0.0.1", {"X-Forwarded-Proto": "http"}, True).https


def test_a_trusted_proxy_that_names_no_client_passes_on_an_unknown_remote_client():
    for peer in ("127.0.0.1", "10.0.0.1", "::ffff:127.0.0.1"):
        for headers in ({}, {"X-Forwarded-For": ""}, {"X-Real-IP": "127.0.0.1"}, {"Forwarded": "for=127.0.0.1"}):
            origin = PROXIES.origin(peer, headers, False)
            assert (origin.client, origin.local) == (f"unknown (via {peer})", False), (peer, headers)


def test_nothing_a_trusted_proxy_passes_on_is_local():
    """Loopback behind a proxy is the proxy's loopback, or a header the client wrote that a
    proxy passed on unchanged: only a loopback peer that is no trusted proxy is local."""
    for forwarded_for in ("127.0.0.1", "::1", "203.0.113.5", "127.0.0.1, 10.0.0.2"):
        assert not PROXIES.origin("127.0.0.1", {"X-Forwarded-For": forwarded_for}, False).local
    assert TrustedProxies(["10.0.0.0/8"]).origin("127.0.0.1", {}, False).local


def test_a_loopback_peer_forwarding_for_someone_is_not_local_unless_trusted():
    nobody = TrustedProxies()
    assert nobody.origin("127.0.0.1", {}, False).local
    for header in ("X-Forwarded-For", "X-Real-IP", "Forwarded"):
        assert not nobody.origin("127.0.0.1", {header: "203.0.113.5"}, False).local
