"""The settings of the core: database, LLM, agent, context, traces, attachments, inbox,
outbox, retention, approvals, questions, HTTP and serving."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gateway.config.base import Section, parse_duration


class DatabaseConfig(Section):
    url: str = "sqlite+aiosqlite:///data/gateway.db"
    auto_migrate: bool = True
    echo: bool = False
    # PostgreSQL connections one instance keeps open, and opens beyond that at peaks: at most
    # pool_size + max_overflow (the NOTIFY listener included); sizing rule in docs/operations.md.
    pool_size: int = Field(10, ge=1)
    max_overflow: int = Field(20, ge=0)


class ModelPrice(Section):
    """USD per million tokens; `per_minute` is USD per minute of audio (a transcription model);
    `per_million_chars` USD per million characters spoken (a speech model). A chat model needs
    `input` and `output`; a transcription model `per_minute`; a speech model `per_million_chars`."""

    input: float | None = Field(None, ge=0)
    output: float | None = Field(None, ge=0)  # reasoning tokens are output tokens (they are billed so)
    cache_read: float | None = Field(None, ge=0)  # prompt tokens read from the provider's cache; default `input`
    cache_write: float | None = Field(None, ge=0)  # prompt tokens written to it (Anthropic-style); default `input`
    cached_input: float | None = Field(None, ge=0)  # the former name of `cache_read`
    per_minute: float | None = Field(None, ge=0)  # transcription: USD per minute of audio
    per_million_chars: float | None = Field(None, ge=0)  # speech: USD per million characters of text

    @model_validator(mode="after")
    def _complete(self) -> ModelPrice:
        audio = self.per_minute is not None or self.per_million_chars is not None
        if not audio and (self.input is None or self.output is None):
            raise ValueError(
                "a price needs input and output (USD per million tokens), per_minute (transcription) "
                "or per_million_chars (speech)"
            )
        if self.cache_read is None and self.cached_input is not None:
            self.cache_read = self.cached_input
        return self

    @property
    def for_tokens(self) -> bool:
        return self.input is not None and self.output is not None


# The wire format a model's server speaks (docs/model-servers.md): OpenAI Chat Completions,
# OpenAI Responses or Anthropic Messages.
Api = Literal["chat", "responses", "anthropic"]
# How hard a model thinks before it answers, in each API's own terms (Anthropic's thinking
# budget, Responses' reasoning.effort, Chat Completions' reasoning_effort); "auto": not sent.
Reasoning = Literal["auto", "off", "low", "medium", "high"]

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,63}$")
DEFAULT_MODEL = "default"  # what `/model default` and `model: default` name: `llm` itself


class ModelEndpoint(Section):
    """A named model (`llm.models.<name>`): its own server and key, or another model of `llm`'s."""

    model: str  # the model name the server is asked for
    base_url: str = ""  # empty: llm.base_url (and llm.api_key when api_key is empty)
    api_key: str = ""  # a ${VAR} reference, like llm.api_key
    context_window: int | Literal["auto"] = "auto"  # as llm.context_window
    prices: ModelPrice | None = None  # else llm.prices.<model>
    api: Api | None = None  # None: llm.api on llm's server, else chat
    reasoning: Reasoning = "auto"
    # send the session as `prompt_cache_key` (chat, responses); None: only to api.openai.com
    prompt_cache_key: bool | None = None

    _window = field_validator("context_window", mode="before")(lambda cls, v: _context_window(v))


