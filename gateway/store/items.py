"""What an inbox item says, typed: each kind's payload written and read in this one place.

Items are written by the inbox (messages, continuing a run), the prompt service (a decided
prompt's resume, a job run again), sub-agents (a background task's start, its report, a /stop
handed to its thread) and read by the inbox's worker. The module lives beside `NewItem` in the
store, the one layer every writer may import (gateway/inbox sits above agent/ and approvals/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.events import InboundMessage
from gateway.store.inbox import NewItem
from gateway.store.records import InboxItem, PromptKind, PromptRecord


@dataclass(frozen=True)
class SenderRef:
    id: str = ""
    name: str = ""
    username: str = ""

    def to_payload(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "username": self.username}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> SenderRef:
        sender = payload.get("sender") or {}
        if not isinstance(sender, dict):  # a button press records only the sender's id
            return cls(str(sender))
        return cls(str(sender.get("id", "")), str(sender.get("name") or ""), str(sender.get("username") or ""))


@dataclass(frozen=True)
class Said:
    """What a message, a command or a report says, and who said it (its other keys, such as
    attachments and album parts, belong to gateway/inbox/attached.py and gateway/attachments)."""

    text: str
    sender: SenderRef
    message_id: str  # the platform message a reply answers ("" for none)
    rerun_of: str | None  # a scheduled job run again by a button: the schedule's id
    private: bool  # a direct message (the access check treats it as a person's DM)

    @classmethod
    def of(cls, item: InboxItem) -> Said:
        payload = item.payload
        rerun_of = payload.get("rerun_of")
        return cls(
            str(payload.get("text", "")),
            SenderRef.from_payload(payload),
            str(payload.get("message_id") or ""),
            None if rerun_of is None else str(rerun_of),
            bool(payload.get("private")),
        )


@dataclass(frozen=True)
class Verdict:
    """How a prompt was decided, as its decision wrote it: what the parked call goes on with."""

    prompt_id: int
    kind: PromptKind
    tool_call_id: int | None
    status: str  # approved | rejected | answered | expired | canceled | superseded (pending: not yet)
    decision: str  # the Action code (a button, typed text, expiry, the cli)
    decided_by: str  # "" for the clock
    decided_by_name: str
    answer: str | None  # a question's answer, or a denial's reason

    @classmethod
    def of(cls, prompt: PromptRecord) -> Verdict:
        return cls(
            prompt.id, prompt.kind, prompt.tool_call_id, prompt.status, prompt.decision or "",
            prompt.decided_by or "", prompt.decided_by_name or "", prompt.answer,
        )

    def to_payload(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Verdict:
        return cls(
            int(payload["prompt_id"]), payload["kind"], payload.get("tool_call_id"), str(payload["status"]),
            str(payload.get("decision") or ""), str(payload.get("decided_by") or ""),
            str(payload.get("decided_by_name") or ""), payload.get("answer"),
        )


@dataclass(frozen=True)
class ResumePrompt:
    """A decided (or expired) prompt continues the turn parked on it. `verdict` is None for an
    item written before resume items carried it: the worker takes it from the prompt's row."""

    prompt_id: int
    verdict: Verdict | None = None

    def item(self, thread_key: str, *, handed_over: bool = False) -> NewItem:
        """`handed_over`: a background child's resume passed on to its task's own thread."""
        suffix = ":task" if handed_over else ""
        payload: dict[str, Any] = {"prompt_id": self.prompt_id}
        if self.verdict is not None:
            payload["verdict"] = self.verdict.to_payload()
        return NewItem(f"resume:{self.prompt_id}{suffix}", thread_key, "resume", payload)


def resume_item(decided: PromptRecord) -> NewItem:
    """The resume item a decision queues, carrying its verdict (built from the decided row, in
    the deciding transaction: a denial's reason may be a held message's text)."""
    return ResumePrompt(decided.id, Verdict.of(decided)).item(decided.thread_key)


@dataclass(frozen=True)
class ContinueRun:
    """A run a stopped worker left (a restart, a shutdown): continued in a new run."""

    run_id: int

    def item(self, thread_key: str) -> NewItem:
        return NewItem(f"continue:{self.run_id}", thread_key, "resume", {"continue_run": self.run_id})


@dataclass(frozen=True)
class StartTask:
    """A background child's first turn, on its task's own thread."""

    task_id: int
    item_id: int | None = None  # the inbox item it was read from

    def item(self, thread_key: str) -> NewItem:
        return NewItem(f"task:{self.task_id}", thread_key, "task", {"task_id": self.task_id})


def resumed(item: InboxItem) -> ResumePrompt | ContinueRun:
    """What a `resume` item continues."""
    if "continue_run" in item.payload:
        return ContinueRun(int(item.payload["continue_run"]))
    verdict = item.payload.get("verdict")
    return ResumePrompt(int(item.payload["prompt_id"]), Verdict.from_payload(verdict) if verdict else None)


def started_task(item: InboxItem) -> StartTask:
    return StartTask(int(item.payload["task_id"]), item.id)


def rerun_message(event_id: str, thread_key: str, text: str, sender: SenderRef, schedule_id: Any) -> NewItem:
    """A scheduled job's prompt run again, in the chat where its button was pressed."""
    payload = {"text": text, "sender": sender.to_payload(), "rerun_of": schedule_id}
    return NewItem(event_id, thread_key, "message", payload)


def command_item(event_id: str, thread_key: str, text: str) -> NewItem:
    """A command queued by the gateway itself (a /stop handed to a background task's thread)."""
    return NewItem(event_id, thread_key, "command", {"text": text})


def report_item(event_id: str, thread_key: str, text: str, sender: SenderRef, task_id: int) -> NewItem:
    """A background task's end, told to its parent's thread."""
    payload = {"text": text, "sender": sender.to_payload(), "task_id": task_id, "message_id": ""}
    return NewItem(event_id, thread_key, "report", payload)


def button_item(event_id: str, thread_key: str, token: str, sender_id: str) -> NewItem:
    """A button press, recorded done: only its event id matters (a redelivered tap is a duplicate)."""
    return NewItem(event_id, thread_key, "button", {"token": token, "sender": sender_id}, status="done")


def message_item(event: InboundMessage, kind: str, *, message_id: str = "", status: str = "pending") -> NewItem:
    """A person's message (`kind` "message", or "command" for a slash command; "edit" and
    "ambient" in gateway/store/conversation.py), as committed by `submit`; attachments are
    settled later (gateway/inbox/attached.py), context is put into words by
    gateway/inbox/surroundings.py."""
    payload: dict[str, Any] = {
        "text": event.text,
        "sender": SenderRef(event.sender.id, event.sender.name, event.sender.username).to_payload(),
        "attachments": [a.__dict__ for a in event.attachments],
        "message_id": message_id or event.message_id,
        "received_at": event.received_at.isoformat(),
        **({"group": event.group} if event.group else {}),
    }
    if event.private:
        payload["private"] = True  # a direct message: the access check treats it as a person's DM
    if event.album_part:
        payload["album_part"] = True  # taken only with an addressed part of its album
    if event.context:
        payload["context"] = [q.__dict__ for q in event.context]
    if event.surroundings is not None:
        payload["surroundings"] = str(event.surroundings)
    if event.stops_stream:
        payload["stops_stream"] = event.stops_stream
    return NewItem(event.event_id, str(event.thread), kind, payload, status)
