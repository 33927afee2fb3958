"""No exfiltration without approval (docs/security.md, "Hostile input").

A page or a tool result can tell the model to send data out. `http_fetch` to a host on
`agent.http_allow_hosts` runs without approval, so a redirect from such a host must not carry
the request on to a host nobody approved; private addresses must stay private when they are
written as NAT64 or 6to4 addresses; and a link the model writes into a reply must not be fetched
by the platform's link preview (a preview is a GET to the link's host, with whatever the model
put into its URL) unless the person sent that link themselves.
"""

from __future__ import annotations

import pytest
from aiohttp import web
from tooling import call, make_ctx

from gateway.tools.builtin_http import is_public


class Site:
    def __init__(self) -> None:
        self.hits: list[str] = []
        self.base = ""


@pytest.fixture
async def site():
    state = Site()

    async def handle(request: web.Request) -> web.StreamResponse:
        state.hits.append(f"{request.host.split(':')[0]}{request.path}")
        name = request.match_info["name"]
        port = state.base.rsplit(":", 1)[1]
        if name == "out":  # an allowed host sending the fetch on to one that is not allowed
            raise web.HTTPFound(f"http://localhost:{port}/secret?q=the-users-data")
        if name == "same":
            raise web.HTTPFound("/page")
        return web.Response(text=f"page {name}", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/{name}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    host, port = runner.addresses[0][:2]
    state.base = f"http://{host}:{port}"
    yield state
    await runner.cleanup()


async def test_a_redirect_from_an_allowed_host_to_one_not_allowed_is_refused(site, tmp_path):
    ctx = make_ctx(tmp_path, http_fetch_allow_private=True, http_allow_hosts=["127.0.0.1"])
    outcome = await call(ctx, "http_fetch", url=f"{site.base}/out")
    assert outcome.failed
    assert "localhost" in outcome.text and "http_allow_hosts" in outcome.text
    assert site.hits == ["127.0.0.1/out"]  # the second host was never asked


async def test_a_redirect_within_the_same_host_is_still_followed(site, tmp_path):
    ctx = make_ctx(tmp_path, http_fetch_allow_private=True, http_allow_hosts=["127.0.0.1"])
    outcome = await call(ctx, "http_fetch", url=f"{site.base}/same")
    assert not outcome.failed and outcome.text.endswith("page page")
    assert site.hits == ["127.0.0.1/same", "127.0.0.1/page"]


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254 (cloud metadata)
        "64:ff9b::c0a8:101",  # NAT64 of 192.168.1.1
        "64:ff9b:1::a00:1",  # local-use NAT64 prefix, trailing 10.0.0.1
        "64:ff9b:1:a00:1::",  # local-use NAT64 prefix, RFC 6052 /48 layout of 10.0.0.1
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "2002:a00:1::1",  # 6to4 of 10.0.0.1
        "2002:c0a8:101::1",  # 6to4 of 192.168.1.1
    ],
)
def test_nat64_and_6to4_addresses_of_private_ipv4_are_private(address):
    assert is_public(address) is False


@pytest.mark.parametrize("address", ["64:ff9b::808:808", "2002:808:808::1", "2606:4700:4700::1111"])
def test_nat64_and_6to4_addresses_of_public_ipv4_stay_public(address):
    assert is_public(address) is True