class LLMConfig(Section):
    base_url: str = "http://127.0.0.1:11434/v1"
    api_key: str = ""
    model: str = "qwen2.5:7b-instruct"
    # Named models a chat (/model) or a job (scheduler.jobs[].model) may use; `llm` stays the default.
    models: dict[str, ModelEndpoint] = {}
    # Names of `models` tried in order when a call fails with a retryable error (5xx, 429 after
    # the retries, timeouts, connection errors); never for a prompt over the context.
    fallback: list[str] = []
    # Deprecated: other models of the same server; read as `models` (one each) appended to `fallback`.
    fallback_models: list[str] = []
    # "auto": asked of the server once (llama.cpp /props, vLLM /v1/models, Ollama /api/show, LM Studio
    # /api/v0/models), else 8192 with a log line; 0 = unbudgeted: never truncate, never compact.
    context_window: int | Literal["auto"] = "auto"
    reserve_pct: float = 12.0
    prices: dict[str, ModelPrice] = {}  # by the model name the server is asked for (and transcription_model)
    request_timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    max_retries: int = 4
    retry_budget_s: float = 120.0
    max_tokens: int | None = None
    temperature: float | None = None
    verbatim_tool_results: bool = False
    vision: bool = False  # true: images go to the model as image_url parts
    transcription_model: str = ""  # e.g. whisper-1: voice/audio -> POST {base_url}/audio/transcriptions
    # e.g. gpt-4o-mini-tts: answers spoken as voice notes (`voice`) -> POST {speech_base_url}/audio/speech
    speech_model: str = ""
    speech_base_url: str = ""  # empty: base_url (and api_key when speech_api_key is empty)
    speech_api_key: str = ""  # a ${VAR} reference; never llm.api_key when speech_base_url is another server

    def speech_server(self) -> tuple[str, str]:
        """(base URL, API key) of the speech model: llm's key never goes to another server."""
        if self.speech_base_url:
            return self.speech_base_url, self.speech_api_key
        return self.base_url, self.speech_api_key or self.api_key
    # What an assistant message with tool calls and no text sends as `content`: "empty" ("",
    # accepted by OpenAI, vLLM, llama.cpp, Ollama) or "null" (for a server that wants null).
    tool_call_content: Literal["empty", "null"] = "empty"
    api: Api = "chat"  # the wire format llm.base_url speaks: chat | responses | anthropic
    reasoning: Reasoning = "auto"  # off | low | medium | high: the thinking asked of the model
    # send the session as `prompt_cache_key` (chat, responses); None: only to api.openai.com
    prompt_cache_key: bool | None = None

    _window = field_validator("context_window", mode="before")(lambda cls, v: _context_window(v))

    @model_validator(mode="after")
    def _named_models(self) -> LLMConfig:
        for name in self.models:
            if not MODEL_NAME.match(name) or name == DEFAULT_MODEL:
                raise ValueError(
                    f"llm.models: {name!r} is not a usable name (letters, digits and _ . : / @ + -, "
                    f"not {DEFAULT_MODEL!r}, which is llm itself)"
                )
            if name == self.model:
                raise ValueError(f"llm.models: {name!r} is llm.model's name; llm itself is the default")
        for legacy in self.fallback_models:  # the old same-server fallback, read as named models
            if legacy != self.model and legacy not in self.models:
                self.models[legacy] = ModelEndpoint(model=legacy)
            if legacy != self.model and legacy not in self.fallback:
                self.fallback.append(legacy)
        unknown = [name for name in self.fallback if name not in self.models]
        if unknown:
            known = ", ".join(sorted(self.models)) or "none"
            raise ValueError(f"llm.fallback: {', '.join(unknown)} not in llm.models (named: {known})")
        return self

    # ---- the models by the name a run records ------------------------------------------------
    def ref(self, name: str | None) -> str:
        """The name calls and runs know a model by: a name of `models`, or `model` for the default."""
        return name if name and name in self.models else self.model

    def served_model(self, ref: str) -> str:
        """The model name the server is asked for."""
        return self.models[ref].model if ref in self.models else ref

    def api_of(self, ref: str) -> Api:
        """The wire format of a model: its own `api`, else llm's when it is on llm's server."""
        endpoint = self.models.get(ref)
        if endpoint is None:
            return self.api
        if endpoint.api is not None:
            return endpoint.api
        same_server = not endpoint.base_url or endpoint.base_url.rstrip("/") == self.base_url.rstrip("/")
        return self.api if same_server else "chat"

    def window_setting(self, ref: str) -> int | Literal["auto"]:
        return self.models[ref].context_window if ref in self.models else self.context_window

    def price_of(self, ref: str) -> ModelPrice | None:
        """The named model's own prices, else `prices` under the model name the server is asked for."""
        endpoint = self.models.get(ref)
        if endpoint is not None and endpoint.prices is not None:
            return endpoint.prices
        return self.prices.get(self.served_model(ref))


