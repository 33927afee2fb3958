"""Databases as released schema revisions left them, for testing upgrades on data.

Each fixture (tests/fixtures/migrations/NNNN.sql) is the rows of a gateway that ran at schema
revision NNNN: conversations, a run parked on an approval nobody has tapped yet, outbox rows in
each state, a job with its history, memory, grants... in INSERT statements that SQLite and
PostgreSQL both read. The schema is not in the file: loading one migrates an empty database to
NNNN with the migrations themselves, then runs the INSERTs (see `load`).

Rebuild them after changing ROWS (or to add a revision to REVISIONS):

    .venv/bin/python tests/migration_fixtures.py

The SQL for a revision holds only the columns that revision's tables have, read from a database
migrated to it, so an old fixture does not change when a later migration adds a column.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from gateway.store import Store
from gateway.store.db import MIGRATIONS_DIR

# The head of each landed release worth keeping an upgrade path from: 0001 the first schema
# (every core table: sessions, runs, prompts, outbox, schedules), 0008 the outbox with retries
# and ambiguous sends, 0015 the first with memory and grants, 0022 the last release (claim codes).
REVISIONS = ("0001", "0008", "0015", "0022")
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "migrations"
# Tables a database has that hold no rows of ours: alembic's, and SQLite's full-text index
# (kept by triggers on compactions) and its own bookkeeping.
NOT_OURS = ("alembic_version", "sqlite_sequence")
NOT_OURS_PREFIX = "compactions_fts"

# The gateway's clock when the fixture's database was last written (UTC).
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ASKED = "Write 'hi' to note.txt; it's for the 'backup' job."  # the turn parked on its approval
PARKED_TOKEN = "parkedapprovaltoken0000000000001"  # the approval waiting for a tap
OWNER = "telegram:42"  # whose memory the fixture holds
TG_THREAD = "telegram:100:"
SLACK_THREAD = "slack:C1:1700000000.000100"
JOB_THREAD = "cron:nightly-digest:"


ADA = {"id": "42", "name": "Ada", "username": "ada"}
GRACE = {"id": "U042", "name": "Grace", "username": "grace"}


def message(text: str, sender: dict[str, str], message_id: str, received_at: datetime) -> dict[str, Any]:
    """An inbox item's payload as the intake writes it (gateway/store/items.py message_item)."""
    return {"text": text, "sender": sender, "attachments": [], "message_id": message_id,
            "received_at": received_at.isoformat()}


def at(hours: float) -> datetime:
    """T0 moved by `hours` (negative: before)."""
    return T0 + timedelta(hours=hours)


