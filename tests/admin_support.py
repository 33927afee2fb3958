"""A whole gateway with its HTTP server (and the console) on a random port, a fake channel and
the scripted LLM; an aiohttp client that logs in like a browser."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from fakes.channel import FakeChannel
from harness import Harness, make_config

from gateway.app import Gateway
from gateway.llm import LLMClient
from gateway.store import Store

TOKEN = "console-test-token-Zq8"


def admin_config(llm_url: str, workspace: str, *, token: str = TOKEN, **sections: Any):  # noqa: ANN201
    return make_config(llm_url, workspace, http={"host": "127.0.0.1", "port": 0}, admin={"token": token}, **sections)


@contextlib.asynccontextmanager
async def serving(store: Store, config, channel: FakeChannel | None = None) -> AsyncIterator[Harness]:  # noqa: ANN001
    channel = channel or FakeChannel()
    llm = LLMClient(config.llm, backoff_base_s=0.01)
    gateway = Gateway(config, channels={channel.name: channel}, serve_http=True, store=store, llm=llm)
    await gateway.start()
    try:
        yield Harness(gateway, channel)
    finally:
        await gateway.stop()
        await llm.aclose()


def base_url(h: Harness) -> str:
    assert h.gateway.http is not None
    return f"http://127.0.0.1:{h.gateway.http.port}/admin"


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no CSRF field"
    return found.group(1)


async def logged_in(http: aiohttp.ClientSession, base: str, user: str = "ops") -> str:
    """Log in with the token; returns the overview page (its forms carry the CSRF token)."""
    async with http.post(f"{base}/login", data={"user": user, "token": TOKEN}) as response:
        assert response.status == 200, await response.text()
        assert str(response.url).endswith("/admin/")
        return await response.text()
