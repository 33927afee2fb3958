"""Every table of the gateway (SQLAlchemy Core). Migrations are generated from this file."""

from __future__ import annotations

from datetime import UTC

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)

from gateway.events import utcnow

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes on both engines (SQLite keeps no zone, so we add it back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None:
            if value.tzinfo is None:
                raise ValueError("naive datetime given to the store; use timezone-aware UTC")
            value = value.astimezone(UTC)
            if dialect.name == "sqlite":
                value = value.replace(tzinfo=None)
        return value

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


Id = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrement needs INTEGER


def _pk() -> Column:
    return Column("id", Id, primary_key=True, autoincrement=True)


# A thread (chat + topic, channel + thread_ts, DM, a scheduled run) and its current session.
threads = Table(
    "threads",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("channel", String(32), nullable=False),
    Column("session_id", Id, nullable=True),
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
)

sessions = Table(
    "sessions",
    metadata,
    _pk(),
    Column("thread_key", String(255), nullable=False, index=True),
    Column("kind", String(16), nullable=False),  # interactive | cron | tick
    Column("interactive", Boolean, nullable=False, default=True),
    Column("ephemeral", Boolean, nullable=False, default=False),
    Column("source", String(32), nullable=False),  # telegram | slack | console | cron | tick
    Column("started_by", String(64), nullable=False, default=""),
    Column("schedule_id", Id, nullable=True),
    Column("max_rounds", Integer, nullable=True),
    Column("max_tokens", Integer, nullable=True),
    Column("model", String(64), nullable=True),  # a name of llm.models (/model, a job's model); NULL: the default
    Column("next_seq", Integer, nullable=False, default=1),
    Column("notes", JSON, nullable=False, default=dict),  # scratchpad
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
    Column("closed_at", UTCDateTime, nullable=True),
    # opened in a direct message: whose memory it reads, whose earlier sessions history_search finds
    Column("private", Boolean, nullable=False, default=False, server_default=false()),
    # in a shared chat each person's `/model`: {user id: a name of llm.models, or "default"}; NULL: none yet
    Column("person_models", JSON, nullable=True),
)

messages = Table(
    "messages",
    metadata,
    _pk(),
    Column("session_id", Id, ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("role", String(16), nullable=False),  # system | user | assistant | tool(not used)
    Column("content", Text, nullable=False, default=""),
    Column("status", String(8), nullable=False, default="ok"),  # ok | failed
    Column("synthetic", Boolean, nullable=False, default=False),
    Column("reasoning", Text, nullable=True),
    Column("usage", JSON, nullable=True),
    Column("sender_id", String(64), nullable=True),
    Column("sender_name", String(255), nullable=True),
    Column("run_id", Id, nullable=True),
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
    # user rows: the images sent with them ({path, mime, width, height}), attached while recent
    Column("images", JSON, nullable=True),
    # user rows: other people whose words the row holds ({id, name, how}: kept chatter, a quote),
    # whose rights limit the turn it is part of (gateway/agent/voices.py)
    Column("voices", JSON, nullable=True),
    # assistant rows: what the model's API needs back on this message in the turn's next rounds
    # ({"api", "data"}: Anthropic's signed thinking blocks, Responses' encrypted reasoning items)
    Column("replay", JSON, nullable=True),
    UniqueConstraint("session_id", "seq", name="uq_messages_session_seq"),
    Index("ix_messages_session_status_seq", "session_id", "status", "seq"),  # failed rows, each round
)

tool_calls = Table(
    "tool_calls",
    metadata,
    _pk(),
    Column("message_id", Id, ForeignKey("messages.id", ondelete="CASCADE"), nullable=False),
    Column("session_id", Id, nullable=False, index=True),
    Column("call_id", String(128), nullable=False),
    Column("ordinal", Integer, nullable=False),
    Column("name", String(128), nullable=False),
    Column("arguments", Text, nullable=False, default="{}"),
    Column("result", Text, nullable=True),
    # running | pending | done | failed | cancelled | rejected
    Column("status", String(16), nullable=False),
    Column("note", Text, nullable=True),
    Column("run_id", Id, nullable=True),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    UniqueConstraint("message_id", "ordinal", name="uq_tool_calls_message_ordinal"),
    # what changed since the context was last read, each round (history.changes)
    Index("ix_tool_calls_session_finished", "session_id", "finished_at"),
    Index("ix_tool_calls_session_status", "session_id", "status"),
)

runs = Table(
    "runs",
    metadata,
    _pk(),
    Column("session_id", Id, nullable=False, index=True),
    Column("thread_key", String(255), nullable=False),
    # RUNNING | AWAITING_INPUT | SUCCESS | FAILED | CANCELED
    Column("stage", String(16), nullable=False),
    Column("end_reason", String(16), nullable=True),
    Column("error", Text, nullable=True),
    Column("model", String(128), nullable=True),
    Column("next_event_seq", Integer, nullable=False, default=1),
    Column("input_tokens", BigInteger, nullable=False, default=0),
    Column("cached_tokens", BigInteger, nullable=False, default=0),
    Column("cache_write_tokens", BigInteger, nullable=False, default=0, server_default="0"),
    Column("output_tokens", BigInteger, nullable=False, default=0),
    Column("reasoning_tokens", BigInteger, nullable=False, default=0),
    Column("llm_calls", Integer, nullable=False, default=0),
    Column("tool_calls", Integer, nullable=False, default=0),
    Column("cost_nano_usd", BigInteger, nullable=True),  # NULL while nothing is priced
    Column("unpriced", Boolean, nullable=False, default=False),
    # Some token counts were estimated locally (the server sent no usage), and so is the cost.
    Column("usage_estimated", Boolean, nullable=False, default=False, server_default=false()),
    Column("rounds", Integer, nullable=False, default=0),
    Column("started_at", UTCDateTime, nullable=False, default=utcnow),
    Column("finished_at", UTCDateTime, nullable=True),
    # The run's OpenTelemetry trace (32 hex digits) and its turn span (16): every span of the run,
    # across parks and instances, is in this trace; log lines of the run name it too.
    Column("trace_id", String(32), nullable=True),
    Column("trace_span_id", String(16), nullable=True),
    # The runs still RUNNING (maintenance, every few seconds) without walking every run ever made.
    Index("ix_runs_stage_id", "stage", "id"),
)

run_events = Table(
    "run_events",
    metadata,
    _pk(),
    Column("run_id", Id, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("at", UTCDateTime, nullable=False, default=utcnow),
    Column("parent_seq", Integer, nullable=True),  # TOOL_CALL -> the LLM_RESPONSE that asked for it
    Column("payload", JSON, nullable=False, default=dict),
    UniqueConstraint("run_id", "seq", name="uq_run_events_run_seq"),
)

# Durable per-thread inbox: every inbound event, unique on its platform id.
inbox = Table(
    "inbox",
    metadata,
    _pk(),
    Column("event_id", String(255), nullable=False, unique=True),
    Column("thread_key", String(255), nullable=False),
    Column("kind", String(16), nullable=False),  # message | button | resume | command
    Column("payload", JSON, nullable=False),
    Column("status", String(16), nullable=False, default="pending"),  # pending | held | done | dropped
    Column("session_id", Id, nullable=True),
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
    Column("done_at", UTCDateTime, nullable=True),
    Index("ix_inbox_thread_status", "thread_key", "status", "id"),
    Index("ix_inbox_status_id", "status", "id"),
)

# Leases with fencing tokens: "thread:<key>" (one worker per thread), "leader" (polling, clock).
leases = Table(
    "leases",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("owner", String(128), nullable=True),
    Column("fence", BigInteger, nullable=False, default=0),
    Column("expires_at", UTCDateTime, nullable=True),
)

# Channel progress committed with the events it covers (Telegram getUpdates offset).
cursors = Table(
    "cursors",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("value", String(255), nullable=False),
    Column("updated_at", UTCDateTime, nullable=False, default=utcnow),
)

# A platform's flood wait (Telegram retry_after, Slack Retry-After) on a chat: every instance,
# the sweeper and a restarted process leave the chat alone until `until`.
chat_holds = Table(
    "chat_holds",
    metadata,
    Column("chat", String(255), primary_key=True),  # "<channel>:<chat id>"
    Column("until", UTCDateTime, nullable=False),
)

counters = Table(
    "counters",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("value", BigInteger, nullable=False, default=0),
    Column("updated_at", UTCDateTime, nullable=False, default=utcnow),
)

prompts = Table(
    "prompts",
    metadata,
    _pk(),
    Column("token", String(32), nullable=False, unique=True),  # random, url-safe
    Column("kind", String(16), nullable=False),  # approval | question
    Column("session_id", Id, nullable=False, index=True),
    Column("thread_key", String(255), nullable=False, index=True),
    Column("run_id", Id, nullable=True),
    Column("tool_call_id", Id, nullable=True, index=True),
    # pending | approved | rejected | answered | expired | canceled | superseded
    Column("status", String(16), nullable=False, default="pending"),
    Column("payload", JSON, nullable=False, default=dict),  # question, choices, tool, arguments
    Column("requested_by", String(64), nullable=False, default=""),
    Column("decided_by", String(64), nullable=True),
    Column("decided_by_name", String(255), nullable=True),
    Column("decision", String(32), nullable=True),  # approve | deny | allow_15m | allow_thread | choice:N | text
    Column("answer", Text, nullable=True),
    Column("message_ids", JSON, nullable=False, default=list),
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
    Column("expires_at", UTCDateTime, nullable=True),
    Column("decided_at", UTCDateTime, nullable=True),
    Index("ix_prompts_status_expires", "status", "expires_at"),
)

# Human-granted approval bypasses (never set by the model).
bypasses = Table(
    "bypasses",
    metadata,
    _pk(),
    Column("thread_key", String(255), nullable=False, index=True),
    Column("tool", String(128), nullable=False),
    Column("expires_at", UTCDateTime, nullable=True),  # NULL = for this thread
    Column("granted_by", String(64), nullable=False),
    Column("person", String(64), nullable=True),  # whose later requests it covers (NULL: the granter's)
    Column("prompt_id", Id, nullable=True),
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
)

outbox = Table(
    "outbox",
    metadata,
    _pk(),
    Column("key", String(255), nullable=False, unique=True),
    Column("thread_key", String(255), nullable=False, index=True),
    Column("kind", String(16), nullable=False),  # message | prompt | close_prompt | stream
    Column("payload", JSON, nullable=False),
    Column("status", String(16), nullable=False, default="pending"),  # pending | sent | failed
    Column("message_ids", JSON, nullable=False, default=list),  # when pending: the parts already posted
    Column("attempts", Integer, nullable=False, default=0),
    Column("error", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
    Column("sent_at", UTCDateTime, nullable=True),
    Column("retry_at", UTCDateTime, nullable=True),  # the platform asked to wait until then
    # A new message whose send failed ambiguously (timed out: it may be in the chat): what was decided.
    Column("uncertain", String(255), nullable=True),
    # The lease its sender held when it was recorded ("thread:<key>") and that lease's fencing
    # token: a later holder of the thread delivers what an earlier one left pending first.
    Column("sender_lease", String(255), nullable=True),
    Column("sender_fence", Integer, nullable=True),
    Index("ix_outbox_status_id", "status", "id"),
)

compactions = Table(
    "compactions",
    metadata,
    _pk(),
    Column("session_id", Id, ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("first_seq", Integer, nullable=False),
    Column("last_seq", Integer, nullable=False),
    Column("summary", Text, nullable=False),
    Column("folded_text", Text, nullable=False, default=""),  # searchable copy of the folded span
    Column("tokens_before", Integer, nullable=True),
    Column("tokens_after", Integer, nullable=True),
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
)

schedules = Table(
    "schedules",
    metadata,
    _pk(),
    Column("name", String(128), nullable=False, unique=True),
    Column("kind", String(8), nullable=False),  # cron | every | at | tick
    Column("spec", String(255), nullable=False),  # "0 9 * * 1-5" | "30m" | ISO time
    Column("timezone", String(64), nullable=False, default="UTC"),
    Column("prompt", Text, nullable=False),
    Column("deliver_to", String(255), nullable=False, default="none"),
    Column("max_rounds", Integer, nullable=True),
    Column("max_tokens", Integer, nullable=True),
    Column("model", String(64), nullable=True),  # a name of llm.models; NULL: the default
    Column("timeout_s", Integer, nullable=True),
    Column("misfire", String(16), nullable=False, default="run_once"),
    Column("misfire_grace_s", Integer, nullable=True),
    Column("notify_on_failure", Boolean, nullable=False, default=True),
    Column("enabled", Boolean, nullable=False, default=True),
    Column("disabled_reason", String(64), nullable=True),  # "removed from config", "one-shot done", ...
    Column("active_hours", String(32), nullable=True),
    Column("quiet_sentinel", String(64), nullable=True),
    Column("source", String(16), nullable=False, default="config"),  # config | cli | agent
    Column("created_by", String(255), nullable=True),
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
    Column("updated_at", UTCDateTime, nullable=False, default=utcnow),
    # whose memory its runs read and write: the scope of the chat the agent made it in (NULL: the job's own)
    Column("memory_owner", String(160), nullable=True),
    # what runs before the model: {"command"|"url"|"mcp", "wake_when", "timeout_s", ...} (NULL: no check)
    Column("check_spec", JSON, nullable=True),
    Column("checklist", String(255), nullable=True),  # a workspace file a tick works through
    Column("idle_max_every", String(32), nullable=True),  # idle_backoff.max_every ("4h"); NULL: no backoff
    Column("check_failures_before_report", Integer, nullable=True),  # NULL: the scheduler's default
    Column("topic", String(128), nullable=True),  # a topic of its own in deliver_to's chat, by this name
)

# What a job's checks remember between firings (one row per schedule, made at its first check).
schedule_states = Table(
    "schedule_states",
    metadata,
    Column("schedule_id", Id, ForeignKey("schedules.id", ondelete="CASCADE"), primary_key=True),
    Column("output_hash", String(64), nullable=True),  # sha256 of the last output that was seen
    Column("etag", String(255), nullable=True),  # a url check's validators, sent back next time
    Column("last_modified", String(64), nullable=True),
    Column("failures", Integer, nullable=False, default=0),  # failed checks in a row
    Column("failure_reported", Boolean, nullable=False, default=False),  # that run of failures was told
    Column("checklist_hash", String(64), nullable=True),  # the checklist as last answered
    Column("backoff_s", Integer, nullable=True),  # the stretched interval while idle (NULL: `every`)
    Column("last_woke_at", UTCDateTime, nullable=True),
    Column("updated_at", UTCDateTime, nullable=False, default=utcnow),
    Column("topic_thread", String(255), nullable=True),  # the thread of the topic the job opened
)

job_runs = Table(
    "job_runs",
    metadata,
    _pk(),
    Column("schedule_id", Id, ForeignKey("schedules.id", ondelete="CASCADE"), nullable=False),
    Column("scheduled_for", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    # running | success | failed | canceled | skipped | missed
    Column("status", String(16), nullable=False),
    Column("origin", String(16), nullable=False, default="schedule"),  # schedule | manual | retry
    Column("interactive", Boolean, nullable=False, default=False),
    Column("session_id", Id, nullable=True),
    Column("run_id", Id, nullable=True),
    Column("delivered", JSON, nullable=False, default=list),
    Column("error", Text, nullable=True),
    Column("tokens", BigInteger, nullable=False, default=0),
    Column("cost_nano_usd", BigInteger, nullable=True),
    # what the firing's check found: {"found": "woke"|"no change"|"failed", "hash", "bytes", ...}
    Column("check_result", JSON, nullable=True),
    UniqueConstraint("schedule_id", "scheduled_for", name="uq_job_runs_schedule_time"),
)


# A child agent started by the `delegate` tool: one row per task, linked to the parent's run and
# tool call. Sync children run inside the parent's turn; background ones as their own inbox item
# on the thread `task:<id>`. Recovery reads these rows (see gateway/agent/delegation.py).
delegations = Table(
    "delegations",
    metadata,
    _pk(),
    Column("parent_session_id", Id, nullable=False, index=True),
    Column("parent_run_id", Id, nullable=True, index=True),
    Column("parent_tool_call_id", Id, nullable=False),  # tool_calls.id of the delegate call
    Column("ordinal", Integer, nullable=False),  # the task's place in the call
    Column("thread_key", String(255), nullable=False, index=True),  # where it is shown (the parent's chat)
    Column("child_session_id", Id, nullable=True, unique=True),
    Column("child_run_id", Id, nullable=True),
    Column("name", String(64), nullable=False),
    Column("prompt", Text, nullable=False),
    Column("tools", JSON, nullable=False, default=list),  # the tools the child may use
    Column("depth", Integer, nullable=False),  # 1 for a child of a root session
    Column("background", Boolean, nullable=False, default=False),
    # pending | running | suspended | done | failed | canceled
    Column("status", String(16), nullable=False, default="pending"),
    Column("result", Text, nullable=True),
    Column("reported", Boolean, nullable=False, default=False),  # the parent has the result
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
    Column("finished_at", UTCDateTime, nullable=True),
    UniqueConstraint("parent_tool_call_id", "ordinal", name="uq_delegations_call_ordinal"),
)

# People and chats waiting for an admin's approval (pairing), and those approved.
access_requests = Table(
    "access_requests",
    metadata,
    _pk(),
    Column("code", String(16), nullable=False, unique=True),  # shown to the person, typed in the CLI
    Column("token", String(40), nullable=False, unique=True),  # the admins' buttons
    Column("kind", String(8), nullable=False),  # user | chat
    Column("channel", String(32), nullable=False),
    Column("subject", String(128), nullable=False),  # the user id or the chat id
    Column("name", String(255), nullable=False, default=""),
    Column("thread_key", String(255), nullable=False),  # where the held message waits
    Column("status", String(16), nullable=False, default="pending"),  # pending | approved | denied | expired
    # "<channel>:<kind>:<subject>" while pending, NULL after: one pending request per person or chat
    Column("open_key", String(200), nullable=True, unique=True),
    Column("prompts", JSON, nullable=False, default=list),  # [[thread key, [message ids]], ...] sent to admins
    Column("decided_by", String(64), nullable=True),
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("decided_at", UTCDateTime, nullable=True),
    Column("asked_by", String(128), nullable=True),  # the person behind it (a chat's: who addressed the bot)
    Index("ix_access_requests_channel_status", "channel", "status"),
)

access_grants = Table(
    "access_grants",
    metadata,
    _pk(),
    Column("kind", String(8), nullable=False),  # user | chat | admin (claimed with a code: gateway/access/claim.py)
    Column("channel", String(32), nullable=False),
    Column("subject", String(128), nullable=False),
    Column("name", String(255), nullable=False, default=""),
    Column("granted_by", String(64), nullable=False),
    Column("request_id", Id, nullable=True),
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
    UniqueConstraint("kind", "channel", "subject", name="uq_access_grants_kind_channel_subject"),
)

# The one-time code that makes its sender a chat channel's admin while it has none
# (gateway/access/claim.py): one per channel, shown in the terminal, deleted when used.
claim_codes = Table(
    "claim_codes",
    metadata,
    Column("channel", String(32), primary_key=True),
    Column("code", String(16), nullable=False),
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
    Column("expires_at", UTCDateTime, nullable=False),
)

# Wrong claim codes per person: past a few in a row they are locked out for a while.
claim_attempts = Table(
    "claim_attempts",
    metadata,
    Column("channel", String(32), primary_key=True),
    Column("person", String(128), primary_key=True),
    Column("wrong", Integer, nullable=False, default=0),
    Column("since", UTCDateTime, nullable=False),  # the first wrong code of the run
    Column("locked_until", UTCDateTime, nullable=True),
)

# Spend per cap scope and calendar period: used and reserved, in nano-USD and tokens. A call
# reserves its worst case with one conditional UPDATE per counter (the cap in the WHERE).
budget_counters = Table(
    "budget_counters",
    metadata,
    _pk(),
    Column("scope", String(8), nullable=False),  # user | chat | job | global
    Column("subject", String(255), nullable=False),  # "telegram:123", "slack:C1", job id, ""
    Column("period", String(8), nullable=False),  # day | week | month
    Column("period_key", String(16), nullable=False),  # 2026-12-03 | 2026-W49 | 2026-12
    Column("used_nano_usd", BigInteger, nullable=False, default=0),
    Column("reserved_nano_usd", BigInteger, nullable=False, default=0),
    Column("used_tokens", BigInteger, nullable=False, default=0),
    Column("reserved_tokens", BigInteger, nullable=False, default=0),
    Column("alerted_permille", Integer, nullable=False, default=0),  # the highest alert share sent
    Column("updated_at", UTCDateTime, nullable=False, default=utcnow),
    UniqueConstraint("scope", "subject", "period", "period_key", name="uq_budget_counters_scope_subject_period_key"),
)

budget_reservations = Table(
    "budget_reservations",
    metadata,
    _pk(),
    Column("counters", JSON, nullable=False),  # [counter id, ...]
    Column("nano_usd", BigInteger, nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
    Column("expires_at", UTCDateTime, nullable=False, index=True),
    sqlite_autoincrement=True,  # ids are never reused: a late settle cannot hit a newer reservation
)


# The audit trail: who asked for what, who or which rule decided, and what came of it. Rows are
# only ever inserted by the application (and deleted by retention); arguments are redacted
# before they are written (gateway/store/audit.py).
audit = Table(
    "audit",
    metadata,
    _pk(),
    Column("at", UTCDateTime, nullable=False, default=utcnow, index=True),
    # tool_call | access | budget_alert | console_login | console_action | memory
    Column("kind", String(32), nullable=False),
    Column("action", String(64), nullable=False),  # what happened: "run", "approved", "grant", ...
    Column("actor", String(128), nullable=True),  # who asked: "telegram:123", "console", "cli"
    Column("decided_by", String(128), nullable=True),  # the person, or the rule, that decided
    Column("via", String(16), nullable=True),  # button | console | cli | auto | policy | bypass
    Column("tool", String(128), nullable=True),
    Column("thread_key", String(255), nullable=True),
    Column("run_id", Id, nullable=True),
    Column("arguments", JSON, nullable=True),  # redacted
    Column("outcome", String(32), nullable=True),  # ok | error | denied | rejected | expired ...
    Column("detail", JSON, nullable=False, default=dict),  # redacted
    Index("ix_audit_actor_at", "actor", "at"),
    Index("ix_audit_tool_at", "tool", "at"),
    sqlite_autoincrement=True,  # ids only grow: readers may page by id
)


# Console sessions (gateway/admin/auth.py): shared by every instance and kept over a restart.
# The key is the SHA-256 of the session id in the browser's cookie: the table alone logs nobody in.
console_sessions = Table(
    "console_sessions",
    metadata,
    Column("id_hash", String(64), primary_key=True),
    Column("username", String(64), nullable=False),
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
    Column("expires_at", UTCDateTime, nullable=False, index=True),
)


# OAuth tokens and client registrations of remote MCP servers (gateway/mcp/oauth.py), each
# encrypted with the key from GATEWAY_SECRET_KEY: the table alone signs nobody in.
mcp_tokens = Table(
    "mcp_tokens",
    metadata,
    Column("server", String(64), primary_key=True),
    Column("tokens", Text, nullable=True),
    Column("client", Text, nullable=True),
    Column("updated_at", UTCDateTime, nullable=False, default=utcnow),
)


# What the agent remembers across sessions (gateway/memory/). `owner` is whose memory an entry is:
# "person:<channel>:<user>", "chat:<channel>:<chat>" or "job:<name>"; a session reads only the
# owners its scope names (gateway/memory/scope.py).
memories = Table(
    "memories",
    metadata,
    _pk(),
    Column("owner", String(160), nullable=False),
    Column("text", Text, nullable=False),
    Column("topic", String(64), nullable=True),
    Column("created_by", String(128), nullable=True),  # the person whose turn (or command) saved it
    Column("session_id", Id, nullable=True),  # where it was saved
    Column("uses", Integer, nullable=False, default=0),  # times found by memory_search
    Column("created_at", UTCDateTime, nullable=False, default=utcnow),
    Column("last_used_at", UTCDateTime, nullable=False, default=utcnow),  # saved, shown or found
    # Where its words came from (gateway/memory/provenance.py): "words" (the person's own), else
    # the untrusted kinds its conversation held ("web", "file", "attachment", "mcp", "tool",
    # "others"), comma-separated; "unknown" for entries saved before it was recorded.
    Column("source", String(64), nullable=False, server_default="unknown"),
    Column("author_name", String(255), nullable=True),  # the display name of `created_by` then
    Column("approved_by", String(128), nullable=True),  # who approved a save from untrusted content
    Index("ix_memories_owner_last_used", "owner", "last_used_at"),
    sqlite_autoincrement=True,  # a forgotten entry's number is never reused ("forget N" from an old list)
)

# A person's choice to let their memory be read in the groups they speak in (`/memory share on`).
memory_sharing = Table(
    "memory_sharing",
    metadata,
    Column("owner", String(160), primary_key=True),
    Column("shared", Boolean, nullable=False, default=False),
    Column("updated_at", UTCDateTime, nullable=False, default=utcnow),
)

# A chat's own choices (`/voice on|off`): one row per chat, a column per choice; NULL is the
# configured default (`voice.default`).
chat_preferences = Table(
    "chat_preferences",
    metadata,
    Column("chat", String(255), primary_key=True),  # "<channel>:<chat id>"
    Column("voice", Boolean, nullable=True),
    Column("updated_at", UTCDateTime, nullable=False, default=utcnow),
    Column("rich", Boolean, nullable=True),  # Telegram rich messages (`/rich on|off`)
)

# Agent Skills pinned by content (gateway/skills/): each file's SHA-256 as approved. A skill whose
# files on disk differ from `files` (one added counts) is not offered until approved again.
skills = Table(
    "skills",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("origin", String(1024), nullable=False),  # where it came from: a path, "agent", "mcp:<server>"
    Column("path", String(1024), nullable=False),  # its folder, where it is read from
    Column("files", JSON, nullable=False),  # {relative path: sha256} as approved
    Column("digest", String(64), nullable=False),  # sha256 of the sorted (hash, path) lines
    Column("status", String(16), nullable=False),  # approved | disabled
    Column("forced", JSON, nullable=True),  # the door's findings it was added (or approved) over, with --force
    Column("approved_by", String(160), nullable=True),  # "cli", or the person who approved a draft
    Column("added_at", UTCDateTime, nullable=False, default=utcnow),
    Column("approved_at", UTCDateTime, nullable=False, default=utcnow),
)


def include_object(obj, name, type_, reflected, compare_to) -> bool:  # noqa: ANN001
    """For autogenerate and schema checks: objects made by hand in migrations (history search's
    SQLite FTS5 tables and PostgreSQL GIN index) are not in this metadata and are left alone."""
    return not (name or "").startswith("compactions_fts") and name != "ix_compactions_search"
