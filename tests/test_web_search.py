"""web_search against fakes of SearXNG, Brave and Tavily that speak their real APIs on 127.0.0.1
(tests/fakes/search.py): the request each provider expects, results as title, URL and snippet,
the count bounded, and every failure (a refused key, a rate limit, a slow or broken provider, a
redirect) a clear tool result that never shows the key."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from fakes.search import FakeSearch
from tooling import make_ctx

from gateway.config import Config, ConfigError, SearchConfig, load_config
from gateway.config.redaction import redacted_config
from gateway.tools import ToolOutcome, run_tool
from gateway.tools.builtin_search import search_specs

KEY = "BSAk3y-0123456789abcdef"
PROVIDERS = ("searxng", "brave", "tavily")


@pytest.fixture
async def fake():
    async with FakeSearch(key=KEY) as server:
        yield server


def settings(fake: FakeSearch, provider: str, **extra: Any) -> SearchConfig:
    url = {"searxng": fake.searxng_url, "brave": fake.brave_url, "tavily": fake.tavily_url}[provider]
    key = {} if provider == "searxng" else {"api_key": KEY}
    return SearchConfig(provider=provider, url=url, **key, **extra)  # type: ignore[arg-type]


async def search(config: SearchConfig, tmp_path, **args: Any) -> ToolOutcome:
    (spec,) = search_specs(config)
    # the default: loopback is refused to web_fetch, yet the configured provider is reached
    ctx = make_ctx(tmp_path, http_fetch_allow_private=False)
    return await run_tool(spec, args, ctx)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_results_come_back_as_title_url_and_snippet(fake, tmp_path, provider):
    outcome = await search(settings(fake, provider), tmp_path, query="tidal power station")
    assert not outcome.failed, outcome.text
    lines = outcome.text.splitlines()
    label = {"searxng": "SearXNG", "brave": "Brave Search", "tavily": "Tavily"}[provider]
    assert lines[0] == f'4 results for "tidal power station" ({label}):'
    assert lines[1:5] == [
        "",
        "1. Tidal power - Wikipedia",
        "   https://en.wikipedia.org/wiki/Tidal_power",
        "   Tidal power or tidal energy is harnessed by converting energy from tides into useful forms of power, "
        "mainly electricity, using various methods.",
    ]
    assert "2. Sihwa Lake Tidal Power Station" in lines
    assert "<strong>" not in outcome.text  # Brave marks the query's words in its snippets
    assert KEY not in outcome.text


async def test_each_provider_is_asked_the_way_its_api_wants(fake, tmp_path):
    for provider in PROVIDERS:
        await search(settings(fake, provider), tmp_path, query="tidal  power", count=3)
    searxng, brave, tavily = fake.requests
    assert (searxng.method, searxng.path, searxng.query) == ("GET", "/search", {"q": "tidal power", "format": "json"})
    assert "X-Subscription-Token" not in searxng.headers and "Authorization" not in searxng.headers
    assert (brave.method, brave.path, brave.query) == ("GET", "/res/v1/web/search", {"q": "tidal power", "count": "3"})
    assert brave.headers["X-Subscription-Token"] == KEY and brave.headers["Accept"] == "application/json"
    assert (tavily.method, tavily.path) == ("POST", "/search")
    assert tavily.headers["Authorization"] == f"Bearer {KEY}"
    assert tavily.json == {"query": "tidal power", "max_results": 3, "search_depth": "basic"}


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_count_is_bounded(fake, tmp_path, provider):
    config = settings(fake, provider, max_results=2, default_results=3)
    many = await search(config, tmp_path, query="tidal", count=50)
    assert many.text.startswith('2 results for "tidal"') and "\n\n(count is at most 2 a call)" in many.text
    assert "3. " not in many.text
    default = await search(config, tmp_path, query="tidal")
    assert default.text.startswith("2 results") and "count is at most" not in default.text
    one = await search(config, tmp_path, query="tidal", count=1)
    assert one.text.startswith('1 result for "tidal"')
    asked = [r.query.get("count") or (r.json or {}).get("max_results") for r in fake.requests]
    if provider != "searxng":  # SearXNG has no count: its list is cut here
        assert [int(n) for n in asked] == [2, 2, 1]
    zero = await search(config, tmp_path, query="tidal", count=0)
    assert zero.failed and "count must be between 1 and 2" in zero.text
    assert len(fake.requests) == 3  # a bad count is not sent


async def test_a_bad_query_is_answered_without_asking_the_provider(fake, tmp_path):
    config = settings(fake, "brave")
    empty = await search(config, tmp_path, query="   ")
    assert empty.failed and "query is empty" in empty.text
    long = await search(config, tmp_path, query="tide " * 100)
    assert long.failed and "at most 400" in long.text
    missing = await search(config, tmp_path)
    assert missing.failed and "Fix the arguments" in missing.text
    assert fake.requests == []


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_no_results_is_an_answer(fake, tmp_path, provider):
    outcome = await search(settings(fake, provider), tmp_path, query="xylophone quartz")
    assert not outcome.failed and outcome.text.startswith('No results for "xylophone quartz"')


async def test_searxng_names_the_engines_that_did_not_answer(fake, tmp_path):
    outcome = await search(settings(fake, "searxng"), tmp_path, query="tidal")
    assert outcome.text.endswith("Engines that did not answer: google timeout")


@pytest.mark.parametrize(
    "provider, words",
    [
        ("brave", "HTTP 422 Unprocessable Entity: SUBSCRIPTION_TOKEN_INVALID: The provided subscription token is "
                  "invalid."),
        ("tavily", "HTTP 401 Unauthorized: Unauthorized: missing or invalid API key."),
    ],
)
async def test_a_refused_key_says_the_operator_must_fix_it(fake, tmp_path, provider, words):
    fake.key = "another-key"
    outcome = await search(settings(fake, provider), tmp_path, query="tidal")
    assert outcome.failed
    assert words in outcome.text and "search.api_key" in outcome.text and "tell the user" in outcome.text
    assert KEY not in outcome.text


@pytest.mark.parametrize(
    "provider, failure, words",
    [
        ("brave", "rate_limit", "RATE_LIMITED: Request rate limit exceeded for plan.); it says to wait 1s"),
        ("brave", "usage_limit", "QUOTA_LIMITED: Request quota limit exceeded for plan."),
        ("tavily", "rate_limit", "HTTP 429 Too Many Requests: Your request has been blocked due to excessive"),
        ("tavily", "usage_limit", "HTTP 432"),
        ("searxng", "rate_limit", "the instance's limiter refused the request"),
    ],
)
async def test_a_rate_or_usage_limit_says_to_try_later(fake, tmp_path, provider, failure, words):
    fake.failure = failure
    outcome = await search(settings(fake, provider), tmp_path, query="tidal")
    assert outcome.failed and words in outcome.text, outcome.text
    assert "rate or usage limit" in outcome.text and "Try again later" in outcome.text


async def test_searxng_without_json_says_how_to_turn_it_on(fake, tmp_path):
    fake.failure = "json_off"
    outcome = await search(settings(fake, "searxng"), tmp_path, query="tidal")
    assert outcome.failed and "HTTP 403 Forbidden" in outcome.text and "add json to search.formats" in outcome.text


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_slow_provider_times_out(fake, tmp_path, provider):
    fake.delay = 2.0
    outcome = await search(settings(fake, provider, timeout_s=0.3), tmp_path, query="tidal")
    assert outcome.failed and "did not answer within 0.3s" in outcome.text


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_broken_provider_is_a_clear_failure(fake, tmp_path, provider):
    config = settings(fake, provider)
    fake.failure = "server_error"
    broken = await search(config, tmp_path, query="tidal")
    assert broken.failed and "failed to search (HTTP 502 Bad Gateway)." in broken.text
    fake.failure = "not_json"
    garbled = await search(config, tmp_path, query="tidal")
    assert garbled.failed and "not JSON" in garbled.text


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_redirect_is_not_followed_and_the_key_is_not_shown(fake, tmp_path, provider):
    fake.failure = "redirect"  # to /elsewhere?token=<the key>
    outcome = await search(settings(fake, provider), tmp_path, query="tidal")
    assert outcome.failed and "redirects are not followed" in outcome.text
    assert KEY not in outcome.text
    assert [r.path for r in fake.requests] != [] and "/elsewhere" not in [r.path for r in fake.requests]


async def test_an_answer_larger_than_the_cap_is_refused(fake, tmp_path):
    outcome = await search(settings(fake, "searxng", max_response_bytes=1000), tmp_path, query="tidal")
    assert outcome.failed and "larger than search.max_response_bytes (1000)" in outcome.text


async def test_an_unreachable_provider_is_named(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    outcome = await search(SearchConfig(provider="searxng", url=f"http://127.0.0.1:{port}"), tmp_path, query="x")
    expected = f"SearXNG at http://127.0.0.1:{port}/search cannot be reached: ConnectError"
    assert outcome.failed and expected in outcome.text


# --- configuration ---------------------------------------------------------------------------


def test_without_a_provider_there_is_no_web_search():
    assert search_specs(SearchConfig()) == []


@pytest.mark.parametrize(
    "values, words",
    [
        ({"provider": "searxng"}, "searxng needs the instance's address"),
        ({"provider": "brave"}, "brave needs a key"),
        ({"provider": "tavily", "api_key": "k"}, None),
        ({"provider": "brave", "api_key": "k", "url": "http://search.internal/api"}, "use https://"),
        ({"provider": "brave", "api_key": "k", "url": "http://127.0.0.1:9000/x"}, None),
        ({"provider": "tavily", "api_key": "k", "url": "ftp://x"}, "expected an http:// or https:// URL"),
        ({"provider": "bing"}, "provider"),
        ({"provider": "searxng", "url": "http://127.0.0.1:8888", "max_results": 50}, "max_results"),
    ],
)
def test_the_search_settings_are_checked(values, words):
    if words is None:
        Config.model_validate({"search": values})
        return
    with pytest.raises(ValueError, match=words):
        Config.model_validate({"search": values})


def test_the_key_comes_from_the_environment_and_is_masked(tmp_path, monkeypatch):
    path = tmp_path / "config.yml"
    path.write_text("search:\n  provider: brave\n  api_key: BSAliteral\n")
    with pytest.raises(ConfigError, match=r"search.api_key: secrets are read from the environment only"):
        load_config(path)
    path.write_text("search:\n  provider: searxng\n  url: http://user:hunter22@127.0.0.1:8888\n")
    monkeypatch.setenv("SEARCH_API_KEY", KEY)
    config = load_config(path)
    assert config.search.api_key == KEY
    shown = redacted_config(config)["search"]
    assert shown["provider"] == "searxng" and shown["max_results"] == 10
    assert KEY not in str(shown) and "hunter22" not in str(shown)
    assert shown["url"] == "http://••••@127.0.0.1:8888"
