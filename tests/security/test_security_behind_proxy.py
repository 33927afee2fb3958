"""Item 14: the console behind a reverse proxy, and its sessions.

The attacks: guessing the admin token faster by rotating a forged X-Forwarded-For (or by
guessing bearer tokens on the API, which had no limit at all); a session cookie sent over plain
HTTP because the gateway could not tell the proxy spoke HTTPS; and, the other way round, a
console that forgets its sessions on a restart or on another instance, so operators keep
tokens in scripts instead. Sessions are stored as a hash: whoever reads the database cannot
use them.

Tests run on loopback: the test's client is the proxy (127.0.0.1 trusted), or an untrusted peer
(only 127.0.0.2 trusted), and X-Forwarded-For names the client behind it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from admin_support import TOKEN, base_url, csrf_of, serving
from harness import make_config
from sqlalchemy import select, update

from gateway.admin.auth import COOKIE, LOGIN_FAILURES
from gateway.store import Store
from gateway.store.tables import console_sessions

BEHIND = {"trusted_proxies": ["127.0.0.1/32"]}  # the test's client is the proxy
UNTRUSTED = {"trusted_proxies": ["127.0.0.2/32"]}  # a proxy elsewhere; the test's client is not it


def config(llm, tmp_path, http=None):  # noqa: ANN001, ANN201
    http = {"host": "127.0.0.1", "port": 0, **(http or {})}
    return make_config(llm.base_url, str(tmp_path / "ws"), http=http, admin={"token": TOKEN})


async def login(
    http: aiohttp.ClientSession, base: str, token: str, headers: dict | None = None
) -> aiohttp.ClientResponse:
    async with http.post(f"{base}/login", data={"token": token}, headers=headers or {}, allow_redirects=False) as r:
        await r.read()
        return r


async def test_a_forged_forwarded_for_from_an_untrusted_peer_does_not_dodge_the_login_limit(store, llm, tmp_path):
    for http_settings in ({}, UNTRUSTED):
        async with serving(store, config(llm, tmp_path, http_settings)) as h, aiohttp.ClientSession() as http:
            base = base_url(h)
            for i in range(LOGIN_FAILURES):
                forged = {"X-Forwarded-For": f"198.51.100.{i}", "X-Real-IP": f"198.51.100.{i}"}
                assert (await login(http, base, "guess", forged)).status == 401
            response = await login(http, base, TOKEN, {"X-Forwarded-For": "198.51.100.200"})
            assert response.status == 429, http_settings


async def test_behind_a_trusted_proxy_each_client_is_limited_on_its_own(store, llm, tmp_path):
    async with serving(store, config(llm, tmp_path, BEHIND)) as h, aiohttp.ClientSession() as http:
        base = base_url(h)
        for i in range(LOGIN_FAILURES):
            # The attacker writes the left part; the proxy appends the address it saw.
            hops = {"X-Forwarded-For": f"198.51.100.{i}, 203.0.113.5"}
            assert (await login(http, base, "guess", hops)).status == 401
        assert (await login(http, base, TOKEN, {"X-Forwarded-For": "10.9.9.9, 203.0.113.5"})).status == 429
        assert (await login(http, base, TOKEN, {"X-Forwarded-For": "203.0.113.6"})).status == 303  # someone else
        entries = await store.audit.list_audit(kind="console_login", limit=20)
        assert {e.detail["client"] for e in entries} == {"203.0.113.5", "203.0.113.6"}


async def test_a_trusted_proxys_requests_without_forwarded_for_share_one_unknown_clients_limit(store, llm, tmp_path):
    """A proxy that sends no X-Forwarded-For (nginx's bare proxy_pass) hides who its clients
    are: its requests are one unknown remote client, limited on their own and logged as such,
    not the proxy's loopback address (which is no client) nor anyone the proxy does name."""
    async with serving(store, config(llm, tmp_path, BEHIND)) as h, aiohttp.ClientSession() as http:
        base = base_url(h)
        for _ in range(LOGIN_FAILURES):
            assert (await login(http, base, "guess")).status == 401
        assert (await login(http, base, TOKEN)).status == 429
        assert (await login(http, base, TOKEN, {"X-Forwarded-For": "203.0.113.7"})).status == 303
        entries = await store.audit.list_audit(kind="console_login", limit=20)
        assert {e.detail["client"] for e in entries} == {"unknown (via 127.0.0.1)", "203.0.113.7"}


async def test_ipv6_clients_of_one_64_share_one_limit(store, llm, tmp_path):
    """An IPv6 host usually holds a whole /64: rotating addresses inside it is no new client."""
    async with serving(store, config(llm, tmp_path, BEHIND)) as h, aiohttp.ClientSession() as http:
        base = base_url(h)
        for i in range(LOGIN_FAILURES):
            assert (await login(http, base, "guess", {"X-Forwarded-For": f"2001:db8:5:6::{i + 1:x}"})).status == 401
        assert (await login(http, base, TOKEN, {"X-Forwarded-For": "2001:db8:5:6:ffff::99"})).status == 429
        assert (await login(http, base, TOKEN, {"X-Forwarded-For": "2001:db8:5:7::1"})).status == 303  # another /64
        # IPv4 clients are still limited one address at a time.
        for _ in range(LOGIN_FAILURES):
            assert (await login(http, base, "guess", {"X-Forwarded-For": "198.51.100.1"})).status == 401
        assert (await login(http, base, TOKEN, {"X-Forwarded-For": "198.51.100.2"})).status == 303


async def test_the_session_cookie_is_secure_when_the_trusted_proxy_says_https(store, llm, tmp_path):
    https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.5"}
    async with serving(store, config(llm, tmp_path, BEHIND)) as h, aiohttp.ClientSession() as http:
        response = await login(http, base_url(h), TOKEN, https)
        assert response.status == 303 and "Secure" in response.headers["Set-Cookie"]
        response = await login(http, base_url(h), TOKEN, {"X-Forwarded-For": "203.0.113.5"})
        assert "Secure" not in response.headers["Set-Cookie"]  # the proxy spoke plain HTTP
    async with serving(store, config(llm, tmp_path, UNTRUSTED)) as h, aiohttp.ClientSession() as http:
        response = await login(http, base_url(h), TOKEN, https)  # anyone can write the header
        assert response.status == 303 and "Secure" not in response.headers["Set-Cookie"]


async def test_wrong_bearer_tokens_are_rate_limited_like_logins(store, llm, tmp_path):
    async with serving(store, config(llm, tmp_path, BEHIND)) as h, aiohttp.ClientSession() as http:
        url = f"{base_url(h)}/api/overview"
        attacker = {"X-Forwarded-For": "203.0.113.5"}
        for i in range(LOGIN_FAILURES):
            async with http.get(url, headers={**attacker, "Authorization": f"Bearer guess-{i}"}) as response:
                assert response.status == 401
        async with http.get(url, headers={**attacker, "Authorization": f"Bearer {TOKEN}"}) as response:
            assert response.status == 429 and int(response.headers["Retry-After"]) > 0
        # Logins from the same address are refused too: one budget of guesses, not two.
        assert (await login(http, base_url(h), TOKEN, attacker)).status == 429
        async with http.get(url, headers={"X-Forwarded-For": "203.0.113.6", "Authorization": f"Bearer {TOKEN}"}) as r:
            assert r.status == 200


async def raw_get(port: int, path: str, header: bytes) -> int:
    """A GET with a header given as raw bytes (no HTTP client sends bytes that are not UTF-8;
    an attacker's socket does). Returns the status code."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
                     b"X-Forwarded-For: 203.0.113.5\r\n" + header + b"\r\n\r\n")
        await writer.drain()
        status_line = await reader.readline()
    finally:
        writer.close()
    return int(status_line.split()[1])


@pytest.mark.parametrize("token", [b"Bearer \xff\xfe\x80guess", "Bearer клюк-ключ".encode(), b"Bearer \xed\xa0\x80"])
@pytest.mark.parametrize("console", [True, False])
async def test_a_bearer_token_that_is_not_ascii_is_a_wrong_token_not_an_error(store, llm, tmp_path, token, console):
    http = {"host": "127.0.0.1", "port": 0, **BEHIND}
    cfg = make_config(llm.base_url, str(tmp_path / "ws"), http=http, admin={"token": TOKEN, "enabled": console})
    async with serving(store, cfg) as h:
        port, header = h.gateway.http.port, b"Authorization: " + token
        if console:
            assert await raw_get(port, "/admin/api/overview", header) == 401
            cookie = b"Cookie: " + COOKIE.encode() + b"=" + token.removeprefix(b"Bearer ")
            assert await raw_get(port, "/admin/", cookie) == 303  # the login page, not a 500
        assert await raw_get(port, "/metrics", header) == 401
        assert await raw_get(port, "/readyz", header) == 200  # `{"ready": true}`, not its details, and no 500


@contextlib.asynccontextmanager
async def another_instance(store: Store, cfg) -> AsyncIterator[str]:  # noqa: ANN001
    """A second gateway process on the same database: its own Store, its own HTTP port."""
    other = Store(store.db.url, pg_schema=store.db.pg_schema)
    try:
        async with serving(other, cfg) as h:
            yield base_url(h)
    finally:
        await other.close()


async def cookie_from_login(base: str) -> tuple[str, str]:
    """Log in like a browser; the session cookie's value and the overview page."""
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/login", data={"token": TOKEN}, allow_redirects=False) as response:
            value = response.cookies[COOKIE].value
        async with http.get(f"{base}/", headers={"Cookie": f"{COOKIE}={value}"}, allow_redirects=False) as response:
            assert response.status == 200
            return value, await response.text()


async def status_with(base: str, cookie: str) -> int:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/", headers={"Cookie": f"{COOKIE}={cookie}"}, allow_redirects=False) as response:
            return response.status


async def test_a_console_session_works_on_another_instance_and_after_a_restart(store, llm, tmp_path):
    cfg = config(llm, tmp_path)
    async with serving(store, cfg) as h:
        cookie, _ = await cookie_from_login(base_url(h))
        async with another_instance(store, cfg) as other:
            assert await status_with(other, cookie) == 200
    async with another_instance(store, cfg) as restarted:
        assert await status_with(restarted, cookie) == 200
        assert await status_with(restarted, "forged") == 303


async def test_the_database_holds_a_hash_of_the_session_not_the_session(store, llm, tmp_path):
    async with serving(store, config(llm, tmp_path)) as h:
        cookie, _ = await cookie_from_login(base_url(h))
    rows = await store.db.read(lambda conn: [dict(r._mapping) for r in conn.execute(select(console_sessions))])
    assert len(rows) == 1 and cookie not in repr(rows)
    assert rows[0]["id_hash"] == hashlib.sha256(cookie.encode()).hexdigest()


async def test_logout_deletes_the_session_on_every_instance(store, llm, tmp_path):
    cfg = config(llm, tmp_path)
    async with serving(store, cfg) as h:
        base = base_url(h)
        cookie, page = await cookie_from_login(base)
        async with aiohttp.ClientSession() as http:
            headers = {"Cookie": f"{COOKIE}={cookie}"}
            async with http.post(f"{base}/logout", data={"csrf": csrf_of(page)}, headers=headers,
                                 allow_redirects=False) as response:
                assert response.status == 303
        async with another_instance(store, cfg) as other:
            assert await status_with(other, cookie) == 303
    assert await store.db.read(lambda conn: conn.execute(select(console_sessions)).all()) == []


async def test_an_expired_session_is_refused(store, llm, tmp_path):
    async with serving(store, config(llm, tmp_path)) as h:
        cookie, _ = await cookie_from_login(base_url(h))
        key = hashlib.sha256(cookie.encode()).hexdigest()
        row = await store.db.read(lambda conn: conn.execute(select(console_sessions)).one())
        moved = update(console_sessions).where(console_sessions.c.id_hash == key).values(
            expires_at=row.created_at
        )
        await store.db.write(lambda conn: conn.execute(moved))
        assert await status_with(base_url(h), cookie) == 303
