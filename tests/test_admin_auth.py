"""The console's sessions, login limit and token checks, on a clock the test moves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gateway.admin.auth import LoginLimiter, Sessions, bearer, csrf_matches, token_matches
from gateway.config import Config
from gateway.config.redaction import redacted_config
from gateway.serving.guesses import MAX_CLIENTS


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class WallClock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


async def test_a_session_expires_and_its_id_is_random(store):
    clock = WallClock()
    sessions = Sessions(store.console, ttl_s=60, clock=clock)
    first, session = await sessions.open("dana")
    second, _ = await sessions.open("dana")
    assert first != second and len(first) >= 40
    assert await sessions.get(first) == session
    assert await sessions.get("forged") is None and await sessions.get(None) is None
    clock.now += timedelta(seconds=61)
    assert await sessions.get(first) is None


async def test_the_csrf_token_belongs_to_its_session(store):
    sessions = Sessions(store.console)
    one_id, one = await sessions.open("a")
    _, other = await sessions.open("b")
    assert csrf_matches(one, one.csrf) and not csrf_matches(one, other.csrf) and not csrf_matches(one, "")
    assert (await sessions.get(one_id)).csrf == one.csrf  # the same on any instance: derived, not stored


def test_failed_logins_block_an_address_for_the_window():
    clock = Clock()
    limiter = LoginLimiter(failures=3, window_s=100, clock=clock)
    for _ in range(3):
        assert limiter.blocked("10.0.0.1") == 0
        limiter.failed("10.0.0.1")
    assert limiter.blocked("10.0.0.1") == 100 and limiter.blocked("10.0.0.2") == 0
    clock.now += 100
    assert limiter.blocked("10.0.0.1") == 0


def test_tokens_and_bearer_headers():
    assert token_matches("s3cret", "s3cret") and not token_matches("s3cre", "s3cret")
    assert not token_matches("", "")  # no token configured: nothing matches
    assert bearer("Bearer abc") == "abc" and bearer("bearer  abc ") == "abc" and bearer("abc") == ""


def test_the_configuration_view_redacts_every_secret():
    config = Config.model_validate(
        {"admin": {"token": "adm-1"}, "telegram": {"token": "123:tg"}, "llm": {"api_key": "sk-xyz"}}
    )
    shown = redacted_config(config)
    assert (shown["admin"]["token"], shown["telegram"]["token"], shown["llm"]["api_key"]) == (
        "•••• (set, 5 characters)", "•••• (set, 6 characters)", "•••• (set, 6 characters)"
    )
    assert shown["slack"]["bot_token"] == "" and "adm-1" not in str(shown) and "sk-xyz" not in str(shown)


def test_rotating_addresses_do_not_grow_the_limiter_without_bound():
    clock = Clock()
    limiter = LoginLimiter(failures=3, window_s=100, clock=clock)
    for i in range(MAX_CLIENTS + 50):
        limiter.failed(f"2001:db8::{i:x}")
    assert len(limiter._seen) <= MAX_CLIENTS  # noqa: SLF001
    assert limiter.blocked("10.0.0.1") == 0 and "10.0.0.1" not in limiter._seen  # noqa: SLF001 - a check adds nothing