# Every table's rows, with the columns of today's schema; a revision keeps those its tables have.
# In the order their foreign keys need.
ROWS: dict[str, list[dict[str, Any]]] = {
    "threads": [
        {"key": TG_THREAD, "channel": "telegram", "session_id": 1, "created_at": at(-48)},
        {"key": SLACK_THREAD, "channel": "slack", "session_id": 2, "created_at": at(-30)},
        {"key": JOB_THREAD, "channel": "cron", "session_id": 3, "created_at": at(-3)},
    ],
    "sessions": [
        {
            "id": 1, "thread_key": TG_THREAD, "kind": "interactive", "interactive": True, "ephemeral": False,
            "source": "telegram", "started_by": "42", "schedule_id": None, "max_rounds": None, "max_tokens": None,
            "model": None, "next_seq": 3, "notes": {"todo": ["look at /tmp"]}, "created_at": at(-48),
            "closed_at": None, "private": True, "person_models": {"42": "fast"},
        },
        {
            "id": 2, "thread_key": SLACK_THREAD, "kind": "interactive", "interactive": True, "ephemeral": False,
            "source": "slack", "started_by": "U042", "schedule_id": None, "max_rounds": 8, "max_tokens": 20000,
            "model": "smart", "next_seq": 5, "notes": {}, "created_at": at(-30), "closed_at": None,
            "private": False, "person_models": None,
        },
        {
            "id": 3, "thread_key": JOB_THREAD, "kind": "cron", "interactive": False, "ephemeral": True,
            "source": "cron", "started_by": "nightly-digest", "schedule_id": 1, "max_rounds": 4, "max_tokens": None,
            "model": None, "next_seq": 3, "notes": {}, "created_at": at(-3), "closed_at": at(-2.9),
            "private": False, "person_models": None,
        },
    ],
    "messages": [
        {
            "id": 1, "session_id": 1, "seq": 1, "role": "user", "content": ASKED,
            "status": "ok", "synthetic": False, "reasoning": None, "usage": None, "sender_id": "42",
            "sender_name": "Ada", "run_id": 1, "created_at": at(-1), "images": None, "voices": None, "replay": None,
        },
        {
            "id": 2, "session_id": 1, "seq": 2, "role": "assistant", "content": "", "status": "ok",
            "synthetic": False, "reasoning": "I need to list the directory.",
            "usage": {"input_tokens": 812, "output_tokens": 24}, "sender_id": None, "sender_name": None,
            "run_id": 1, "created_at": at(-0.99), "images": None, "voices": None, "replay": None,
        },
        {
            "id": 3, "session_id": 2, "seq": 1, "role": "user", "content": "Summarise the incident channel",
            "status": "ok", "synthetic": False, "reasoning": None, "usage": None, "sender_id": "U042",
            "sender_name": "Grace", "run_id": 2, "created_at": at(-30),
            "images": [{"path": "attachments/2/1.png", "mime": "image/png"}], "voices": None, "replay": None,
        },
        {
            "id": 4, "session_id": 2, "seq": 2, "role": "assistant", "content": "Two alerts, both resolved.",
            "status": "ok", "synthetic": False, "reasoning": None,
            "usage": {"input_tokens": 1500, "output_tokens": 40}, "sender_id": None, "sender_name": None,
            "run_id": 2, "created_at": at(-29.9), "images": None, "voices": None, "replay": None,
        },
        {
            "id": 5, "session_id": 2, "seq": 3, "role": "user", "content": "Thanks — and the one before?",
            "status": "ok", "synthetic": False, "reasoning": None, "usage": None, "sender_id": "U042",
            "sender_name": "Grace", "run_id": None, "created_at": at(-29), "images": None, "voices": None,
            "replay": None,
        },
        {
            "id": 6, "session_id": 2, "seq": 4, "role": "assistant", "content": "", "status": "failed",
            "synthetic": True, "reasoning": None, "usage": None, "sender_id": None, "sender_name": None,
            "run_id": None, "created_at": at(-29), "images": None, "voices": None, "replay": None,
        },
        {
            "id": 7, "session_id": 3, "seq": 1, "role": "user", "content": "Summarise the news", "status": "ok",
            "synthetic": False, "reasoning": None, "usage": None, "sender_id": None, "sender_name": None,
            "run_id": 3, "created_at": at(-3), "images": None, "voices": None, "replay": None,
        },
        {
            "id": 8, "session_id": 3, "seq": 2, "role": "assistant", "content": "Nothing new today.", "status": "ok",
            "synthetic": False, "reasoning": None, "usage": {"input_tokens": 300, "output_tokens": 6},
            "sender_id": None, "sender_name": None, "run_id": 3, "created_at": at(-2.95), "images": None,
            "voices": None, "replay": None,
        },
    ],
    "tool_calls": [
        {
            "id": 1, "message_id": 2, "session_id": 1, "call_id": "call_parked", "ordinal": 0,
            "name": "write_file", "arguments": '{"content": "hi", "path": "note.txt"}', "result": None,
            "status": "pending", "note": None, "run_id": 1,
            "started_at": None, "finished_at": None,
        },
    ],
    "runs": [
        {
            "id": 1, "session_id": 1, "thread_key": TG_THREAD, "stage": "AWAITING_INPUT", "end_reason": None,
            "error": None, "model": "gpt-4o-mini", "next_event_seq": 3, "input_tokens": 812, "cached_tokens": 0,
            "cache_write_tokens": 0, "output_tokens": 24, "reasoning_tokens": 0, "llm_calls": 1, "tool_calls": 1,
            "cost_nano_usd": 150000, "unpriced": False, "usage_estimated": False, "rounds": 1,
            "started_at": at(-1), "finished_at": None, "trace_id": None, "trace_span_id": None,
        },
        {
            "id": 2, "session_id": 2, "thread_key": SLACK_THREAD, "stage": "SUCCESS", "end_reason": "reply",
            "error": None, "model": "gpt-4o", "next_event_seq": 3, "input_tokens": 1500, "cached_tokens": 1024,
            "cache_write_tokens": 0, "output_tokens": 40, "reasoning_tokens": 0, "llm_calls": 1, "tool_calls": 0,
            "cost_nano_usd": 4200000, "unpriced": False, "usage_estimated": False, "rounds": 1,
            "started_at": at(-30), "finished_at": at(-29.9), "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
            "trace_span_id": "00f067aa0ba902b7",
        },
        {
            "id": 3, "session_id": 3, "thread_key": JOB_THREAD, "stage": "SUCCESS", "end_reason": "reply",
            "error": None, "model": "gpt-4o-mini", "next_event_seq": 2, "input_tokens": 300, "cached_tokens": 0,
            "cache_write_tokens": 0, "output_tokens": 6, "reasoning_tokens": 0, "llm_calls": 1, "tool_calls": 0,
            "cost_nano_usd": None, "unpriced": True, "usage_estimated": True, "rounds": 1,
            "started_at": at(-3), "finished_at": at(-2.95), "trace_id": None, "trace_span_id": None,
        },
    ],
    "run_events": [
        {"id": 1, "run_id": 1, "seq": 1, "kind": "LLM_RESPONSE", "at": at(-0.99), "parent_seq": None,
         "payload": {"tool_calls": 1}},
        {"id": 2, "run_id": 1, "seq": 2, "kind": "TOOL_CALL", "at": at(-0.99), "parent_seq": 1,
         "payload": {"name": "write_file", "approval": "requested"}},
        {"id": 3, "run_id": 2, "seq": 1, "kind": "LLM_RESPONSE", "at": at(-29.9), "parent_seq": None,
         "payload": {"tool_calls": 0}},
        {"id": 4, "run_id": 2, "seq": 2, "kind": "FINISHED", "at": at(-29.9), "parent_seq": None,
         "payload": {"stage": "SUCCESS"}},
        {"id": 5, "run_id": 3, "seq": 1, "kind": "LLM_RESPONSE", "at": at(-2.95), "parent_seq": None,
         "payload": {"tool_calls": 0}},
    ],
    "inbox": [
        {"id": 1, "event_id": "telegram:update:900001", "thread_key": TG_THREAD, "kind": "message",
         "payload": message(ASKED, ADA, "9001", at(-1)), "status": "done",
         "session_id": 1, "created_at": at(-1), "done_at": at(-1)},
        # typed while the approval waits: held until it is decided
        {"id": 2, "event_id": "telegram:update:900002", "thread_key": TG_THREAD, "kind": "message",
         "payload": message("and tell me when done", ADA, "9002", at(-0.5)), "status": "held", "session_id": None,
         "created_at": at(-0.5), "done_at": None},
        {"id": 3, "event_id": "slack:Ev01", "thread_key": SLACK_THREAD, "kind": "message",
         "payload": message("Summarise the incident channel", GRACE, "1700000000.000100", at(-30)), "status": "done",
         "session_id": 2, "created_at": at(-30), "done_at": at(-29.9)},
        {"id": 4, "event_id": "slack:Ev02", "thread_key": SLACK_THREAD, "kind": "command",
         "payload": message("/stop", GRACE, "1700000001.000500", at(-29)), "status": "dropped", "session_id": 2,
         "created_at": at(-29), "done_at": at(-29)},
    ],
    "leases": [
        {"name": "leader", "owner": "host-a:4242", "fence": 17, "expires_at": at(-0.01)},
        {"name": f"thread:{SLACK_THREAD}", "owner": None, "fence": 3, "expires_at": None},
    ],
    "cursors": [{"name": "telegram:updates", "value": "900002", "updated_at": at(-0.5)}],
    "chat_holds": [{"chat": "telegram:100", "until": at(-0.2)}],
    "counters": [{"name": "messages_in", "value": 4, "updated_at": at(-0.5)}],
    "prompts": [
        {
            "id": 1, "token": PARKED_TOKEN, "kind": "approval", "session_id": 1, "thread_key": TG_THREAD,
            "run_id": 1, "tool_call_id": 1, "status": "pending",
            "payload": {"tool": "write_file", "arguments": '{\n  "content": "hi",\n  "path": "note.txt"\n}',
                        "reason": "writes a file", "grant": "write_file", "agent": "", "requester_name": "Ada",
                        "private": True},
            "requested_by": "42", "decided_by": None, "decided_by_name": None, "decision": None, "answer": None,
            "message_ids": ["501"], "created_at": at(-0.99), "expires_at": at(23), "decided_at": None,
        },
        {
            "id": 2, "token": "answeredquestiontoken00000000002", "kind": "question", "session_id": 2,
            "thread_key": SLACK_THREAD, "run_id": 2, "tool_call_id": None, "status": "answered",
            "payload": {"question": "Which incident?", "choices": ["Today's", "Yesterday's"]},
            "requested_by": "U042", "decided_by": "U042", "decided_by_name": "Grace", "decision": "choice:0",
            "answer": "Today's", "message_ids": ["1700000001.000200"], "created_at": at(-29.95),
            "expires_at": at(-28), "decided_at": at(-29.94),
        },
    ],
    "bypasses": [
        {"id": 1, "thread_key": SLACK_THREAD, "tool": "http_fetch", "expires_at": None, "granted_by": "U042",
         "person": "U042", "prompt_id": None, "created_at": at(-30)},
    ],
    "outbox": [
        {"id": 1, "key": "reply:2:2", "thread_key": SLACK_THREAD, "kind": "message",
         "payload": {"text": "Two alerts, both resolved."}, "status": "sent", "message_ids": ["1700000001.000300"],
         "attempts": 1, "error": None, "created_at": at(-29.9), "sent_at": at(-29.9), "retry_at": None,
         "uncertain": None},
        {"id": 2, "key": "prompt:1", "thread_key": TG_THREAD, "kind": "prompt",
         "payload": {"text": "Approval required: write_file note.txt"}, "status": "sent", "message_ids": ["501"],
         "attempts": 1, "error": None, "created_at": at(-0.99), "sent_at": at(-0.99), "retry_at": None,
         "uncertain": None},
        # the platform said wait: still to send
        {"id": 3, "key": "reply:3:2", "thread_key": TG_THREAD, "kind": "message",
         "payload": {"text": "Nothing new today."}, "status": "pending", "message_ids": [],
         "attempts": 2, "error": "Flood control exceeded. Retry in 40 seconds", "created_at": at(-2.95),
         "sent_at": None, "retry_at": at(-2.9), "uncertain": None},
        # given up: never sent again
        {"id": 4, "key": "reply:2:4", "thread_key": SLACK_THREAD, "kind": "message",
         "payload": {"text": "Sorry, that failed."}, "status": "failed", "message_ids": [], "attempts": 5,
         "error": "channel_not_found", "created_at": at(-29), "sent_at": None, "retry_at": None,
         "uncertain": None},
        # timed out after the platform took it: recorded, resent at most once
        {"id": 5, "key": "reply:2:3", "thread_key": SLACK_THREAD, "kind": "message",
         "payload": {"text": "The one before was a disk alert."}, "status": "sent",
         "message_ids": ["1700000001.000400"], "attempts": 2, "error": None, "created_at": at(-29.5),
         "sent_at": at(-29.4), "retry_at": None, "uncertain": "timed out after sending; resent once"},
        {"id": 6, "key": "stream:2:2", "thread_key": SLACK_THREAD, "kind": "stream",
         "payload": {"text": "Two alerts"}, "status": "sent", "message_ids": ["1700000001.000300"], "attempts": 1,
         "error": None, "created_at": at(-29.9), "sent_at": at(-29.9), "retry_at": None, "uncertain": None},
    ],
    "compactions": [
        {"id": 1, "session_id": 2, "first_seq": 1, "last_seq": 2, "summary": "Grace asked about two disk alerts.",
         "folded_text": "Summarise the incident channel\nTwo alerts, both resolved.", "tokens_before": 1540,
         "tokens_after": 12, "created_at": at(-29)},
    ],
    "schedules": [
        {
            "id": 1, "name": "nightly-digest", "kind": "cron", "spec": "0 9 * * *", "timezone": "UTC",
            "prompt": "Summarise the news", "deliver_to": TG_THREAD, "max_rounds": 4, "max_tokens": None,
            "model": None, "timeout_s": 600, "misfire": "run_once", "misfire_grace_s": None,
            "notify_on_failure": True, "enabled": True, "disabled_reason": None, "active_hours": None,
            "quiet_sentinel": "NOTHING", "source": "cli", "created_by": "cli", "created_at": at(-24 * 5),
            "updated_at": at(-24 * 5), "memory_owner": OWNER, "check_spec": None, "checklist": None,
            "idle_max_every": None, "check_failures_before_report": None,
        },
        {
            "id": 2, "name": "one-off-reminder", "kind": "at", "spec": "2026-11-28T10:00:00+00:00",
            "timezone": "UTC", "prompt": "Remind me to renew the certificate", "deliver_to": TG_THREAD,
            "max_rounds": None, "max_tokens": None, "model": None, "timeout_s": None, "misfire": "skip",
            "misfire_grace_s": 300, "notify_on_failure": False, "enabled": False,
            "disabled_reason": "one-shot done", "active_hours": None, "quiet_sentinel": None, "source": "agent",
            "created_by": "telegram:42", "created_at": at(-24 * 6), "updated_at": at(-24 * 3.5),
            "memory_owner": None, "check_spec": None, "checklist": None, "idle_max_every": None,
            "check_failures_before_report": None,
        },
    ],
    "schedule_states": [
        {"schedule_id": 1, "output_hash": None, "etag": None, "last_modified": None, "failures": 0,
         "failure_reported": False, "checklist_hash": None, "backoff_s": None, "last_woke_at": at(-3),
         "updated_at": at(-3)},
    ],
    "job_runs": [
        {"id": 1, "schedule_id": 1, "scheduled_for": at(-51), "started_at": at(-51), "finished_at": at(-50.9),
         "status": "success", "origin": "schedule", "interactive": False, "session_id": None, "run_id": None,
         "delivered": ["601"], "error": None, "tokens": 310, "cost_nano_usd": 90000, "check_result": None},
        {"id": 2, "schedule_id": 1, "scheduled_for": at(-27), "started_at": at(-27), "finished_at": at(-26.5),
         "status": "failed", "origin": "schedule", "interactive": False, "session_id": None, "run_id": None,
         "delivered": [], "error": "model server unreachable", "tokens": 0, "cost_nano_usd": None,
         "check_result": None},
        {"id": 3, "schedule_id": 1, "scheduled_for": at(-26), "started_at": at(-26), "finished_at": at(-25.9),
         "status": "success", "origin": "retry", "interactive": False, "session_id": None, "run_id": None,
         "delivered": ["602"], "error": None, "tokens": 290, "cost_nano_usd": 85000, "check_result": None},
        {"id": 4, "schedule_id": 1, "scheduled_for": at(-3), "started_at": at(-3), "finished_at": at(-2.95),
         "status": "success", "origin": "schedule", "interactive": False, "session_id": 3, "run_id": 3,
         "delivered": [], "error": None, "tokens": 306, "cost_nano_usd": None, "check_result": None},
        {"id": 5, "schedule_id": 2, "scheduled_for": at(-24 * 3.5 - 2), "started_at": at(-24 * 3.5 - 2),
         "finished_at": at(-24 * 3.5 - 1.9), "status": "success", "origin": "schedule", "interactive": False,
         "session_id": None, "run_id": None, "delivered": ["603"], "error": None, "tokens": 120,
         "cost_nano_usd": 30000, "check_result": None},
    ],
    "delegations": [
        {"id": 1, "parent_session_id": 2, "parent_run_id": 2, "parent_tool_call_id": 99, "ordinal": 0,
         "thread_key": SLACK_THREAD, "child_session_id": None, "child_run_id": None, "name": "researcher",
         "prompt": "Find the runbook for disk alerts", "tools": ["web_search", "http_fetch"], "depth": 1,
         "background": False, "status": "done", "result": "runbooks/disk.md", "reported": True,
         "created_at": at(-29.95), "finished_at": at(-29.92)},
    ],
    "access_requests": [
        {"id": 1, "code": "K7Q2-9XZP", "token": "accessrequesttoken000000000000000000001", "kind": "user",
         "channel": "telegram", "subject": "77", "name": "Linus", "thread_key": "telegram:77:",
         "status": "pending", "open_key": "user:telegram:77", "prompts": [["telegram:42:", ["701"]]],
         "decided_by": None, "created_at": at(-2), "expires_at": at(22), "decided_at": None, "asked_by": "77"},
        {"id": 2, "code": "M3W8-2RTD", "token": "accessrequesttoken000000000000000000002", "kind": "chat",
         "channel": "slack", "subject": "C1", "name": "#incidents", "thread_key": SLACK_THREAD,
         "status": "approved", "open_key": None, "prompts": [], "decided_by": "cli", "created_at": at(-31),
         "expires_at": at(-7), "decided_at": at(-30.5), "asked_by": "U042"},
    ],
    "access_grants": [
        {"id": 1, "kind": "user", "channel": "telegram", "subject": "42", "name": "Ada", "granted_by": "cli",
         "request_id": None, "created_at": at(-48)},
        {"id": 2, "kind": "chat", "channel": "slack", "subject": "C1", "name": "#incidents", "granted_by": "cli",
         "request_id": 2, "created_at": at(-30.5)},
    ],
    "claim_codes": [{"channel": "slack", "code": "483920", "created_at": at(-0.5), "expires_at": at(0.5)}],
    "claim_attempts": [{"channel": "slack", "person": "U666", "wrong": 2, "since": at(-0.4), "locked_until": None}],
    "budget_counters": [
        {"id": 1, "scope": "user", "subject": "telegram:42", "period": "day", "period_key": "2026-12-01",
         "used_nano_usd": 150000, "reserved_nano_usd": 50000, "used_tokens": 836, "reserved_tokens": 4000,
         "alerted_permille": 0, "updated_at": at(-0.99)},
        {"id": 2, "scope": "global", "subject": "", "period": "month", "period_key": "2026-12",
         "used_nano_usd": 4440000, "reserved_nano_usd": 50000, "used_tokens": 2642, "reserved_tokens": 4000,
         "alerted_permille": 500, "updated_at": at(-0.99)},
    ],
    "budget_reservations": [
        {"id": 1, "counters": [1, 2], "nano_usd": 50000, "tokens": 4000, "created_at": at(-0.99),
         "expires_at": at(-0.9)},
    ],
    "audit": [
        {"id": 1, "at": at(-0.99), "kind": "tool", "action": "approval_requested", "actor": "telegram:42",
         "decided_by": None, "via": None, "tool": "write_file", "thread_key": TG_THREAD, "run_id": 1,
         "arguments": {"content": "hi", "path": "note.txt"}, "outcome": None, "detail": {"prompt": 1}},
        {"id": 2, "at": at(-30.5), "kind": "access", "action": "grant", "actor": "cli", "decided_by": "cli",
         "via": "cli", "tool": None, "thread_key": None, "run_id": None, "arguments": None, "outcome": "ok",
         "detail": {"subject": "slack:C1"}},
    ],
    "console_sessions": [
        {"id_hash": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "username": "admin",
         "created_at": at(-1), "expires_at": at(11)},
    ],
    "mcp_tokens": [
        {"server": "github", "tokens": "gAAAAABfixture-encrypted-tokens", "client": "gAAAAABfixture-encrypted-client",
         "updated_at": at(-20)},
    ],
    "memories": [
        {"id": 1, "owner": OWNER, "text": "Prefers answers in British English.", "topic": "style",
         "created_by": "42", "session_id": 1, "uses": 3, "created_at": at(-40), "last_used_at": at(-1),
         "source": "words", "author_name": "Ada", "approved_by": None},
        {"id": 2, "owner": OWNER, "text": "The backup job writes to /srv/backup every night.", "topic": "infra",
         "created_by": "42", "session_id": 1, "uses": 0, "created_at": at(-39), "last_used_at": at(-39),
         "source": "words", "author_name": "Ada", "approved_by": None},
        {"id": 3, "owner": "slack:U042", "text": "On call this week.", "topic": None, "created_by": "U042",
         "session_id": 2, "uses": 1, "created_at": at(-30), "last_used_at": at(-29), "source": "words",
         "author_name": "Grace", "approved_by": None},
    ],
    "memory_sharing": [{"owner": OWNER, "shared": False, "updated_at": at(-40)}],
    "skills": [
        {"name": "release-notes", "origin": "/opt/skills/release-notes", "path": "skills/release-notes",
         "files": {"SKILL.md": "a" * 64}, "digest": "b" * 64, "status": "approved", "forced": None,
         "approved_by": "cli", "added_at": at(-10), "approved_at": at(-10)},
    ],
}


