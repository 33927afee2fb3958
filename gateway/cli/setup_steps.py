"""The steps of `gateway setup`: the model server, Telegram, Slack, and who owns each channel.

Each step takes its answers from the flags first, then the questions (the current settings are
their defaults), checks them against the real server the way `gateway doctor` does, and puts
what passed into the draft. A failed check asks again on a terminal and stops a
`--non-interactive` run (nothing is written then).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from gateway.cli.channel_checks import slack_bot, slack_signing_secret, slack_socket_mode, telegram_bot
from gateway.cli.doctor import MARKS, Check, Report, diagnose, model_ids
from gateway.cli.setup_draft import Draft
from gateway.cli.setup_prompts import Prompter, SetupAborted
from gateway.config import LLMConfig
from gateway.config.core import Api
from gateway.config.redaction import redact_url
from gateway.llm import LLMClient
from gateway.llm.api_probe import ApiAnswer, probe_apis, spoken, suggest_api

TELEGRAM_ID = re.compile(r"^\d{1,20}$")
SLACK_ID = re.compile(r"^[UW][A-Z0-9]{2,}$")


class CheckFailed(SetupAborted):
    """A check failed in a run that cannot ask again."""


@dataclass
class Outcome:
    """What the run learned, for the closing lines: the bots' names and the channels' owners."""

    bots: dict[str, str] = field(default_factory=dict)  # channel -> @name
    owners: dict[str, str] = field(default_factory=dict)  # channel -> the id given now
    model: str = ""  # the model, and its window as found or given


# ---- the model server ------------------------------------------------------------------------
async def model_server(args: argparse.Namespace, draft: Draft, ask: Prompter, outcome: Outcome) -> None:
    ask.say("\nModel server (OpenAI Chat Completions or Responses, or Anthropic Messages: OpenAI, Anthropic, "
            "OpenRouter, vLLM, llama.cpp, Ollama, LiteLLM...)")
    current = draft.current.llm
    base_url, api_key = args.llm_base_url or current.base_url, current.api_key
    while True:
        base_url = args.llm_base_url or ask.ask("  Address (it usually ends in /v1)", base_url)
        api_key = _given(args.llm_api_key) or ask.secret("  API key (empty if it needs none)", bool(api_key)) or api_key
        answers = await probe_apis(base_url, api_key)  # which APIs it speaks, asked with an empty request each
        listing: Api = args.llm_api or (current.api if answers[current.api].speaks else None) or _first(answers)
        served = await _served_models(base_url, api_key, listing)
        if served is not None:
            model = _pick_model(args, ask, served, current.model)
            api = args.llm_api or suggest_api(model, base_url, answers, current.api) or current.api
            window = args.context_window or current.context_window
            llm = LLMConfig(base_url=base_url, api_key=api_key, model=model, api=api, context_window=window,
                            max_retries=1, retry_budget_s=10)
            report = await diagnose(llm, on_check=_indented)  # its "api" line says what the server speaks
            if not report.failed:
                break
        _again(args, ask, "the model server")
        args.llm_base_url = args.llm_api_key = args.llm_model = args.llm_api = None  # a failed flag is asked again
    draft.set("llm", "base_url", base_url)
    draft.set("llm", "model", model)
    if api != current.api:
        draft.set("llm", "api", api)
    if api_key:
        draft.set_secret("llm", "api_key", "LLM_API_KEY", api_key)
    outcome.model = _window(args, draft, ask, report, model)


def _first(answers: dict[Api, ApiAnswer]) -> Api:
    """The API to list the models with before one is chosen: the first the server speaks."""
    return next(iter(spoken(answers)), "chat")


async def _served_models(base_url: str, api_key: str, api: Api = "chat") -> list[str] | None:
    """The models the server lists (empty: it lists none), or None when it cannot be used; asked
    with the headers of `api` (Anthropic's API wants its own key header)."""
    async with LLMClient(LLMConfig(base_url=base_url, api_key=api_key, api=api)) as client:
        url = client.server.base + "/models"
        try:
            response = await client.server.http.get(url)  # the client's own connection and credentials
        except httpx.HTTPError as exc:
            _indented(Check("reachable", "fail", f"cannot reach {redact_url(url)}: {exc or type(exc).__name__}",
                            "check the address and that the server is running"))
            return None
    if response.status_code in (401, 403):
        _indented(Check("auth", "fail", f"HTTP {response.status_code}: the server refused the key",
                        "check the API key"))
        return None
    if response.status_code == 404:
        hint = "" if re.search(r"/v\d+$", base_url.rstrip("/")) else f": try {base_url.rstrip('/')}/v1"
        _indented(Check("reachable", "fail", f"{redact_url(url)} answered 404: no OpenAI-compatible API there",
                        f"an OpenAI-compatible address usually ends in /v1{hint}"))
        return None
    return model_ids(response) or []


def _pick_model(args: argparse.Namespace, ask: Prompter, served: list[str], current: str) -> str:
    if args.llm_model:
        return str(args.llm_model)
    default = current if current in served or not served else served[0]
    if not ask.interactive:
        if len(served) > 1 and current not in served:
            raise CheckFailed(f"the server serves {', '.join(served[:10])}: pick one with --llm-model")
        return default
    if not served:
        return ask.ask("  Model (the server lists none)", default)
    ask.say("  Models the server serves:")
    return ask.choose("  Model", served, str(served.index(default) + 1))


def _window(args: argparse.Namespace, draft: Draft, ask: Prompter, report: Report, model: str) -> str:
    """The window found (or, when the server does not say it, asked for); what to show of it."""
    found = next((c for c in report.checks if c.name == "context window"), None)
    tokens = args.context_window
    if not tokens and found is not None and found.status == "warn" and ask.interactive:
        tokens = int(ask.ask("  The server did not say the model's context window: how many tokens?", "8192",
                             check=lambda a: "" if a.isdigit() and int(a) >= 512 else "a number of tokens, e.g. 8192"))
    if tokens:
        draft.set("llm", "context_window", tokens)
        return f"{model}, a {tokens:,}-token window (given)"
    return f"{model}, a window of {found.found}" if found is not None and found.status == "ok" else model


# ---- Telegram --------------------------------------------------------------------------------
async def telegram(args: argparse.Namespace, draft: Draft, ask: Prompter, outcome: Outcome) -> None:
    current = draft.secret("telegram", "token", "TELEGRAM_BOT_TOKEN")
    if not _wanted(ask, "Telegram", "a Telegram bot", bool(current), "--telegram-token", args.telegram_token):
        return
    api = args.telegram_api_url or draft.current.telegram.api_base_url
    checked = await _checked_token(
        args, "telegram_token", ask, current, prompt="  Bot token (from @BotFather)", platform="Telegram",
        what="the Telegram token", check=lambda token: telegram_bot(api, token),
    )
    if checked is None:
        return
    token, found = checked
    draft.set_secret("telegram", "token", "TELEGRAM_BOT_TOKEN", token)
    if args.telegram_api_url:
        draft.set("telegram", "api_base_url", api)
        if api.endswith("/bot"):  # a local Bot API server serves files beside it
            draft.set("telegram", "api_file_url", api.removesuffix("/bot") + "/file/bot")
    outcome.bots["telegram"] = f"@{found.name}"
    _owner(args.telegram_owner, "telegram", draft, ask, outcome, TELEGRAM_ID,
           "  Your Telegram user id (a number; @userinfobot tells it), to approve the agent's tool calls")


async def _checked_token(
    args: argparse.Namespace, flag: str, ask: Prompter, current: str, *, prompt: str, platform: str, what: str,
    check: Callable[[str], Awaitable[Any]],
) -> tuple[str, Any] | None:
    """A bot token (the flag's, else asked, else the current one) that its platform accepts, with
    what the platform said of it; asked again until it does (a flag's is tried once). None: no token."""
    while True:
        token = _given(getattr(args, flag)) or ask.secret(prompt, bool(current)) or current
        if not token:
            ask.say(f"  no token: {platform} is left out")
            return None
        found = await check(token)
        _indented(found.check)
        if found.ok:
            return token, found
        _again(args, ask, what)
        setattr(args, flag, None)


# ---- Slack -----------------------------------------------------------------------------------
async def slack(args: argparse.Namespace, draft: Draft, ask: Prompter, outcome: Outcome) -> None:
    current = draft.secret("slack", "bot_token", "SLACK_BOT_TOKEN")
    if not _wanted(ask, "Slack", "a Slack app", bool(current), "--slack-bot-token", args.slack_bot_token):
        return
    api = args.slack_api_url or draft.current.slack.api_base_url
    checked = await _checked_token(
        args, "slack_bot_token", ask, current, prompt="  Bot token (xoxb-...)", platform="Slack",
        what="the Slack bot token", check=lambda token: slack_bot(api, token),
    )
    if checked is None:
        return
    token, found = checked
    draft.set_secret("slack", "bot_token", "SLACK_BOT_TOKEN", token)
    if args.slack_api_url:
        draft.set("slack", "api_base_url", api)
    await _slack_events(args, draft, ask, api)
    outcome.bots["slack"] = f"@{found.name}"
    _owner(args.slack_owner, "slack", draft, ask, outcome, SLACK_ID,
           "  Your Slack member id (U...; your profile, ⋮, Copy member ID), to approve the agent's tool calls")


async def _slack_events(args: argparse.Namespace, draft: Draft, ask: Prompter, api: str) -> None:
    """Socket Mode (an app-level token, no public URL) or HTTP events (a signing secret)."""
    app_token = draft.secret("slack", "app_token", "SLACK_APP_TOKEN")
    signing = draft.secret("slack", "signing_secret", "SLACK_SIGNING_SECRET")
    if args.slack_app_token or args.slack_signing_secret:
        socket = bool(args.slack_app_token)
    else:
        socket = ask.yes("  Socket Mode (no public URL needed; else HTTP events)?", bool(app_token) or not signing)
    name, variable, current = ("app_token", "SLACK_APP_TOKEN", app_token) if socket else \
        ("signing_secret", "SLACK_SIGNING_SECRET", signing)
    flag = args.slack_app_token if socket else args.slack_signing_secret
    question = "  App-level token (xapp-..., Basic Information)" if socket else "  Signing secret (Basic Information)"
    while True:
        value = _given(flag) or ask.secret(question, bool(current)) or current
        if not value and not ask.interactive:
            raise CheckFailed("Slack needs --slack-app-token (Socket Mode) or --slack-signing-secret (HTTP events)")
        check = (await slack_socket_mode(api, value)) if socket else slack_signing_secret(value)
        _indented(check)
        if check.status == "ok":
            break
        _again(args, ask, "the Slack " + ("app-level token" if socket else "signing secret"))
        flag = None
    draft.set_secret("slack", name, variable, value)
    if not socket:
        draft.drop_secret("slack", "app_token", "SLACK_APP_TOKEN")
        ask.say("  Slack sends events to POST /slack/events: give it https://<your public address>/slack/events "
                "(Event Subscriptions and Interactivity; docs/slack.md)")


# ---- owners ----------------------------------------------------------------------------------
def _owner(
    given: str | None, channel: str, draft: Draft, ask: Prompter, outcome: Outcome, shape: re.Pattern[str],
    question: str,
) -> None:
    admins = draft.current.approvals.admins.get(channel) or []
    if given is not None and given and not shape.match(given):
        raise CheckFailed(f"--{channel}-owner {given!r}: " + _shape_hint(channel))
    owner = given if given is not None else ask.ask(
        question + " (empty: claim it with a code at the first start)", admins[0] if admins else "",
        check=lambda a: "" if shape.match(a) else _shape_hint(channel),
    )
    if owner:
        outcome.owners[channel] = owner


def admins_with_owners(draft: Draft, owners: dict[str, str]) -> dict[str, list[int | str]] | None:
    """approvals.admins with the owners added (the admins already there stay), or None when
    nothing is new."""
    raw = draft.yaml.get("approvals", "admins")
    admins: dict[str, list[int | str]] = {k: list(v or []) for k, v in raw.items()} if isinstance(raw, dict) else {}
    added = False
    for channel, owner in owners.items():
        ids = admins.setdefault(channel, [])
        if owner not in [str(i) for i in ids]:
            ids.append(int(owner) if channel == "telegram" else owner)
            added = True
    return admins if added else None


def _shape_hint(channel: str) -> str:
    return "a Telegram user id is a number" if channel == "telegram" else "a Slack member id looks like U012ABCDEF"


# ---- shared ----------------------------------------------------------------------------------
def _wanted(ask: Prompter, channel: str, what: str, configured: bool, flag: str, given: str | None) -> bool:
    """Whether to (re)check and set this channel: a flag says yes; else the question, whose
    default keeps a configured channel and leaves an unconfigured one out."""
    ask.say(f"\n{channel}")
    if given:
        return True
    question = f"  {channel} is set up: check it and change its settings?" if configured else f"  Connect {what}?"
    if ask.yes(question, configured):
        return True
    hint = "" if ask.interactive else f" ({flag} connects one)"
    ask.say("  left as it is" if configured else f"  not connected{hint}")
    return False


def _given(flag: str | None) -> str:
    return flag or ""


def _again(args: argparse.Namespace, ask: Prompter, what: str) -> None:
    if not ask.interactive:
        raise CheckFailed(f"{what} did not pass its check (above): nothing was written")
    ask.say(f"  Let's try {what} again (Ctrl-C leaves without writing anything).")


def _indented(check: Check) -> None:
    """A check as `gateway doctor` prints it, under its step."""
    print(f"  {MARKS[check.status]} {check.name}: {check.found}", flush=True)
    if check.fix:
        print(f"      -> {check.fix}", flush=True)