def _context_window(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if not isinstance(value, bool):
        try:
            return int(value)
        except (TypeError, ValueError):
            pass
    raise PydanticCustomError("context_window", 'expected an integer or "auto"')


class AgentConfig(Section):
    system_prompt: str = "You are a helpful assistant. Be concise."
    max_rounds: int = Field(25, ge=1)
    workspace: str = "workspace"  # each session's files: <workspace>/sessions/<id>/ (docs/security.md)
    shared_dir: str = ""  # a directory every session's tools may read (absolute paths); none by default
    shared_writable: bool = False  # and write
    tools: list[str] = ["*"]  # names or globs of the tools offered to the model
    # names or globs of the tools kept first when the model's window is too small for all of them
    tool_priority: list[str] = []
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
    http_allow_hosts: list[str] = []  # hosts (globs) web_fetch reaches without approval
    # auto: bwrap; where it does not work the shell is not offered (fail closed); none: unconfined (docs/security.md)
    shell_sandbox: Literal["auto", "none", "unshare", "bwrap"] = "auto"
    shell_network: bool = False  # a sandboxed command may reach the network
    shell_env: list[str] = []  # names (globs) of variables passed to commands besides PATH, LANG, LC_*, TZ, TERM
    shell_ro_paths: list[str] = []  # bwrap: more directories the command sees read-only (besides /usr, /etc, ...)


class ContextConfig(Section):
    headroom_tokens: int = 10_000
    keep_messages: int = 8
    keep_tool_exchanges: int = 4
    pin_first_user: bool = False
    lod_above_chars: int = 4_000
    lod_step: int = 8
    max_tool_result_chars: int = 64_000
    max_folds_per_build: int = 4


class AttachmentsConfig(Section):
    max_bytes: int = Field(20_000_000, ge=1)  # larger files are not downloaded; the model and the user are told
    dir: str = "attachments"  # inside the session's directory: <dir>/<session>/<name>
    image_max_side: int = Field(1568, ge=64)  # images are downscaled to this longest side for the model
    image_turns: int = Field(3, ge=1)  # image parts go with the last N user turns; older ones become their note
    max_inline_chars: int = Field(20_000, ge=0)  # text documents and PDF text inline up to this
    download_attempts: int = Field(4, ge=1)
    download_backoff_s: float = Field(1.0, ge=0)  # doubled after each failed attempt
    download_timeout_s: float = Field(60.0, gt=0)
    album_wait_s: float = Field(1.0, ge=0)  # parts of a Telegram album arriving this close together are one message
    # Hostile files (docs/security.md, "Hostile input"): images with more pixels are refused
    # before decoding; a PDF's text is read in a child process under these limits.
    max_image_pixels: int = Field(64_000_000, ge=1)
    pdf_max_pages: int = Field(200, ge=1)  # pages read for their text; the rest are left to a tool
    pdf_cpu_s: int = Field(10, ge=1)  # CPU seconds of the child (RLIMIT_CPU)
    pdf_memory_mb: int = Field(512, ge=0)  # address space of the child (RLIMIT_AS); 0: no limit
    pdf_timeout_s: float = Field(30.0, gt=0)  # wall clock: a child still running then is killed


class VoiceConfig(Section):
    """Answers also sent as voice notes (`/voice on|off` per chat), spoken by `llm.speech_model`."""

    default: Literal["off", "on"] = "off"  # for chats that never said /voice
    voice: str = "alloy"  # the speech model's voice
    max_chars: int = Field(1500, ge=50, le=4096)  # longer answers are cut at a sentence; the text has all
    timeout_s: float = Field(60.0, gt=0)  # the speech request; a slower one leaves the text answer alone

    _switch = field_validator("default", mode="before")(
        lambda cls, v: {False: "off", True: "on"}.get(v, v) if isinstance(v, bool) else v  # YAML's bare off/on
    )


class TracesConfig(Section):
    max_payload_chars: int = 8_000


BusyMode = Literal["steer", "queue", "interrupt"]


class InboxConfig(Section):
    busy_mode: BusyMode = "steer"
    busy_mode_by_channel: dict[str, BusyMode] = {}
    # Peak messages/s x seconds per turn, at most what the LLM endpoint serves at once; one
    # instance is one event loop, one core (docs/operations.md, "Sizing").
    max_concurrent_turns: int = Field(8, ge=1)
    lease_ttl_s: float = 30.0
    poll_interval_s: float = 1.0
    # An edit of a message already answered: answered as a follow-up about the edit (reply),
    # dropped (ignore), or kept as context for the thread's next turn (note).
    on_edit: Literal["reply", "ignore", "note"] = "reply"

    def busy_mode_for(self, channel: str) -> BusyMode:
        return self.busy_mode_by_channel.get(channel, self.busy_mode)


class OutboxConfig(Section):
    """The one retry layer of every send (channels hand failures back at once)."""

    max_attempts: int = Field(5, ge=1)  # transient failures (5xx, network) per delivery attempt
    backoff_s: float = Field(0.5, gt=0)  # first wait; doubles, with jitter, up to backoff_max_s
    backoff_max_s: float = Field(30.0, gt=0)
    sweep_after_s: float = Field(60.0, gt=0)  # a row pending this long with nobody sending it is swept
    give_up_after_s: float = Field(24 * 3600.0, gt=0)  # a swept row older than this is given up

    _duration = field_validator("sweep_after_s", "give_up_after_s", mode="before")(lambda cls, v: parse_duration(v))


class RetentionConfig(Section):
    """Finished work older than this is pruned by the leader, in batches; pending, held or
    parked work never is. 0 keeps it forever."""

    inbox_days: float = Field(30, ge=0)  # handled (and dropped) inbox items
    outbox_days: float = Field(30, ge=0)  # delivered or given-up sends
    prompts_days: float = Field(30, ge=0)  # decided, expired or canceled prompts
    run_events_days: float = Field(30, ge=0)  # the timelines of finished runs (the runs stay)
    audit_days: float = Field(90, ge=0)  # the audit trail (tool calls, decisions, access, console)
    # memories neither saved, shown at a session's start nor found by memory_search for this long
    memory_days: float = Field(0, ge=0)
    # a closed session's attachments and MCP results on disk (its history stays); each instance prunes its own
    files_days: float = Field(30, ge=0)
    every_s: float = Field(3600.0, gt=0)
    batch: int = Field(1000, ge=1)

    _duration = field_validator("every_s", mode="before")(lambda cls, v: parse_duration(v))


class MemoryConfig(Section):
    """What the agent remembers across sessions (gateway/memory/): entries it saves with
    `memory_save`, shown at the start of every session within `budget_tokens`."""

    enabled: bool = True
    budget_tokens: int = Field(1500, ge=0)  # of the context, in the system message; 0: none shown (search only)
    # person: a direct message reads and writes its person's memory, a group its own (and what each
    # speaker shared with groups); chat: every chat its own memory, people's never
    scope: Literal["person", "chat"] = "person"
    max_entries: int = Field(200, ge=1)  # per owner (a person, a chat, a job)
    max_chars: int = Field(1000, ge=10)  # of one entry


class ApprovalRule(Section):
    tool: str
    action: Literal["allow", "deny", "require"]
    args: dict[str, str] = {}
    source: list[str] | str | None = None
    priority: int = 0


class ApprovalsConfig(Section):
    rules: list[dict[str, Any]] = []  # validated one by one; a bad rule fails closed
    approvers: dict[str, list[str]] = {}
    admins: dict[str, list[str]] = {}
    separate_requester: bool = False  # the person who asked never decides their own request
    # true: with no approvers configured, the person who asked decides their own request (the
    # behaviour of before); default: admins, approvers and roles with `approve` decide
    self_approve: bool = False
    expire_after: float = 24 * 3600.0

    _duration = field_validator("expire_after", mode="before")(lambda cls, v: parse_duration(v))

    @field_validator("approvers", "admins", mode="before")
    @classmethod
    def _ids_as_strings(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: [str(x) for x in (v or [])] for k, v in value.items()}
        return value


class QuestionsConfig(Section):
    timeout: float = 3600.0

    _duration = field_validator("timeout", mode="before")(lambda cls, v: parse_duration(v))


class HttpConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)  # 0: any free port (the log says which)
    # Reverse proxies (CIDRs) whose X-Forwarded-For and X-Forwarded-Proto are believed; from any
    # other peer those headers are ignored (docs/operations.md, "Behind a reverse proxy").
    trusted_proxies: list[str] = []
    public_status: bool = False  # true: /readyz details and /metrics for every client, not only local or admin

    @field_validator("trusted_proxies")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"{cidr!r} is not an address or a network (e.g. 10.0.0.0/8, 127.0.0.1)") from None
        return value


