"""`gateway doctor`'s checks of the database, the chat channels and the jobs: each part the
gateway needs before it can serve, asked the way `serve` would ask it, each answer one `Check`.

The channels are asked over plain HTTP (gateway/cli/channel_checks.py); the jobs are read by the
scheduler's own rules, which the entry point passes in (gateway/cli may not import scheduler/).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable
from datetime import datetime
from typing import Protocol

from gateway.cli.channel_checks import Found, slack_bot, slack_signing_secret, slack_socket_mode, telegram_bot
from gateway.cli.database import DatabaseState, opened
from gateway.cli.doctor import Check, Status
from gateway.config import Config, SchedulerConfig, TelegramConfig
from gateway.config.redaction import redact_text
from gateway.events import utcnow
from gateway.store.db import SCHEMA_REVISION

PROBE_TIMEOUT_S = 10.0
WEBHOOK_PATH = "/telegram/webhook"
WEBHOOK_SECRET = re.compile(r"^[A-Za-z0-9_-]{1,256}$")  # what Telegram accepts as secret_token
CRON_FIX = "a cron expression has five fields, minute hour day-of-month month day-of-week, e.g. '0 9 * * 1-5'"


class JobRules(Protocol):
    """The scheduler's reading of `scheduler.jobs` (scheduler/control.py `config_jobs`)."""

    def config_jobs(self, config: SchedulerConfig, now: datetime) -> list[tuple[str, datetime | None, str]]: ...


async def parts_checks(config: Config, jobs: JobRules) -> list[Check]:
    """The database's, the channels' and the jobs' checks, in that order (asked at the same time)."""
    database, channels = await asyncio.gather(database_checks(config), channel_checks(config))
    return [*database, *channels, *job_checks(config, jobs)]


async def database_checks(config: Config) -> list[Check]:
    async with opened(config.database.url, PROBE_TIMEOUT_S) as (state, _):
        return [database_check(state, auto_migrate=config.database.auto_migrate)]


def database_check(state: DatabaseState, *, auto_migrate: bool) -> Check:
    if state.problem:  # one line with its fix (gateway/store/failures.py)
        return _check("database", "fail", state.problem)
    if not state.created:
        return _check("database", "ok", f"{state.url}: not created yet; {state.note}")
    if state.current:
        return _check("database", "ok", f"{state.url}: connected, schema {state.revision} (current)")
    if state.ahead:
        return _check(
            "database", "fail", f"{state.url}: {state.schema()}",
            "run this version of the gateway or newer, or point database.url at its own database",
        )
    if state.revision is None and auto_migrate:
        return _check("database", "ok", f"{state.url}: connected, no tables yet; the first gateway serve creates them")
    if auto_migrate:
        return _check(
            "database", "warn", f"{state.url}: connected, {state.schema()}",
            f"serve migrates it to {SCHEMA_REVISION} at start; with several instances run gateway migrate first",
        )
    return _check(
        "database", "fail", f"{state.url}: connected, {state.schema()}",
        "run gateway migrate (database.auto_migrate is false, so serve refuses an old schema)",
    )


async def channel_checks(config: Config) -> list[Check]:
    """Each configured chat channel's token (getMe, auth.test) and the settings of its mode."""
    checks: list[Check] = []
    if config.telegram.enabled:
        telegram = config.telegram
        checks.append((await _within(telegram_bot(telegram.api_base_url, telegram.token), "telegram")).check)
        checks += webhook_checks(telegram)
    if config.slack.enabled:
        slack = config.slack
        checks.append((await _within(slack_bot(slack.api_base_url, slack.bot_token), "slack")).check)
        if slack.app_token:
            checks.append((await _within(_as_found(slack_socket_mode(slack.api_base_url, slack.app_token)),
                                         "slack socket mode")).check)
        else:  # HTTP mode: events are signed with the signing secret
            checks.append(slack_signing_secret(slack.signing_secret))
    return checks


def webhook_checks(telegram: TelegramConfig) -> list[Check]:
    """Webhook mode's URL and secret, as Telegram and the gateway's route need them."""
    if telegram.mode != "webhook":
        return []
    if not telegram.webhook_secret:
        return [_check(
            "telegram webhook", "fail", "webhook mode without a secret: anyone could post updates",
            "set TELEGRAM_WEBHOOK_SECRET (telegram.webhook_secret), e.g. to the output of openssl rand -hex 32",
        )]
    if not WEBHOOK_SECRET.match(telegram.webhook_secret):
        return [_check(
            "telegram webhook", "fail", "the webhook secret has characters Telegram refuses",
            "use 1-256 of A-Z, a-z, 0-9, _ and - in TELEGRAM_WEBHOOK_SECRET (telegram.webhook_secret)",
        )]
    url = telegram.webhook_url
    if not url.startswith("https://"):
        return [_check(
            "telegram webhook", "fail", f"telegram.webhook_url is {url or 'not set'}; Telegram posts only to https",
            f"set telegram.webhook_url to this gateway's public https:// address ending in {WEBHOOK_PATH}",
        )]
    if not url.rstrip("/").endswith(WEBHOOK_PATH):
        return [_check(
            "telegram webhook", "warn", f"{url} does not end in {WEBHOOK_PATH}, where the gateway takes updates",
            f"end telegram.webhook_url in {WEBHOOK_PATH} (or have the proxy rewrite the path to it)",
        )]
    return [_check("telegram webhook", "ok", f"updates are posted to {url} with the secret header")]


def job_checks(config: Config, jobs: JobRules) -> list[Check]:
    checks = []
    for name, next_firing, problem in jobs.config_jobs(config.scheduler, utcnow()):
        where = f"scheduler.jobs[{name}]"
        if problem:
            fix = CRON_FIX if problem.startswith("cron") else f"correct {where}; serve leaves the job out until then"
            checks.append(_check(f"job {name}", "fail", f"{where}: {problem}", fix))
        elif next_firing is None:
            checks.append(_check(f"job {name}", "ok", "off, or it will not fire again"))
        else:
            checks.append(_check(f"job {name}", "ok", f"next firing {next_firing:%Y-%m-%d %H:%M %Z}"))
    return checks


async def _within(probe: Awaitable[Found], name: str, timeout_s: float = PROBE_TIMEOUT_S) -> Found:
    """A platform's answer, or a failure when it gives none in time: a check never hangs the command."""
    try:
        return await asyncio.wait_for(probe, timeout_s)
    except TimeoutError:
        return Found(Check(name, "fail", f"no answer within {timeout_s:g}s", "check the network and the api_base_url"))


async def _as_found(check: Awaitable[Check]) -> Found:
    return Found(await check)


def _check(name: str, status: Status, found: str, fix: str = "") -> Check:
    return Check(name, status, redact_text(found), redact_text(fix))
