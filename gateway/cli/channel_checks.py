"""Is a chat channel's token right, and whose is it: Telegram's `getMe`, Slack's `auth.test`
and (Socket Mode) `apps.connections.open`, asked over plain HTTP.

Each answers a `Check` (gateway/cli/doctor.py) and what it learned (the bot's name). A token is
never part of what is shown: an error text that quotes the request URL has it taken out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

from gateway.cli.doctor import Check
from gateway.config.redaction import redact_text, redact_url

TIMEOUT_S = 15.0
# Slack's answers about a token that is not what it should be, and what to do about each.
_SLACK_TOKEN_FIXES = {
    "invalid_auth": "the token was refused",
    "not_authed": "no token was sent",
    "account_inactive": "the app was uninstalled or its workspace deleted",
    "token_revoked": "the token was revoked",
    "token_expired": "the token expired",
    "not_allowed_token_type": "this kind of token cannot be used here",
}


@dataclass(frozen=True)
class Found:
    check: Check
    name: str = ""  # the bot's @name (Telegram) or user name (Slack), when the token worked
    user_id: str = ""

    @property
    def ok(self) -> bool:
        return self.check.status != "fail"


async def telegram_bot(api_base_url: str, token: str) -> Found:
    """`getMe` with the token: the bot's @name, or why not (telegram.token)."""
    shown = redact_url(api_base_url)
    try:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            response = await http.get(f"{api_base_url}{token}/getMe")
    except httpx.HTTPError as exc:
        return Found(Check("telegram", "fail", f"cannot reach {shown}: {_said(exc, token)}",
                           "check the network (a proxy: HTTPS_PROXY) and telegram.api_base_url"))
    body = _json(response)
    if response.status_code in (401, 404) or body.get("error_code") in (401, 404):
        return Found(Check("telegram", "fail", f"Telegram refused the bot token (HTTP {response.status_code})",
                           "copy the token again from @BotFather (/mybots, API Token): TELEGRAM_BOT_TOKEN"))
    result = body.get("result") if body.get("ok") else None
    if not isinstance(result, dict) or not result.get("username"):
        return Found(Check("telegram", "fail", f"{shown} did not answer getMe like the Bot API "
                           f"(HTTP {response.status_code})", "check telegram.api_base_url"))
    name = str(result["username"])
    return Found(Check("telegram", "ok", f"the token is @{name}'s ({result.get('first_name', name)})"),
                 name=name, user_id=str(result.get("id", "")))


async def slack_bot(api_base_url: str, bot_token: str) -> Found:
    """`auth.test` with the bot token: the bot's name and workspace, or why not (slack.bot_token)."""
    body, problem = await _slack(api_base_url, "auth.test", bot_token)
    fix = "use the Bot User OAuth Token (xoxb-...) of the app's OAuth & Permissions page: SLACK_BOT_TOKEN"
    if problem:
        return Found(Check("slack", "fail", f"auth.test: {problem}", fix))
    if not body.get("bot_id"):
        return Found(Check("slack", "fail", "the token is a person's, not the app's bot", fix))
    name = str(body.get("user") or body.get("user_id") or "the bot")
    found = f"the token is @{name}'s in the workspace {body.get('team') or body.get('team_id')}"
    return Found(Check("slack", "ok", found), name=name, user_id=str(body.get("user_id", "")))


async def slack_socket_mode(api_base_url: str, app_token: str) -> Check:
    """`apps.connections.open` with the app-level token: Socket Mode can connect (slack.app_token)."""
    _, problem = await _slack(api_base_url, "apps.connections.open", app_token)
    if problem:
        return Check("slack socket mode", "fail", f"apps.connections.open: {problem}",
                     "turn on Socket Mode in the app's settings and use an App-Level Token (xapp-...) "
                     "with connections:write (Basic Information): SLACK_APP_TOKEN")
    return Check("slack socket mode", "ok", "the app-level token opens a Socket Mode connection")


def slack_signing_secret(secret: str) -> Check:
    """Slack cannot be asked about a signing secret; its shape can be checked."""
    if re.fullmatch(r"[0-9A-Za-z]{32}", secret):
        return Check("slack signing secret", "ok", "32 characters, as Slack's are")
    return Check("slack signing secret", "fail", "a signing secret is 32 letters and digits",
                 "copy the Signing Secret of the app's Basic Information page: SLACK_SIGNING_SECRET")


async def _slack(api_base_url: str, method: str, token: str) -> tuple[dict, str]:
    """Slack's answer and, when it said no or could not be reached, why."""
    try:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            response = await http.post(f"{api_base_url}{method}", headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError as exc:
        return {}, f"cannot reach {redact_url(api_base_url)}: {_said(exc, token)}"
    body = _json(response)
    if body.get("ok"):
        return body, ""
    error = str(body.get("error") or f"HTTP {response.status_code}")
    return body, f"{error} ({_SLACK_TOKEN_FIXES[error]})" if error in _SLACK_TOKEN_FIXES else error


def _json(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _said(exc: Exception, token: str) -> str:
    text = str(exc) or type(exc).__name__
    return redact_text(text.replace(token, "<token>") if token else text)
