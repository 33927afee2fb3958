"""`gateway setup`: from a fresh clone to a gateway that answers, in one command.

It asks for (or, with `--non-interactive`, takes from the flags) the model server, a Telegram
bot and/or a Slack app and their owners, checks each against the real server (the model server
as `gateway doctor` does: listed models, a one-token answer, a tool call round trip, the
context window; Telegram's getMe, Slack's auth.test and Socket Mode), then writes `config.yml`
and `.env` (0600) and says what to run next, with the one-time claim code of a channel nobody
owns yet (gateway/access/claim.py). Secrets go to `.env` only; `config.yml` reads them as `${VAR}`.

Run again, it edits: the current settings are the questions' defaults, only the keys it sets
change (comments, order and everything else a person wrote stay), and the changes are listed
before anything is written. Changing or removing a value that is there asks first on a
terminal and needs `--force` otherwise.

Exit status: 0 written (or nothing to change), 1 a check failed or an answer was missing
(nothing written), 2 the files could not be edited or the result would not load, 3 changes to
existing settings withheld (run again with --force).
"""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the steps load the LLM client: imported when setup runs, not for every command's parser
    from gateway.cli.setup_draft import Draft
    from gateway.cli.setup_prompts import Prompter
    from gateway.cli.setup_steps import Outcome

DEFAULT_CONFIG_PATH = "config.yml"  # as gateway/config/loading.py
EXIT_ABORTED, EXIT_UNWRITABLE, EXIT_WITHHELD = 1, 2, 3
DESCRIPTION = (
    "Set the gateway up: the model server, a Telegram bot and/or a Slack app, and their owners, each "
    "checked against the real server; writes config.yml and .env (0600). Run again to change a setting: "
    "it edits the files in place, shows what changes and asks (or needs --force) before changing a value."
)


def add_parser(sub: Any, *, parents: list[argparse.ArgumentParser], handler: Any) -> None:
    parser = sub.add_parser("setup", parents=parents, help="set up the model server, Telegram and Slack "
                            "(asks; or --non-interactive with flags)", description=DESCRIPTION)
    parser.add_argument("--non-interactive", action="store_true",
                        help="ask nothing: the flags and the current settings answer (for scripts)")
    parser.add_argument("--force", action="store_true", help="write changes to existing settings without asking")
    llm = parser.add_argument_group("model server")
    llm.add_argument("--llm-base-url", metavar="URL", help="the model server's address, e.g. https://api.openai.com/v1")
    llm.add_argument("--llm-api", choices=("chat", "responses", "anthropic"),
                     help="the API it speaks (default: found by asking the server)")
    llm.add_argument("--llm-api-key", metavar="KEY", help="its API key (default: LLM_API_KEY, .env)")
    llm.add_argument("--llm-model", metavar="NAME", help="the model (default: the one it serves, if only one)")
    llm.add_argument("--context-window", type=int, metavar="TOKENS", help="when the server does not say it")
    tg = parser.add_argument_group("Telegram")
    tg.add_argument("--telegram-token", metavar="TOKEN", help="the bot's token from @BotFather")
    tg.add_argument("--telegram-owner", metavar="ID", help="your numeric Telegram user id (empty: claim it)")
    tg.add_argument("--telegram-api-url", metavar="URL", help="a local Bot API server, e.g. http://host:8081/bot")
    sl = parser.add_argument_group("Slack")
    sl.add_argument("--slack-bot-token", metavar="TOKEN", help="the app's Bot User OAuth Token (xoxb-...)")
    mode = sl.add_mutually_exclusive_group()
    mode.add_argument("--slack-app-token", metavar="TOKEN", help="Socket Mode: the App-Level Token (xapp-...)")
    mode.add_argument("--slack-signing-secret", metavar="SECRET", help="HTTP events: the Signing Secret")
    sl.add_argument("--slack-owner", metavar="ID", help="your Slack member id, U... (empty: claim it)")
    sl.add_argument("--slack-api-url", metavar="URL", help=argparse.SUPPRESS)  # a test or proxy Web API
    parser.set_defaults(handler=handler, without_config=True)


