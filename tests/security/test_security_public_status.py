"""Item 15: what anyone who reaches the HTTP port, or any member of a chat, can read.

The attacks: a stranger on the network (or on the internet, through the reverse proxy) reads
/readyz for the MCP servers' names, commands and errors and /metrics for tool names and traffic;
a chat member reads an MCP server's raw exception text (a URL, a path, a token) with /status.

The test's client is on loopback, so a remote client is presented the honest way: through a
trusted proxy (127.0.0.1 in http.trusted_proxies) whose X-Forwarded-For names a public address.
A proxy on the same host that nobody listed in trusted_proxies passes on remote clients too:
a loopback peer that forwards a request is not a local client."""

from __future__ import annotations

import json
import sys

import aiohttp
import pytest
from admin_support import TOKEN, serving
from harness import make_config
from mcp_support import mcp_section
from multidict import CIMultiDict

from gateway.serving.guesses import LOGIN_FAILURES

BROKEN = {"command": ["/nonexistent/mcp-server-Hidden-Path"], "connect_timeout_s": 5}
REMOTE = {"X-Forwarded-For": "203.0.113.9"}


@pytest.fixture(params=["aiohttp", "status_server"])
def server(request) -> str:  # noqa: ANN001
    """Both HTTP servers answer alike: aiohttp (the console on) and the small status server
    (no webhooks, the console off; the admin token still opens /metrics)."""
    return request.param


def config(llm, tmp_path, server: str = "aiohttp", **http):  # noqa: ANN001, ANN201
    return make_config(
        llm.base_url, str(tmp_path / "ws"),
        http={"host": "127.0.0.1", "port": 0, **http}, admin={"token": TOKEN, "enabled": server == "aiohttp"},
        mcp=mcp_section(broken=BROKEN),
    )


async def get(h, path: str, headers: dict | CIMultiDict | None = None) -> tuple[int, str]:  # noqa: ANN001
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{h.gateway.http.port}{path}", headers=headers or {}) as response:
            return response.status, await response.text()


async def failed(h) -> None:  # noqa: ANN001
    await h.gateway.mcp.wait_for(lambda m: m.states["broken"].status == "failed", 20)


async def test_a_remote_client_gets_only_whether_the_gateway_is_ready(store, llm, tmp_path, server):
    async with serving(store, config(llm, tmp_path, server, trusted_proxies=["127.0.0.1"])) as h:
        assert type(h.gateway.http).__name__ == {"aiohttp": "HttpServer", "status_server": "StatusServer"}[server]
        await failed(h)
        assert await get(h, "/readyz", REMOTE) == (200, '{"ready": true}')
        status, body = await get(h, "/metrics", REMOTE)
        assert status == 401 and "gateway_" not in body
        # The admin (its token, from anywhere) sees the details.
        admin = {**REMOTE, "Authorization": f"Bearer {TOKEN}"}
        status, body = await get(h, "/readyz", admin)
        assert status == 200 and '"broken"' in body and '"migrations_current"' in body
        status, body = await get(h, "/metrics", admin)
        assert status == 200 and "gateway_inbox_pending" in body
        status, _ = await get(h, "/readyz", {**REMOTE, "Authorization": "Bearer wrong"})
        assert (status, _) == (200, '{"ready": true}')
        await h.gateway.http.stop_intake()  # a load balancer still learns when to stop sending
        assert await get(h, "/readyz", REMOTE) == (503, '{"ready": false}')


async def test_a_clients_own_forwarded_for_line_before_its_proxys_does_not_make_it_local(
    store, llm, tmp_path, server
):
    """A proxy that adds its X-Forwarded-For as a line of its own, after the client's forged
    `X-Forwarded-For: 127.0.0.1`: the lines are one list (RFC 9110), read from the right."""
    async with serving(store, config(llm, tmp_path, server, trusted_proxies=["127.0.0.1"])) as h:
        await failed(h)
        forged = CIMultiDict([("X-Forwarded-For", "127.0.0.1"), ("X-Forwarded-For", "203.0.113.9")])
        assert await get(h, "/readyz", forged) == (200, '{"ready": true}')
        assert (await get(h, "/metrics", forged))[0] == 401


async def test_a_trusted_proxys_request_without_forwarded_for_is_not_local(store, llm, tmp_path, server):
    """nginx's bare `proxy_pass` sends no X-Forwarded-For: behind it every internet client
    arrives as the loopback proxy with no header. Such a request is an unknown remote client,
    and so is a client the proxy names as loopback; a local client needs no proxy in between."""
    async with serving(store, config(llm, tmp_path, server, trusted_proxies=["127.0.0.1"])) as h:
        await failed(h)
        for headers in ({}, {"X-Forwarded-For": "127.0.0.1"}, {"X-Real-IP": "127.0.0.1"}):
            assert await get(h, "/readyz", headers) == (200, '{"ready": true}'), headers
            status, body = await get(h, "/metrics", headers)
            assert status == 401 and "gateway_" not in body, headers
    async with serving(store, config(llm, tmp_path, server)) as h:  # nobody trusted: loopback is local
        await failed(h)
        status, body = await get(h, "/readyz")
        assert status == 200 and '"broken"' in body
        assert (await get(h, "/metrics"))[0] == 200


