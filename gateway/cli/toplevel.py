"""What the command line does around every command: `--version`, a description for each
subcommand, and how it ends when something fails.

A failure the operator caused (a configuration error, a database that cannot be opened, a port
in use, a token refused...) is one line on stderr per problem, naming the setting (and its
environment variable) and what to do, and ends the process with its kind's exit code
(docs/operations.md, "Exit codes"). `--debug` (or `--log-level debug`, or `logging.level: debug`)
prints the traceback above the line. A reader that went away (`gateway audit | head`) ends the
command quietly, as it ends other Unix tools."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Iterator
from typing import Any

# One code per kind of failure: scripts and service managers can tell them apart.
EXIT_CODES: dict[str, int] = {
    "config": 3,  # the configuration file or a variable it reads
    "database_url": 4,  # database.url is not a URL, an engine or a driver the gateway uses
    "database_unreachable": 5,  # the database server (or the SQLite file's directory) cannot be reached
    "database_missing": 6,  # the server has no database of that name
    "database_login": 7,  # the server refused the user or password
    "database_schema": 8,  # the schema is behind (auto_migrate: false) or newer than this gateway
    "http_bind": 9,  # http.host / http.port cannot be listened on
    "token_rejected": 10,  # Telegram or Slack refused a token
    "platform_unreachable": 11,  # the Bot API or Slack cannot be reached
    "channel_settings": 12,  # a channel's settings are incomplete or refused (webhook mode...)
    "path": 13,  # agent.workspace cannot be created
    "backup": 14,  # a backup cannot be taken, or restored (unsound, too new, an instance serving)
    "migration": 15,  # a migration failed (the database is left as it was)
}
USAGE = 2  # argparse's own: the command line itself is wrong
INTERRUPTED = 130  # Ctrl-C
BROKEN_PIPE = 141  # what a shell reports for a program its reader left (128 + SIGPIPE)


def report(exc: BaseException, kind: str, *, debug: bool) -> int:
    """Print the failure (its traceback first when debugging) and return its exit code."""
    sys.stdout.flush()
    if debug:
        traceback.print_exception(exc)
    lines = str(exc).splitlines() or [type(exc).__name__]
    print("\n".join(f"gateway: {line}" for line in lines), file=sys.stderr, flush=True)
    return EXIT_CODES[kind]


def reader_gone() -> int:
    """stdout's reader left: what is still buffered can reach no one, and the interpreter's own
    last flush must not fail with a second BrokenPipeError at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return BROKEN_PIPE


def installed_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("chat-gateway")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


class VersionAction(argparse.Action):
    """`--version`: read from the installed package only when asked (every start pays for nothing)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"gateway {installed_version()}")
        parser.exit()


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser, str | None]]:
    """(full name, parser, its help text) of every subcommand, nested ones too."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            helps = {choice.dest: choice.help for choice in action._choices_actions}  # noqa: SLF001
            for name, child in action.choices.items():
                yield child.prog.removeprefix("gateway "), child, helps.get(name)
                yield from subcommands(child)


def describe_subcommands(parser: argparse.ArgumentParser) -> None:
    """Each subcommand's `--help` opens with a description: its own, else the line that lists
    it under its parent (so a command added with only `help=` is described too)."""
    for _, child, text in subcommands(parser):
        if child.description is None and text:
            child.description = text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")
