"""The LLM client spreads its streams over HTTP clients of at most `streams_per_client` each,
and gives a client its slot back however a stream ends. (The CPU this saves with many streams
in flight is measured by bench/gateway_load.py, not here.)"""

from __future__ import annotations

import ssl

import httpx
import pytest
from fakes.llm import FakeLLM, HttpError, Reply

from gateway.config import LLMConfig
from gateway.llm import LLMClient
from gateway.llm.errors import LLMError
from gateway.llm.pool import ClientPool
from gateway.llm.stream import collect

USER = [{"role": "user", "content": "hi"}]
TEXT = "Spread over clients, every stream says the same. " * 2


@pytest.fixture
async def slow_llm():
    async with FakeLLM(chunk_chars=4, delay=0.005, pings=False) as llm:  # ~25 chunks over ~0.1 s
        llm.responder = lambda body: Reply(TEXT)
        yield llm


def lane_streams(client: LLMClient) -> list[int]:
    return [lane.streams for lane in client._clients.lanes]


async def test_streams_beyond_a_clients_share_open_another_client(slow_llm):
    async with LLMClient(LLMConfig(base_url=slow_llm.base_url, model="m1"), streams_per_client=2) as client:
        streams = [client.stream(USER) for _ in range(5)]
        for stream in streams:
            await anext(stream)  # opened: its request is in flight
        assert lane_streams(client) == [2, 2, 1]
        completions = [await collect(stream) for stream in streams]
        assert [c.text for c in completions] == [TEXT] * 5
        assert lane_streams(client) == [0, 0, 0]
        clients = {id(lane.client) for lane in client._clients.lanes}
        assert len(clients) == 3

        again = client.stream(USER)  # below the share: an existing client, none made
        await anext(again)
        assert sorted(lane_streams(client)) == [0, 0, 1]
        await again.aclose()  # a consumer that stops early gives its slot back too
        assert lane_streams(client) == [0, 0, 0]
    assert len(slow_llm.requests) == 6


async def test_a_refused_request_gives_its_slot_back(slow_llm):
    refusal = {"error": {"message": "bad request", "type": "invalid_request_error"}}
    slow_llm.responder = lambda body: HttpError(400, refusal)
    async with LLMClient(LLMConfig(base_url=slow_llm.base_url, model="m1"), streams_per_client=1) as client:
        for _ in range(3):
            with pytest.raises(LLMError):
                await collect(client.stream(USER))
        assert lane_streams(client) == [0]  # each failure freed the one client: no second was made


async def test_https_clients_share_one_trust_store():
    made: list[ssl.SSLContext | bool] = []

    def make(verify: ssl.SSLContext | bool) -> httpx.AsyncClient:
        made.append(verify)
        return httpx.AsyncClient(verify=verify)

    pool = ClientPool(make, True, per_client=1)
    first, second = pool.take(), pool.take()
    assert first is not second and len(made) == 2
    assert isinstance(made[0], ssl.SSLContext) and made[0] is made[1]
    assert made[0].verify_mode == ssl.CERT_REQUIRED and made[0].check_hostname
    await pool.aclose()
