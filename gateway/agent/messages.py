"""The turn's vocabulary: what the model declared, what a call gave back, how a turn ends.

Kept apart from the modules that do the work (turn.py, tool_calls.py, rounds.py, guards.py,
delegation.py) so each of them names these types without importing another's machinery.

The names of endings, each for one job:
- `EndTurn`: raised inside a turn to end it (control flow only; caught by `Turn.run`);
- `TurnOutcome`: what `Turn.run` returns to whoever ran it (the inbox, a parent turn);
- `gateway.store.FinalStage`: a run's final stage, written in the same write as the reply's delivery;
- `gateway.events.TurnEnded`: told to listeners outside the core (the scheduler) when a turn ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.agent.child import ChildContext
from gateway.agent.voices import Voice, others
from gateway.events import ThreadKey
from gateway.store import Fence, PromptRecord, RunRecord, SessionRecord, ToolCallRecord
from gateway.store.items import Verdict
from gateway.tools import MemoryScope, ToolSpec

# ---- the model's calls and their results ---------------------------------------------------


@dataclass(frozen=True)
class DeclaredCall:
    id: str
    name: str
    arguments: str  # raw text as streamed; checked later by gateway.agent.arguments


@dataclass(frozen=True)
class OpenCall:
    """A stored call being processed, with what is derived from it once: its arguments parsed
    (they were checked when the round was recorded) and its tool looked up."""

    record: ToolCallRecord
    args: dict[str, Any]
    spec: ToolSpec | None  # None: the tool is gone since the call was recorded (its MCP server is down)

    @property
    def name(self) -> str:
        return self.record.name


@dataclass(frozen=True)
class ToolResult:
    """One call's result as the loop guard compares it."""

    call_id: str
    name: str
    text: str
    status: Literal["ok", "failed", "placeholder"]


PlaceholderReason = Literal["canceled", "interrupted", "superseded"]
PLACEHOLDER_PREFIX = "[placeholder] "


def placeholder_text(reason: PlaceholderReason) -> str:
    """The result of a call that never ran to the end (the turn was stopped or broke)."""
    return f"{PLACEHOLDER_PREFIX}{reason}"


# ---- how a turn ends -------------------------------------------------------------------------

# The stage a turn ends in. SUSPENDED (a shutdown: continued after the restart) and LOST (the
# lease went to another worker) are never stored: the run stays RUNNING for whoever continues it.
Stage = Literal["SUCCESS", "FAILED", "CANCELED", "AWAITING_INPUT", "SUSPENDED", "LOST"]
EndReason = Literal[
    "reply",
    "max_rounds",
    "overflow",
    "refused",
    "cut_off",
    "repetition",
    "tool_loop",
    "canceled",
    "error",
    "budget",
    "awaiting_input",
    "shutdown",
]
END_MESSAGES: dict[str, str] = {
    "max_rounds": "⚠️ I stopped after {rounds} rounds without reaching an answer. Tell me how to continue.",
    "overflow": "⚠️ This conversation no longer fits in the model's context window. Use /compact or /new to continue.",
    "repetition": "⚠️ The model kept repeating itself, so I stopped this turn. Try rephrasing.",
    "tool_loop": "⚠️ The model kept making the same tool calls with the same results, so I stopped this turn.",
    "budget": "⚠️ This run reached its token budget and was stopped.",
}


class EndTurn(Exception):
    """Raised inside the loop to end the turn with a reason (and optional user-facing text)."""

    def __init__(
        self,
        stage: Stage,
        reason: EndReason,
        *,
        message: str = "",
        error: str = "",
        prompt_id: int | None = None,
    ):
        super().__init__(reason)
        self.stage: Stage = stage
        self.reason: EndReason = reason
        self.message, self.error, self.prompt_id = message, error, prompt_id


@dataclass(frozen=True)
class TurnOutcome:
    """How a turn ended, for whoever ran it."""

    run_id: int
    stage: Stage
    end_reason: EndReason
    reply: str = ""
    error: str = ""
    auto_denied: tuple[str, ...] = ()
    prompt_id: int | None = None


@dataclass(frozen=True)
class DecidedPrompt:
    """The decided prompt a resumed turn goes on with, read once by the worker: its verdict, and
    its row (closed by the turn; a tool's question keeps the tool's saved state in it). The call
    it decides uses them; any other open call reads its own prompt."""

    verdict: Verdict
    prompt: PromptRecord


@dataclass
class TurnRequest:
    session: SessionRecord
    thread: ThreadKey
    requested_by: str = ""  # who started the turn: their role, their grants, their approvals
    requester_name: str = ""  # their display name, for the deciders' copies of a prompt
    private: bool = False  # asked in a direct message (a prompt they cannot decide goes to the deciders' DMs)
    reply_to: str = ""  # platform id of the triggering message
    links: tuple[str, ...] = ()  # links of the triggering message (`events.links_in`): their previews may show
    parked_run: RunRecord | None = None  # continue this parked run (as whoever resumes it read it)
    decided: DecidedPrompt | None = None  # the prompt whose decision resumes it
    started_run: RunRecord | None = None  # a fresh turn's run, created with its first rows
    fence: Fence | None = None
    turn_started_seq: int = 1
    continuing: bool = False  # a dead worker's turn, continued from the database
    opens_with_calls: bool = False  # recorded with a call to make first (an MCP prompt command's mcp_prompt)
    continued_run: int | None = None  # the run it continues (its partial reply is adopted)
    child: ChildContext | None = None  # a sub-agent's turn (see delegation.py): shows nothing but its prompts
    # "<channel>:<user id>" the turn acts for when not its thread's person: a job made with the
    # `schedule` tool runs with its creator's role (never as the trusted `cron` channel)
    on_behalf_of: str = ""
    memory: MemoryScope | None = None  # whose memory the turn reads and writes (set when its run opens)
    # other people whose words the turn holds (kept chatter, quotes): their rights limit its tools
    voices: tuple[Voice, ...] = ()

    def hears(self, payloads: list[dict[str, Any]]) -> None:
        """Messages joining the turn (steered) bring the voices they hold."""
        found = [v.as_json() for v in self.voices] + [v for p in payloads for v in p.get("voices") or ()]
        self.voices = others(found, self.requested_by)

    def acting(self, channel: str) -> tuple[str, str]:
        """(channel, user id) whose role the turn's tools are checked against; `channel`: that
        of the chat the turn shows in (a sub-agent's: its root's)."""
        return acting_person(channel, self.requested_by, self.on_behalf_of)


def acting_person(channel: str, requested_by: str, on_behalf_of: str = "") -> tuple[str, str]:
    """(channel, user id) whose role a turn has: its creator's for a job made with `schedule`
    (`on_behalf_of`, "<channel>:<user id>"), else the person who asked, in `channel`."""
    if on_behalf_of:
        where, _, user = on_behalf_of.partition(":")
        return where, user
    return channel, requested_by


def shorten(text: str, limit: int = 120) -> str:
    """One line of at most `limit` characters, for chat lines and summaries."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