async def test_a_local_proxy_nobody_listed_does_not_make_its_clients_local(store, llm, tmp_path, caplog, server):
    caplog.set_level("INFO")
    async with serving(store, config(llm, tmp_path, server)) as h:
        assert "others get {\"ready\": ...} from /readyz and 401 from /metrics" in caplog.text  # said at start
        await failed(h)
        assert await get(h, "/readyz", REMOTE) == (200, '{"ready": true}')
        assert (await get(h, "/metrics", REMOTE))[0] == 401
        assert (await get(h, "/healthz", REMOTE))[0] == 200


async def test_public_status_publishes_the_details(store, llm, tmp_path, server):
    async with serving(store, config(llm, tmp_path, server, trusted_proxies=["127.0.0.1"], public_status=True)) as h:
        await failed(h)
        status, body = await get(h, "/readyz", REMOTE)
        assert status == 200 and '"broken"' in body
        assert (await get(h, "/metrics", REMOTE))[0] == 200


async def test_status_in_a_chat_shows_server_states_not_error_text(store, llm, tmp_path):
    async with serving(store, config(llm, tmp_path)) as h:
        await failed(h)
        error = h.gateway.mcp.states["broken"].error
        assert error  # the server did fail with a message: the chat must not see it
        await h.say("/status")
        await h.idle()
        status = h.channel.messages()[-1]
        assert "MCP broken: 🔴 down (restarting" in status
        assert error not in status and "Hidden-Path" not in status and "nonexistent" not in status


async def test_guessing_the_admin_token_on_metrics_is_limited_like_logins(store, llm, tmp_path, server):
    async with serving(store, config(llm, tmp_path, server, trusted_proxies=["127.0.0.1"])) as h:
        for i in range(LOGIN_FAILURES):
            assert (await get(h, "/metrics", {**REMOTE, "Authorization": f"Bearer guess-{i}"}))[0] == 401
        assert (await get(h, "/metrics", {**REMOTE, "Authorization": f"Bearer {TOKEN}"}))[0] == 429
        if server == "status_server":
            return  # no console to log in to
        async with aiohttp.ClientSession() as http:  # the console's login counts the same guesses
            url = f"http://127.0.0.1:{h.gateway.http.port}/admin/login"
            async with http.post(url, data={"token": TOKEN}, headers=REMOTE) as response:
                assert response.status == 429


# ---- item 5: the details show no MCP secret -------------------------------------------------

URL_PASSWORD, URL_KEY, ARG_KEY = "Url-Pass-Q7x2k", "Url-Key-M3v8p", "Arg-Key-W5n1c"
# A server behind a URL with a user, a password and a key in its query (nothing listens there),
# and a stdio server whose key is an argument, which it echoes in its usage message and exits.
CREDENTIALED = {
    "url": f"http://mcp-user:{URL_PASSWORD}@127.0.0.1:9/mcp?key={URL_KEY}&region=eu", "connect_timeout_s": 5,
}
ECHOING = {
    "command": [sys.executable, "-c", "import sys; print('usage: bad', *sys.argv[1:], file=sys.stderr); sys.exit(2)"],
    "args": ["--api-key", ARG_KEY, "--region", "eu"], "connect_timeout_s": 5,
}


def secrets_in(text: str) -> list[str]:
    return [secret for secret in (URL_PASSWORD, URL_KEY, ARG_KEY) if secret in text]


@pytest.mark.parametrize("view", ["public", "admin", "local"])
async def test_readyz_details_show_no_mcp_credential(store, llm, tmp_path, caplog, server, view):
    caplog.set_level("INFO")
    cfg = make_config(
        llm.base_url, str(tmp_path / "ws"),
        http={"host": "127.0.0.1", "port": 0, "public_status": view == "public"},
        admin={"token": TOKEN, "enabled": server == "aiohttp"},
        mcp=mcp_section(remote=CREDENTIALED, local=ECHOING),
    )
    headers = {"public": REMOTE, "admin": {**REMOTE, "Authorization": f"Bearer {TOKEN}"}, "local": {}}[view]
    async with serving(store, cfg) as h:
        await h.gateway.mcp.wait_for(lambda m: all(s.restarts >= 1 for s in m.states.values()), 20)
        status, body = await get(h, "/readyz", headers)
    assert status == 200 and '"remote"' in body and '"local"' in body  # the details are shown
    assert secrets_in(body) == [], body
    mcp = json.loads(body)["mcp"]
    assert mcp["remote"]["target"] == "http://••••@127.0.0.1:9/mcp?key=••••&region=••••"
    assert mcp["local"]["target"].endswith(" --api-key •••• --region eu")
    assert "usage: bad" in mcp["local"]["error"]  # still says why it failed
    assert secrets_in(caplog.text) == []  # nor does the log (its stderr lines, its restarts)


async def test_doctor_shows_no_mcp_credential(capsys):
    from gateway.cli.doctor import diagnose_mcp, print_check
    from gateway.config import Config

    config = Config.model_validate({"mcp": mcp_section(remote=CREDENTIALED, local=ECHOING)})
    report = await diagnose_mcp(config.mcp, on_check=print_check)
    printed = capsys.readouterr().out
    assert [check.status for check in report.checks] == ["fail", "fail"]
    assert "usage: bad --api-key ••••" in printed  # still says why
    assert secrets_in(printed) == [] and secrets_in(repr(report.checks)) == []
