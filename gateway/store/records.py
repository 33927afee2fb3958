"""What the store hands out: plain frozen dataclasses, never ORM rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

SessionKind = Literal["interactive", "cron", "tick"]
ToolStatus = Literal["running", "pending", "done", "failed", "cancelled", "rejected"]
RunStage = Literal["RUNNING", "AWAITING_INPUT", "SUCCESS", "FAILED", "CANCELED"]
# An approval of a tool call, a question (ask_user, a tool's own), a scheduled job's "run again" button.
PromptKind = Literal["approval", "question", "rerun"]


class Action(StrEnum):
    """How a prompt was decided: the action code of its button (`<token>.<code>`, at most 64
    bytes in all, so one letter), recorded as the prompt's `decision`. A question's choice N is
    `q<N>` (`choice_action`)."""

    APPROVE = "a"
    DENY = "d"
    ALLOW_15M = "t"  # approve, and allow the tool in this chat for approvals.BYPASS_MINUTES
    ALLOW_THREAD = "c"  # approve, and allow the tool in this chat from now on
    RERUN = "r"  # a scheduled job run again where the button was pressed
    TEXT = "text"  # a question answered by a typed message (no button)
    EXPIRED = "expired"  # nobody decided in time (no button)


def choice_action(index: int) -> str:
    return f"q{index}"


def chosen(action: str) -> int | None:
    """The choice index of a `q<N>` action, None for any other."""
    return int(action[1:]) if action.startswith("q") and action[1:].isdigit() else None


@dataclass(frozen=True)
class SessionRecord:
    id: int
    thread_key: str
    kind: SessionKind
    interactive: bool
    ephemeral: bool
    source: str
    started_by: str
    schedule_id: int | None
    max_rounds: int | None
    max_tokens: int | None
    next_seq: int
    notes: dict[str, str]
    created_at: datetime
    closed_at: datetime | None
    private: bool = False  # opened in a direct message
    model: str | None = None  # a name of llm.models; None: the default
    # `/model` per person in a shared chat (gateway/access/models.py): {user id: name, or "default"}
    person_models: dict[str, str] | None = None


@dataclass(frozen=True)
class ToolCallRecord:
    id: int
    message_id: int
    session_id: int
    call_id: str
    ordinal: int
    name: str
    arguments: str
    result: str | None
    status: ToolStatus
    note: str | None
    run_id: int | None


@dataclass(frozen=True)
class MessageRecord:
    id: int
    session_id: int
    seq: int
    role: str
    content: str
    status: str
    synthetic: bool
    reasoning: str | None
    usage: dict[str, Any] | None
    sender_id: str | None
    sender_name: str | None
    run_id: int | None
    created_at: datetime
    tool_calls: tuple[ToolCallRecord, ...] = ()
    voices: list[dict[str, str]] | None = None  # other people's words the row holds (gateway/agent/voices.py)


@dataclass(frozen=True)
class NewToolCall:
    call_id: str
    name: str
    arguments: str
    status: ToolStatus = "running"
    result: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class RunRecord:
    id: int
    session_id: int
    thread_key: str
    stage: RunStage
    end_reason: str | None
    error: str | None
    model: str | None
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int
    llm_calls: int
    tool_calls: int
    cost_nano_usd: int | None
    unpriced: bool
    rounds: int
    started_at: datetime
    finished_at: datetime | None
    usage_estimated: bool = False  # some token counts (and so the cost) were estimated locally
    cache_write_tokens: int = 0
    trace_id: str | None = None  # its OpenTelemetry trace (None: a run from before they were kept)
    trace_span_id: str | None = None  # the trace's turn span


@dataclass(frozen=True)
class RunEventRecord:
    id: int
    run_id: int
    seq: int
    kind: str
    at: datetime
    parent_seq: int | None
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InboxItem:
    id: int
    event_id: str
    thread_key: str
    kind: str  # message | button | resume | command
    payload: dict[str, Any]
    status: str
    session_id: int | None
    created_at: datetime


@dataclass(frozen=True)
class Lease:
    name: str
    owner: str
    fence: int
    expires_at: datetime
    taken_over: bool = False  # taken from a holder that let it expire (a dead or paused instance)
    # Not released by whoever held it last: taken over, or still held under this owner's name
    # by an earlier process of the same instance id (killed and started again).
    unreleased: bool = False


@dataclass(frozen=True)
class PromptRecord:
    id: int
    token: str
    kind: PromptKind
    session_id: int
    thread_key: str
    run_id: int | None
    tool_call_id: int | None
    status: str
    payload: dict[str, Any]
    requested_by: str
    decided_by: str | None
    decided_by_name: str | None
    decision: str | None
    answer: str | None
    message_ids: list[str]
    created_at: datetime
    expires_at: datetime | None
    decided_at: datetime | None


@dataclass(frozen=True)
class BypassRecord:
    id: int
    thread_key: str
    tool: str
    expires_at: datetime | None
    granted_by: str
    person: str | None = None  # whose later requests it covers (None: a row from before, the granter's)

    @property
    def covers_person(self) -> str:
        return self.person if self.person is not None else self.granted_by


@dataclass(frozen=True)
class FinalStage:
    """A run's final stage, written together with the delivery that ends it."""

    run_id: int
    stage: str
    end_reason: str


@dataclass(frozen=True)
class OutboxRecord:
    id: int
    key: str
    thread_key: str
    kind: str
    payload: dict[str, Any]
    status: str
    message_ids: list[str]
    attempts: int
    error: str | None
    created_at: datetime | None = None
    retry_at: datetime | None = None
    uncertain: str | None = None
    sender_lease: str | None = None
    sender_fence: int | None = None