# ---- SQL both engines read ---------------------------------------------------------------------
def literal(value: Any) -> str:
    """A value as SQL text SQLite and PostgreSQL read alike. Times are written without a zone
    (as SQLite keeps them); `load` reads them as UTC on PostgreSQL."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"  # SQLite (3.23+) reads them as 1 and 0
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime):
        value = value.astimezone(UTC).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S.%f")
    elif isinstance(value, dict | list):
        value = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return "'" + str(value).replace("'", "''") + "'"


def ours(table: str) -> bool:
    return table not in NOT_OURS and not table.startswith(NOT_OURS_PREFIX)


def columns_at(conn: Connection) -> dict[str, dict[str, bool]]:
    """Each table of the connected schema -> column -> whether a row must give it a value."""
    found = inspect(conn)
    return {
        table: {
            c["name"]: not c["nullable"] and c.get("default") is None
            for c in found.get_columns(table)
        }
        for table in found.get_table_names()
        if ours(table)
    }


def rows_at(columns: dict[str, dict[str, bool]]) -> dict[str, list[dict[str, Any]]]:
    """ROWS cut to the columns a revision's tables have; every one of its tables must have rows
    and every value it needs (a fixture that left one out would not test its migration)."""
    missing = sorted(set(columns) - set(ROWS))
    if missing:
        raise SystemExit(f"no fixture rows for the tables {missing}: add them to ROWS in {__file__}")
    cut: dict[str, list[dict[str, Any]]] = {}
    for table, rows in ROWS.items():
        if table not in columns:
            continue
        for row in rows:
            needed = [c for c, required in columns[table].items() if required and c not in row]
            if needed:
                raise SystemExit(f"fixture rows of {table} lack the columns {needed}: add them to ROWS")
        cut[table] = [{c: v for c, v in row.items() if c in columns[table]} for row in rows]
    return cut


def render(revision: str, rows: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        f"-- A gateway's rows at schema revision {revision}: tests/test_migrations_data.py loads it into a",
        f"-- database migrated to {revision}. Generated by tests/migration_fixtures.py; do not edit by hand.",
    ]
    for table, table_rows in rows.items():
        for row in table_rows:
            names = ", ".join(f'"{c}"' for c in row)
            values = ", ".join(literal(v) for v in row.values())
            lines.append(f'INSERT INTO "{table}" ({names}) VALUES ({values});')
    return "\n".join(lines) + "\n"


def statements(sql: str) -> list[str]:
    """The statements of a fixture file: split at the semicolons outside quoted values (a value
    may hold a line break or a semicolon), comment lines left out."""
    found: list[str] = []
    current: list[str] = []
    quoted = False
    for line in sql.splitlines(keepends=True):
        if not quoted and line.startswith("--"):
            continue
        for char in line:
            if char == "'":
                quoted = not quoted  # '' inside a value toggles twice
            if char == ";" and not quoted:
                found.append("".join(current).strip())
                current = []
            else:
                current.append(char)
    assert not "".join(current).strip(), "the fixture ends inside a statement"
    return found


# ---- migrating to a given revision -------------------------------------------------------------
def _alembic(conn: Connection, action: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = conn  # gateway/migrations/env.py runs on it
    getattr(command, action)(cfg, revision)


async def migrate_to(store: Store, revision: str) -> None:
    """alembic upgrade to `revision` over the store's connection."""
    await store.db.migrate(lambda conn: _alembic(conn, "upgrade", revision))


