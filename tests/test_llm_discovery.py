"""`llm.context_window: auto`: each server kind's own answer, the fallback, and the cache."""

from __future__ import annotations

import logging

import httpx
import pytest
from fakes.llm import FakeLLM

from gateway.config import LLMConfig
from gateway.llm import LLMClient
from gateway.llm.discovery import FALLBACK_WINDOW, OLLAMA_DEFAULT_CTX, ServerInfo


async def window_of(fake: FakeLLM) -> tuple[int, str]:
    async with LLMClient(LLMConfig(base_url=fake.base_url, model="m")) as client:
        found = await client.context_window()
        return found.tokens, found.source


@pytest.mark.parametrize(
    ("kind", "window", "source"),
    [
        ("vllm", 32_000, "vLLM /v1/models max_model_len"),
        ("llamacpp", 4_096, "llama.cpp /props n_ctx"),
        ("lmstudio", 16_384, "LM Studio loaded_context_length"),
    ],
)
async def test_each_server_kind_says_its_window_its_own_way(kind, window, source):
    async with FakeLLM(server_kind=kind, context_window=window) as fake:
        assert await window_of(fake) == (window, source)


async def test_ollama_uses_num_ctx_and_otherwise_its_default_not_the_models_length():
    async with FakeLLM(server_kind="ollama", context_window=131_072, ollama_num_ctx=12_000) as fake:
        assert await window_of(fake) == (12_000, "Ollama num_ctx")
    async with FakeLLM(server_kind="ollama", context_window=131_072) as fake:
        tokens, source = await window_of(fake)
    assert tokens == OLLAMA_DEFAULT_CTX and "131072" in source


async def test_a_server_that_says_nothing_gets_the_stated_fallback_and_a_log_line(caplog):
    caplog.set_level(logging.WARNING, "gateway.llm.discovery")
    async with FakeLLM(server_kind="openai") as fake:
        assert await window_of(fake) == (FALLBACK_WINDOW, "fallback")
    assert f"assuming {FALLBACK_WINDOW} tokens" in caplog.text and "llm.context_window" in caplog.text


async def test_the_window_is_asked_once_per_model():
    async with FakeLLM(server_kind="llamacpp", context_window=2_048) as fake:
        async with LLMClient(LLMConfig(base_url=fake.base_url, model="m")) as client:
            first = await client.context_window()
            asked = len(fake.probes)
            assert await client.context_window() == first and len(fake.probes) == asked == 1


async def test_a_fallback_is_asked_again_later_in_case_the_server_was_down():
    now = [0.0]
    async with FakeLLM(server_kind="openai") as fake:
        async with LLMClient(LLMConfig(base_url=fake.base_url, model="m"), clock=lambda: now[0]) as client:
            assert not (await client.context_window()).discovered
            asked = len(fake.probes)
            await client.context_window()
            assert len(fake.probes) == asked
            now[0] += 31
            fake.server_kind = "llamacpp"
            assert (await client.context_window()).source == "llama.cpp /props n_ctx"


async def test_a_fallback_is_asked_again_with_backoff_and_the_change_logged(caplog):
    caplog.set_level(logging.INFO, "gateway.llm.client")
    now = [0.0]
    async with FakeLLM(server_kind="openai") as fake:
        async with LLMClient(LLMConfig(base_url=fake.base_url, model="m"), clock=lambda: now[0]) as client:
            asked_at = []
            for step in (0, 31, 30, 61, 60, 121):  # the server stays silent: 30 s, 60 s, 120 s apart
                now[0] += step
                before = len(fake.probes)
                assert not (await client.context_window()).discovered
                asked_at.append(len(fake.probes) > before)
            assert asked_at == [True, True, False, True, False, True]
            fake.server_kind, fake.context_window = "llamacpp", 32_768
            now[0] += 241
            assert (await client.context_window()).tokens == 32_768
    assert "context window of m: now 32768 tokens (was the fallback 8192)" in caplog.text


async def test_a_fallback_window_does_not_stick_in_the_context_builder(store):
    """The builder asked the client once and kept its answer for the life of the process: a
    server down at start left every session shaped for 8,192 tokens."""
    from test_context_support import builder

    now = [0.0]
    async with FakeLLM(server_kind="openai") as fake:
        async with LLMClient(LLMConfig(base_url=fake.base_url, model="m"), clock=lambda: now[0]) as client:
            b = builder(store, "auto")
            b.windows = client.window_tokens
            await b._discover("m")
            assert b.window_of("m") == FALLBACK_WINDOW
            fake.server_kind, fake.context_window = "llamacpp", 65_536
            now[0] += 31
            await b._discover("m")
            assert b.window_of("m") == 65_536


async def test_openai_models_get_their_documented_windows_without_a_request():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"no request expected, got {request.url}")

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
        found = await ServerInfo(http, "https://api.openai.com/v1").window("gpt-4o-mini")
    assert (found.tokens, found.discovered) == (128_000, True)


async def test_claude_models_get_anthropics_documented_window_without_a_request():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"no request expected, got {request.url}")

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
        found = await ServerInfo(http, "https://api.anthropic.com/v1").window("claude-sonnet-4-5")
    assert (found.tokens, found.discovered) == (200_000, True)
