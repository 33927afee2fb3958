"""The `delegate` tool as the model sees it, and the texts of sub-agents: the chat lines, the
results their parents read, the reports of background tasks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.agent.child import DELEGATE
from gateway.agent.messages import TurnOutcome, placeholder_text, shorten
from gateway.store import LeaseLost, NewItem, TaskRecord, items
from gateway.tools import ToolError, ToolSpec

if TYPE_CHECKING:
    from gateway.agent.turn import Turn

MAX_TASKS = 8
START_PREVIEW_CHARS = 300
DONE_PREVIEW_CHARS = 200
BACKGROUND_STARTED = (
    "Started in the background: {tasks}. Each one's result will come back to this conversation as a "
    "message when it ends; do not wait for it or call delegate again for it."
)
ROOT_NAME = "agent"

DELEGATE_DESCRIPTION = (
    "Hand tasks to sub-agents. Each task runs as a separate agent with its own conversation, "
    "starting from `prompt` alone (include everything it needs to know), using `tools` (a subset "
    "of yours; default: all of yours except delegate). Several tasks run at the same time. By "
    "default you wait and get each sub-agent's final answer as the result; with background: true "
    "the call returns at once and each result comes back later as a message."
)


def delegate_spec() -> ToolSpec:
    async def never_run(ctx, args):  # noqa: ANN001, ANN202
        raise ToolError("delegate runs sub-agents through the turn, not directly")

    return ToolSpec(
        name=DELEGATE,
        description=DELEGATE_DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {
                "tasks": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_TASKS,
                    "items": {
                        "type": "object",
                        "properties": {
                            "prompt": {
                                "type": "string",
                                "description": "The task, with all the context the sub-agent needs.",
                            },
                            "tools": {
                                "type": "array",
                                "items": {"type": "string"},
                                "description": "Tool names it may use.",
                            },
                            "name": {"type": "string", "description": "A short name shown in the chat, e.g. research."},
                        },
                        "required": ["prompt"],
                        "additionalProperties": False,
                    },
                },
                "background": {
                    "type": "boolean",
                    "default": False,
                    "description": "Return at once; results come back as messages.",
                },
            },
            "required": ["tasks"],
            "additionalProperties": False,
        },
        func=never_run,
    )


@dataclass
class ChildOutcome:
    """How one child's turn (or what the database already held) ended."""

    status: str  # done | failed | canceled | parked | suspended
    text: str = ""
    prompt_id: int | None = None
    auto_denied: tuple[str, ...] = ()


def outcome_of(result: TurnOutcome) -> ChildOutcome:
    """How a child's turn ended, as its parent sees it."""
    if result.stage == "SUCCESS":
        return ChildOutcome("done", result.reply, auto_denied=result.auto_denied)
    if result.stage == "AWAITING_INPUT":
        return ChildOutcome("parked", prompt_id=result.prompt_id, auto_denied=result.auto_denied)
    if result.stage == "SUSPENDED":
        return ChildOutcome("suspended")
    if result.stage == "LOST":
        raise LeaseLost(result.error or "lease lost")
    if result.stage == "CANCELED":
        return ChildOutcome("canceled", placeholder_text("canceled"), auto_denied=result.auto_denied)
    why = result.error or result.end_reason
    return ChildOutcome("failed", f"The sub-agent stopped without an answer ({why}).", auto_denied=result.auto_denied)


def task_name(value: Any, index: int) -> str:
    text = "".join(ch for ch in str(value or "").strip() if ch.isalnum() or ch in "-_ ")[:40].strip()
    return text or f"task {index + 1}"


def child_max_tokens(turn: Turn) -> int | None:
    return turn.session.max_tokens  # the run's budget check counts what the children used


def parent_name(turn: Turn) -> str:
    return turn.child.name if turn.child else ROOT_NAME


def start_line(turn: Turn, task: TaskRecord) -> str:
    where = " (background)" if task.background else ""
    return f"🤖 {parent_name(turn)} → {task.name}{where}\n> {shorten(task.prompt, START_PREVIEW_CHARS)}"


def status_icon(status: str) -> str:
    return {"done": "✅", "canceled": "⏹"}.get(status, "⚠️")


def done_line(turn: Turn, task: TaskRecord, outcome: ChildOutcome) -> str:
    preview = shorten(outcome.text, DONE_PREVIEW_CHARS)
    return f"{status_icon(outcome.status)} {task.name} finished → {parent_name(turn)}: {preview}"


def call_result(tasks: list[TaskRecord]) -> tuple[str, str]:
    """One delegate call's result: the single child's answer, or each child's in task order."""
    if len(tasks) == 1:
        task = tasks[0]
        return ("done" if task.status == "done" else "failed"), task.result or "(no answer)"
    parts = [f"[{i + 1}] {t.name} ({t.status}):\n{t.result or '(no answer)'}" for i, t in enumerate(tasks)]
    status = "done" if any(t.status == "done" for t in tasks) else "failed"
    return status, "\n\n".join(parts)


def report_item(task: TaskRecord, outcome: ChildOutcome) -> NewItem:
    verb = {"done": "finished", "canceled": "was stopped"}.get(outcome.status, "failed")
    text = f"[Background task #{task.id} ({task.name}) {verb}]\n{outcome.text or '(no answer)'}"
    sender = items.SenderRef("delegate", task.name)
    return items.report_item(f"task-report:{task.id}", task.thread_key, text, sender, task.id)
