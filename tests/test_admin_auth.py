"""The console's sessions, login limit and token checks, on a clock the test moves."""

from __future__ import annotations

from gateway.admin.auth import LoginLimiter, Sessions, bearer, csrf_matches, token_matches
from gateway.admin.queries import redacted_config
from gateway.config import Config


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_expires_and_its_id_is_random():
    clock = Clock()
    sessions = Sessions(ttl_s=60, clock=clock)
    first, session = sessions.open("dana")
    second, _ = sessions.open("dana")
    assert first != second and len(first) >= 40
    assert sessions.get(first) is session and sessions.get("forged") is None and sessions.get(None) is None
    clock.now += 61
    assert sessions.get(first) is None


def test_the_csrf_token_belongs_to_its_session():
    sessions = Sessions()
    _, one = sessions.open("a")
    _, other = sessions.open("b")
    assert csrf_matches(one, one.csrf) and not csrf_matches(one, other.csrf) and not csrf_matches(one, "")


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
