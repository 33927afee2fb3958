"""Chat commands, handled before the model and never sent to it."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.traces import format_nano_usd

COMMANDS = {
    "stop": "cancel the running turn and drop queued messages",
    "new": "start a new session in this chat",
    "status": "what the agent is doing, queued messages, pending requests, tokens and cost",
    "cost": "tokens and cost of this session",
    "compact": "summarise older history now to free context",
    "help": "this list",
}
# Answered at once even while a turn runs (they don't touch the conversation).
IMMEDIATE = frozenset({"status", "cost", "help"})
# Cancel the running turn first.
INTERRUPTING = frozenset({"stop", "new"})


@dataclass(frozen=True)
class Command:
    name: str  # without the slash or @bot suffix; "" for an unknown command
    word: str  # as typed
    args: str


def parse_command(text: str) -> Command | None:
    """`/cmd`, `/cmd@botname args`; None when the text is not a command."""
    stripped = text.strip()
    if not stripped.startswith("/") or len(stripped) < 2 or stripped[1].isspace():
        return None
    word, _, args = stripped.partition(" ")
    name = word[1:].split("@", 1)[0].lower()
    if "/" in name:  # a path such as /usr/bin is not a command
        return None
    return Command(name if name in COMMANDS else "", word, args.strip())


def help_text(unknown: str = "") -> str:
    lines = [f"Unknown command {unknown}." if unknown else "Commands:"]
    if unknown:
        lines.append("Commands:")
    lines += [f"/{name} — {what}" for name, what in COMMANDS.items()]
    return "\n".join(lines)


def status_text(*, running: bool, queued: int, prompts: int, totals: dict) -> str:
    state = "🟢 working on a turn" if running else "⚪ idle"
    return "\n".join(
        [
            f"Status: {state}",
            f"Queued messages: {queued}",
            f"Pending requests: {prompts}",
            cost_text(totals),
        ]
    )


def cost_text(totals: dict) -> str:
    return (
        f"Session: {totals.get('input_tokens', 0):,} input tokens ({totals.get('cached_tokens', 0):,} cached), "
        f"{totals.get('output_tokens', 0):,} output tokens, cost {format_nano_usd(totals.get('cost_nano_usd'))}"
    )