async def run(args: argparse.Namespace) -> int:
    from gateway.cli.config_edit import EditError
    from gateway.cli.setup_draft import Draft
    from gateway.cli.setup_prompts import Prompter, SetupAborted
    from gateway.cli.setup_steps import Outcome, admins_with_owners, model_server, slack, telegram
    from gateway.config import ConfigError
    from gateway.serving.logs import configure as configure_logging

    configure_logging(args.log_level or "error")  # the checks say what matters; a library's warning would repeat it
    path = Path(args.config or os.environ.get("GATEWAY_CONFIG") or DEFAULT_CONFIG_PATH)
    ask = Prompter(interactive=not args.non_interactive)
    try:
        draft = Draft(path)
        if draft.problem:
            ask.say(f"(the current settings do not load, so their defaults are the built-in ones: {draft.problem})")
        ask.say(f"Setting up {path}{': it exists, its settings are the answers by default' if path.is_file() else ''}")
        outcome = Outcome()
        await model_server(args, draft, ask, outcome)
        await telegram(args, draft, ask, outcome)
        await slack(args, draft, ask, outcome)
        if (admins := admins_with_owners(draft, outcome.owners)) is not None:
            draft.set("approvals", "admins", admins)
        code = _finish(args, draft, ask)
        if code == 0:
            await _next_steps(draft, ask, outcome)
        return code
    except SetupAborted as exc:
        print(f"setup: {exc}", flush=True)
        return EXIT_ABORTED
    except (EditError, ConfigError) as exc:
        print(f"setup: {exc}", flush=True)
        return EXIT_UNWRITABLE


def _finish(args: argparse.Namespace, draft: Draft, ask: Prompter) -> int:
    config_text, env_text = draft.texts()
    for note in draft.notes:
        ask.say(f"! {note}")
    if not draft.changes:
        ask.say(f"\nNothing to change: {draft.path} and {draft.env_path.name} already say this.")
        return 0
    for file in dict.fromkeys(change.file for change in draft.changes):
        ask.say(f"\nChanges to {file}:")
        for change in draft.changes:
            if change.file == file:
                ask.say(change.describe())
    replacing = [c for c in draft.changes if c.replaces]
    if replacing and not args.force and not ask.interactive:
        ask.say(f"Nothing written: {len(replacing)} of these change settings that are there already; "
                "run again with --force to write them.")
        return EXIT_WITHHELD
    if ask.interactive and not args.force and not ask.yes("Write these changes?", True):
        ask.say("Nothing written.")
        return EXIT_ABORTED
    draft.write(config_text, env_text)
    ask.say(f"Wrote {draft.path} and {draft.env_path} (0600, the secrets).")
    return 0


async def _next_steps(draft: Draft, ask: Prompter, outcome: Outcome) -> None:
    flag = "" if str(draft.path) == DEFAULT_CONFIG_PATH else f" --config {shlex.quote(str(draft.path))}"
    claims = await _claim_lines(draft.path, outcome.bots.get("telegram", "")) if outcome.bots else []
    ask.say(f"\nThe agent answers with {outcome.model}.\nNext:")
    ask.say(f"  gateway serve{flag}     starts the gateway" + ("" if flag else " (in the project: make run)"))
    for channel, bot in outcome.bots.items():
        where = "in a private chat on Telegram" if channel == "telegram" else "in a direct message in Slack"
        ask.say(f"  then talk to {bot} {where}")
        if claims is None and channel not in outcome.owners and not draft.current.approvals.admins.get(channel):
            send = f"send /start <code> to {bot}" if channel == "telegram" else f"send the code to {bot}"
            ask.say(f"  nobody owns {channel} yet: the start log and `gateway status{flag}` show a one-time claim "
                    f"code; {send} {where} to become its admin")
    for line in claims or []:
        ask.say(f"  {line}")
    if not outcome.bots:
        ask.say(f"  gateway chat{flag}      talks to the agent in this terminal (no chat channel is set up)")
    ask.say(f"  gateway doctor{flag}    checks the settings again at any time")


async def _claim_lines(path: Path, telegram_bot: str) -> list[str] | None:
    """The claim line of each chat channel nobody owns yet, with its code, from the database the
    gateway will use (the start log shows the same code); None when that cannot be opened now.
    `telegram_bot` (@name): the Telegram line adds the link that claims in one tap."""
    import logging

    from gateway.access.claim import claim_lines
    from gateway.config import load_config
    from gateway.store import Store

    try:
        config = load_config(path)
        store = Store(config.database.url)
        try:
            await store.migrate(auto=config.database.auto_migrate)
            return await claim_lines(store, config, telegram_bot=telegram_bot.removeprefix("@"))
        finally:
            await store.close()
    except Exception as exc:  # whatever keeps the database shut now, the start says so and shows the code
        logging.getLogger(__name__).debug("no claim code shown: %s", exc)
        return None
