"""Settings: `config.yml` with `${VAR}` / `${VAR:-default}` interpolation, validated by pydantic.

Secrets (API keys, bot tokens, signing secrets) come only from the environment: in the file
they must be written as `${VAR}` references, and each has an environment default. A `.env`
file beside the config is read first (it never overrides variables already set).
Every error names the file and the key path, e.g. `llm.context_window: expected an integer`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError

DEFAULT_CONFIG_PATH = "config.yml"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


class ConfigError(Exception):
    """A configuration problem, worded for the person who edits the file."""


def parse_duration(value: Any) -> float:
    """`90`, `"90s"`, `"15m"`, `"2h"`, `"1d"` -> seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 30s, 15m or 2h, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"expected a duration like 30s, 15m or 2h, got {value!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class DatabaseConfig(_Section):
    url: str = "sqlite+aiosqlite:///data/gateway.db"
    auto_migrate: bool = True
    echo: bool = False


class ModelPrice(_Section):
    """USD per million tokens."""

    input: float
    output: float
    cached_input: float | None = None  # defaults to `input`


class LLMConfig(_Section):
    base_url: str = "http://127.0.0.1:11434/v1"
    api_key: str = ""
    model: str = "qwen2.5:7b-instruct"
    fallback_models: list[str] = []
    # "auto": asked of the server once (llama.cpp /props, vLLM /v1/models, Ollama /api/show, LM Studio
    # /api/v0/models), else 8192 with a log line; 0 = unbudgeted: never truncate, never compact.
    context_window: int | Literal["auto"] = "auto"
    reserve_pct: float = 12.0
    prices: dict[str, ModelPrice] = {}
    request_timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    max_retries: int = 4
    retry_budget_s: float = 120.0
    max_tokens: int | None = None
    temperature: float | None = None
    verbatim_tool_results: bool = False
    vision: bool = False  # true: images go to the model as image_url parts
    transcription_model: str = ""  # e.g. whisper-1: voice/audio -> POST {base_url}/audio/transcriptions
    # What an assistant message with tool calls and no text sends as `content`: "empty" ("",
    # accepted by OpenAI, vLLM, llama.cpp, Ollama) or "null" (for a server that wants null).
    tool_call_content: Literal["empty", "null"] = "empty"


    @field_validator("context_window", mode="before")
    @classmethod
    def _window(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        if not isinstance(value, bool):
            try:
                return int(value)
            except (TypeError, ValueError):
                pass
        raise PydanticCustomError("context_window", 'expected an integer or "auto"')


class AgentConfig(_Section):
    system_prompt: str = "You are a helpful assistant. Be concise."
    max_rounds: int = Field(25, ge=1)
    workspace: str = "workspace"
    tools: list[str] = ["*"]  # names or globs of the tools offered to the model
    timezone: str = "UTC"
    max_tool_result_chars: int = 16_000  # results of previous turns above this are hidden
    shell_timeout_s: float = 60.0
    shell_output_chars: int = 20_000
    http_fetch_max_bytes: int = 1_000_000
    http_fetch_timeout_s: float = 20.0
    http_fetch_allow_private: bool = False
    max_parallel_children: int = Field(4, ge=1)  # sub-agents of one batch running at once
    max_depth: int = Field(2, ge=0)  # sub-agents of sub-agents; 0 turns `delegate` off
    show_children: bool = True  # a line in the chat when a sub-agent starts and finishes
    http_allow_hosts: list[str] = []  # hosts (globs) http_fetch reaches without approval
    shell_sandbox: Literal["none", "unshare", "bwrap"] = "none"  # see docs/operations.md, "The shell"


class ContextConfig(_Section):
    headroom_tokens: int = 10_000
    keep_messages: int = 8
    keep_tool_exchanges: int = 4
    pin_first_user: bool = False
    lod_above_chars: int = 4_000
    lod_step: int = 8
    max_tool_result_chars: int = 64_000
    max_folds_per_build: int = 4


class AttachmentsConfig(_Section):
    max_bytes: int = Field(20_000_000, ge=1)  # larger files are not downloaded; the model and the user are told
    dir: str = "attachments"  # inside the workspace: <dir>/<session>/<name>
    image_max_side: int = Field(1568, ge=64)  # images are downscaled to this longest side for the model
    image_turns: int = Field(3, ge=1)  # image parts go with the last N user turns; older ones become their note
    max_inline_chars: int = Field(20_000, ge=0)  # text documents and PDF text inline up to this
    download_attempts: int = Field(4, ge=1)
    download_backoff_s: float = Field(1.0, ge=0)  # doubled after each failed attempt
    download_timeout_s: float = Field(60.0, gt=0)
    album_wait_s: float = Field(1.0, ge=0)  # parts of a Telegram album arriving this close together are one message


class TracesConfig(_Section):
    max_payload_chars: int = 8_000


BusyMode = Literal["steer", "queue", "interrupt"]


class InboxConfig(_Section):
    busy_mode: BusyMode = "steer"
    busy_mode_by_channel: dict[str, BusyMode] = {}
    max_concurrent_turns: int = Field(8, ge=1)
    lease_ttl_s: float = 30.0
    poll_interval_s: float = 1.0

    def busy_mode_for(self, channel: str) -> BusyMode:
        return self.busy_mode_by_channel.get(channel, self.busy_mode)


class OutboxConfig(_Section):
    """The one retry layer of every send (channels hand failures back at once)."""

    max_attempts: int = Field(5, ge=1)  # transient failures (5xx, network) per delivery attempt
    backoff_s: float = Field(0.5, gt=0)  # first wait; doubles, with jitter, up to backoff_max_s
    backoff_max_s: float = Field(30.0, gt=0)
    sweep_after_s: float = Field(60.0, gt=0)  # a row pending this long with nobody sending it is swept
    give_up_after_s: float = Field(24 * 3600.0, gt=0)  # a swept row older than this is given up

    _duration = field_validator("sweep_after_s", "give_up_after_s", mode="before")(lambda cls, v: parse_duration(v))


class RetentionConfig(_Section):
    """Finished work older than this is pruned by the leader, in batches; pending, held or
    parked work never is. 0 keeps it forever."""

    inbox_days: float = Field(30, ge=0)  # handled (and dropped) inbox items
    outbox_days: float = Field(30, ge=0)  # delivered or given-up sends
    prompts_days: float = Field(30, ge=0)  # decided, expired or canceled prompts
    run_events_days: float = Field(30, ge=0)  # the timelines of finished runs (the runs stay)
    audit_days: float = Field(90, ge=0)  # the audit trail (tool calls, decisions, access, console)
    every_s: float = Field(3600.0, gt=0)
    batch: int = Field(1000, ge=1)

    _duration = field_validator("every_s", mode="before")(lambda cls, v: parse_duration(v))


class ApprovalRule(_Section):
    tool: str
    action: Literal["allow", "deny", "require"]
    args: dict[str, str] = {}
    source: list[str] | str | None = None
    priority: int = 0


class ApprovalsConfig(_Section):
    rules: list[dict[str, Any]] = []  # validated one by one; a bad rule fails closed
    approvers: dict[str, list[str]] = {}
    admins: dict[str, list[str]] = {}
    separate_requester: bool = False  # the person who asked never decides their own request
    expire_after: float = 24 * 3600.0

    _duration = field_validator("expire_after", mode="before")(lambda cls, v: parse_duration(v))

    @field_validator("approvers", "admins", mode="before")
    @classmethod
    def _ids_as_strings(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: [str(x) for x in (v or [])] for k, v in value.items()}
        return value


class QuestionsConfig(_Section):
    timeout: float = 3600.0

    _duration = field_validator("timeout", mode="before")(lambda cls, v: parse_duration(v))


class HttpConfig(_Section):
    host: str = "127.0.0.1"
    port: int = 8080


class ServeConfig(_Section):
    shutdown_grace: float = 20.0
    instance_id: str = ""  # defaults to host:pid

    _duration = field_validator("shutdown_grace", mode="before")(lambda cls, v: parse_duration(v))


_SERVER_NAME = re.compile(r"^[A-Za-z0-9-]{1,24}$")


class McpServerConfig(_Section):
    """One MCP server: `command` (stdio, a subprocess) or `url` (Streamable HTTP, or SSE)."""

    command: list[str] = []
    env: dict[str, str] = {}
    cwd: str = ""
    url: str = ""
    transport: Literal["streamable_http", "sse"] = "streamable_http"  # for `url`
    # auto: the 2026-07-28 protocol where the server has it, else the initialize handshake; legacy: always the handshake
    protocol: Literal["auto", "legacy"] = "auto"
    headers: dict[str, str] = {}
    tools: list[str] = ["*"]  # globs of the server's own tool names to offer
    trusted: bool = False  # believe the server's readOnlyHint annotations
    timeout_s: float = Field(60.0, gt=0)  # per call
    connect_timeout_s: float = Field(30.0, gt=0)  # start + handshake + first tool list
    sampling: bool = False  # answer the server's sampling requests with our model (counts against the run)
    description_chars: int = Field(300, ge=0)  # tool descriptions are cut to this, so the prompt stays small
    enabled: bool = True

    _duration = field_validator("timeout_s", "connect_timeout_s", mode="before")(lambda cls, v: parse_duration(v))

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if bool(self.command) == bool(self.url):
            raise ValueError("give either command (a stdio server) or url (an HTTP server), not both or neither")
        return self


class McpConfig(_Section):
    servers: dict[str, McpServerConfig] = {}
    restart_initial_s: float = Field(1.0, gt=0)  # first wait before restarting a failed server; doubles
    restart_max_s: float = Field(60.0, gt=0)
    health_interval_s: float = Field(15.0, gt=0)  # a running server's tools are listed again this often

    _duration = field_validator("restart_initial_s", "restart_max_s", "health_interval_s", mode="before")(
        lambda cls, v: parse_duration(v)
    )

    @field_validator("servers")
    @classmethod
    def _names(cls, value: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in value:
            if not _SERVER_NAME.match(name):
                raise ValueError(
                    f"server name {name!r}: use 1-24 letters, digits or - (tools are named mcp__<server>__<tool>)"
                )
        return value


def _strings(value: Any) -> Any:
    if isinstance(value, list):
        return [str(x) for x in value]
    return value


class TelegramConfig(_Section):
    token: str = ""
    api_base_url: str = "https://api.telegram.org/bot"
    api_file_url: str = "https://api.telegram.org/file/bot"  # PTB's base_file_url convention
    mode: Literal["polling", "webhook"] = "polling"
    webhook_url: str = ""
    webhook_secret: str = ""
    allowed_users: list[str] = []  # ids or @usernames; empty = everyone
    allowed_chats: list[str] = []
    group_trigger: Literal["mention", "all"] = "mention"
    streaming: Literal["auto", "edit", "off"] = "auto"
    show_tool_progress: bool = False
    process_edited: bool = False
    poll_timeout_s: int = 30
    edit_interval_s: float = 1.0  # streaming edits/drafts: at most one per chat per interval
    rate_overall_per_s: float = 30.0  # sends per second for the whole bot (0 = no pacing)
    rate_private_per_s: float = 1.0  # sends per second per private chat (bursts of 3)
    rate_group_per_min: float = 20.0  # sends per minute per group
    request_timeout_s: float = Field(10.0, gt=0)  # a send unanswered this long may still have been delivered

    _ids = field_validator("allowed_users", "allowed_chats", mode="before")(lambda cls, v: _strings(v))

    @property
    def enabled(self) -> bool:
        return bool(self.token)


class SlackConfig(_Section):
    bot_token: str = ""
    signing_secret: str = ""
    app_token: str = ""
    api_base_url: str = "https://slack.com/api/"
    allowed_users: list[str] = []
    allowed_channels: list[str] = []
    thread_followups: bool = True
    streaming: Literal["auto", "native", "edit", "off"] = "auto"
    send_interval_s: float = Field(1.0, ge=0)  # per-channel pacing of posts (Slack: ~1 message/s)
    stream_interval_s: float = Field(1.0, ge=0)  # at most one streamed append / edit per interval

    _ids = field_validator("allowed_users", "allowed_channels", mode="before")(lambda cls, v: _strings(v))

    @property
    def enabled(self) -> bool:
        return bool(self.bot_token)


class JobConfig(_Section):
    name: str
    kind: Literal["cron", "every", "at", "tick"] = "cron"
    cron: str | None = None
    every: str | None = None
    at: str | None = None
    in_: str | None = Field(None, alias="in")
    timezone: str | None = None
    prompt: str = ""
    deliver_to: str = "none"
    max_rounds: int | None = None
    max_tokens: int | None = None
    timeout: str | float | None = None
    misfire: Literal["run_once", "skip"] = "run_once"
    misfire_grace: str | float | None = None
    notify_on_failure: bool = True
    enabled: bool = True
    active_hours: str | None = None  # "08:00-22:00" for ticks
    quiet_sentinel: str | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SchedulerConfig(_Section):
    enabled: bool = True
    timezone: str = "UTC"
    misfire_grace: float = 3600.0
    quiet_sentinel: str = "NOTHING_TO_REPORT"
    timeout: float = 3600.0  # a run still going after this (unless the job sets `timeout`) is stopped
    poll_interval: float = 15.0  # the leader looks for schedule changes and overdue runs this often
    jobs: list[JobConfig] = []

    _duration = field_validator("misfire_grace", "timeout", "poll_interval", mode="before")(
        lambda cls, v: parse_duration(v)
    )


DmPolicy = Literal["pairing", "allowlist", "open"]
GroupPolicy = Literal["allowlist", "open"]


class RoleConfig(_Section):
    """What a person's turns may do. Tool lists are names or globs."""

    tools: list[str] = ["*"]  # offered (and allowed) tools
    deny_tools: list[str] = []  # never offered, refused if called anyway
    approve: bool = False  # may decide approval requests of other people
    compact: bool = True  # may run /compact
    new_for_others: bool = False  # may run /new in a chat whose session someone else started
    schedule: bool = True  # may use the `schedule` tool


class AccessConfig(_Section):
    dm_policy: DmPolicy = "pairing"
    group_policy: GroupPolicy = "allowlist"
    pairing_ttl: float = 3600.0
    max_pending_per_channel: int = Field(10, ge=1)  # pairing requests waiting at once, per channel
    roles: dict[str, RoleConfig] = {}
    users: dict[str, str] = {}  # "telegram:123456789" -> role name (admin | member | your own)

    _duration = field_validator("pairing_ttl", mode="before")(lambda cls, v: parse_duration(v))

    @field_validator("users", mode="before")
    @classmethod
    def _keys_as_strings(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return value


class CapConfig(_Section):
    scope: Literal["user", "chat", "job", "global"]
    period: Literal["day", "week", "month"]
    usd: float | None = Field(None, ge=0)
    tokens: int | None = Field(None, ge=0)

    @field_validator("tokens")
    @classmethod
    def _one_limit(cls, tokens: int | None, info: Any) -> int | None:
        if tokens is None and info.data.get("usd") is None:
            raise ValueError("a cap needs usd or tokens")
        return tokens


class BudgetsConfig(_Section):
    caps: list[CapConfig] = []
    alert_at: list[float] = [0.5, 0.8, 1.0]  # shares of a cap at which admins are told, once per period
    unpriced: Literal["deny", "allow"] = "deny"  # a USD cap with a model that has no price
    reply_tokens: int = Field(4096, ge=1)  # a capped call's reply limit when llm.max_tokens is unset
    prompt_bytes_per_token: float = Field(3.0, gt=0)  # the reservation's bound on prompt tokens
    reservation_ttl: float = 3600.0  # a reservation its call never settled (a crash) counts in full after this

    _duration = field_validator("reservation_ttl", mode="before")(lambda cls, v: parse_duration(v))


class Config(_Section):
    database: DatabaseConfig = DatabaseConfig()
    llm: LLMConfig = LLMConfig()
    agent: AgentConfig = AgentConfig()
    context: ContextConfig = ContextConfig()
    traces: TracesConfig = TracesConfig()
    attachments: AttachmentsConfig = AttachmentsConfig()
    inbox: InboxConfig = InboxConfig()
    outbox: OutboxConfig = OutboxConfig()
    retention: RetentionConfig = RetentionConfig()
    approvals: ApprovalsConfig = ApprovalsConfig()
    questions: QuestionsConfig = QuestionsConfig()
    http: HttpConfig = HttpConfig()
    serve: ServeConfig = ServeConfig()
    telegram: TelegramConfig = TelegramConfig()
    slack: SlackConfig = SlackConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    mcp: McpConfig = McpConfig()
    access: AccessConfig = AccessConfig()
    budgets: BudgetsConfig = BudgetsConfig()

    source: str = Field("<defaults>", exclude=True)


# Secret key paths and the environment variable each falls back to.
SECRETS: dict[tuple[str, ...], str] = {
    ("llm", "api_key"): "LLM_API_KEY",
    ("telegram", "token"): "TELEGRAM_BOT_TOKEN",
    ("telegram", "webhook_secret"): "TELEGRAM_WEBHOOK_SECRET",
    ("slack", "bot_token"): "SLACK_BOT_TOKEN",
    ("slack", "signing_secret"): "SLACK_SIGNING_SECRET",
    ("slack", "app_token"): "SLACK_APP_TOKEN",
}
# Plain settings the environment overrides (handy for containers and tests).
ENV_OVERRIDES: dict[tuple[str, ...], str] = {
    ("database", "url"): "GATEWAY_DATABASE_URL",
}


def read_dotenv(path: Path) -> None:
    """Load KEY=VALUE lines into os.environ without overriding what is already set."""
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        os.environ.setdefault(key.strip(), value)


def _interpolate(node: Any, path: tuple[str, ...], env: dict[str, str]) -> Any:
    if isinstance(node, dict):
        return {k: _interpolate(v, path + (str(k),), env) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, path + (str(i),), env) for i, v in enumerate(node)]
    if not isinstance(node, str):
        return node

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"{'.'.join(path)}: environment variable {name} is not set")

    # Pydantic's lax mode turns "8080" or "true" into the declared type afterwards.
    return _ENV_REF.sub(substitute, node)


def _check_secrets_are_references(raw: dict[str, Any]) -> None:
    for path, env_name in SECRETS.items():
        node: Any = raw
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str) and node and "${" not in node:
            raise ConfigError(
                f"{'.'.join(path)}: secrets are read from the environment only; "
                f"write ${{{env_name}}} here and set {env_name}"
            )