async def downgrade_to(store: Store, revision: str) -> None:
    await store.db.migrate(lambda conn: _alembic(conn, "downgrade", revision))


async def load(store: Store, revision: str) -> None:
    """An empty database becomes the gateway's at `revision`: migrated to it, then its rows."""
    await migrate_to(store, revision)
    sql = (FIXTURES / f"{revision}.sql").read_text()

    def insert(conn: Connection) -> None:
        postgres = conn.dialect.name == "postgresql"
        if postgres:
            conn.execute(text("SET LOCAL TIME ZONE 'UTC'"))  # the file's times are UTC
        for statement in statements(sql):
            conn.exec_driver_sql(statement)
        if postgres:  # the rows came with their ids: new ones start after them, as after a restore
            for table in inspect(conn).get_table_names():
                if ours(table) and "id" in {c["name"] for c in inspect(conn).get_columns(table)}:
                    conn.execute(
                        text(f"SELECT setval(pg_get_serial_sequence('\"{table}\"', 'id'), "
                             f"(SELECT COALESCE(MAX(id), 0) + 1 FROM \"{table}\"), false) "
                             f"WHERE pg_get_serial_sequence('\"{table}\"', 'id') IS NOT NULL")
                    )

    await store.db.write(insert)


async def build(revision: str) -> str:
    """The fixture's SQL for `revision`, from a scratch SQLite database migrated to it."""
    with tempfile.TemporaryDirectory() as scratch:
        store = Store(f"sqlite+aiosqlite:///{Path(scratch) / 'fixture.db'}")
        try:
            await migrate_to(store, revision)
            columns = await store.db.read(columns_at)
        finally:
            await store.close()
    return render(revision, rows_at(columns))


async def main() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for revision in REVISIONS:
        (FIXTURES / f"{revision}.sql").write_text(await build(revision))
        print(f"wrote {FIXTURES / f'{revision}.sql'}")


if __name__ == "__main__":
    asyncio.run(main())