class AdminConfig(Section):
    """The web console (`/admin`) and the JSON admin API (`/admin/api/`)."""

    enabled: bool = True
    token: str = ""  # empty: the console and the admin API are off

    @property
    def active(self) -> bool:
        return self.enabled and bool(self.token)


class TelemetryConfig(Section):
    """Spans over OTLP/HTTP (protobuf) to a collector; off (nothing of OpenTelemetry loaded)
    while `otlp_endpoint` is empty."""

    otlp_endpoint: str = ""  # the collector's OTLP/HTTP base URL (http://host:4318); /v1/traces is added
    otlp_headers: dict[str, str] = {}  # sent with every export, e.g. an Authorization header (masked when shown)
    service_name: str = Field("chat-gateway", min_length=1)
    resource_attributes: dict[str, str] = {}  # more resource attributes, e.g. deployment.environment
    export_interval: float = Field(5.0, gt=0)  # a batch is sent at least this often
    max_queue: int = Field(2048, ge=1)  # spans waiting for export; past it new ones are dropped (a down collector)
    max_batch: int = Field(512, ge=1)  # spans per export request
    export_timeout: float = Field(10.0, gt=0)  # one export, its retries included
    shutdown_timeout: float = Field(5.0, ge=0)  # how long a stop waits for the last spans to go out

    _duration = field_validator("export_interval", "export_timeout", "shutdown_timeout", mode="before")(
        lambda cls, v: parse_duration(v)
    )

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, value: str) -> str:
        value = value.strip()
        if value and not value.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL of the collector, got {value!r}")
        return value

    @field_validator("max_batch")
    @classmethod
    def _batch_fits_queue(cls, value: int, info: Any) -> int:
        queue = info.data.get("max_queue")
        if queue is not None and value > queue:
            raise ValueError(f"max_batch ({value}) must not exceed max_queue ({queue})")
        return value

    @property
    def enabled(self) -> bool:
        return bool(self.otlp_endpoint)

    @property
    def traces_url(self) -> str:
        """The signal's URL: the base URL with `/v1/traces`, unless it already ends with it."""
        base = self.otlp_endpoint.rstrip("/")
        return base if base.endswith("/v1/traces") else f"{base}/v1/traces"


class LoggingConfig(Section):
    # info: the gateway's own lines; other libraries say only warnings and errors unless `debug`
    level: Literal["debug", "info", "warning", "error"] = "info"


class ServeConfig(Section):
    shutdown_grace: float = 20.0
    instance_id: str = ""  # defaults to host:pid

    _duration = field_validator("shutdown_grace", mode="before")(lambda cls, v: parse_duration(v))