def _apply_env(data: dict[str, Any], env: dict[str, str]) -> None:
    for table in (SECRETS, ENV_OVERRIDES):
        for path, env_name in table.items():
            section = data.setdefault(path[0], {})
            if not isinstance(section, dict):
                continue
            explicit = table is ENV_OVERRIDES
            if env.get(env_name) and (explicit or not section.get(path[1])):
                section[path[1]] = env[env_name]


def _describe(error: ErrorDetails) -> str:
    kind = error["type"]
    got = error.get("input")
    shown = json.dumps(got, default=str) if not isinstance(got, dict) else "a mapping"
    messages = {
        "int_parsing": "expected an integer",
        "int_type": "expected an integer",
        "int_from_float": "expected an integer",
        "float_parsing": "expected a number",
        "float_type": "expected a number",
        "bool_parsing": "expected true or false",
        "bool_type": "expected true or false",
        "string_type": "expected a string",
        "list_type": "expected a list",
        "dict_type": "expected a mapping",
        "model_type": "expected a mapping",
        "model_attributes_type": "expected a mapping",
    }
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return f"{error['msg'].replace('Input should be', 'expected')}, got {shown}"
    if kind in messages:
        return f"{messages[kind]}, got {shown}"
    return f"{error['msg']}, got {shown}"


def _format_errors(source: str, exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in error["loc"] if p not in ("function-after", "function-before"))
        lines.append(f"{source}: {loc}: {_describe(error)}")
    return "\n".join(lines)


def load_config(path: str | os.PathLike[str] | None = None, *, env: dict[str, str] | None = None) -> Config:
    """Read, interpolate and validate the configuration.

    Without a path: `$GATEWAY_CONFIG`, else `config.yml` if it exists, else the defaults.
    """
    explicit = path is not None or "GATEWAY_CONFIG" in os.environ
    file = Path(path or os.environ.get("GATEWAY_CONFIG", DEFAULT_CONFIG_PATH))
    if env is None:
        read_dotenv(file.parent / ".env")
        env = dict(os.environ)
    raw: Any = {}
    if file.is_file():
        try:
            raw = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{file}: not valid YAML: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{file}: the top level must be a mapping of sections")
    elif explicit:
        raise ConfigError(f"{file}: no such configuration file")
    source = str(file) if file.is_file() else "<defaults>"
    try:
        _check_secrets_are_references(raw)
        data = _interpolate(raw, (), env)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    _apply_env(data, env)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(source, exc)) from exc
    config.source = source
    return config
