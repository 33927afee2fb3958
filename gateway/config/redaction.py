"""The configuration as the console shows it: by allowlist. A value is shown only when its key
is listed below as harmless; every other value (a secret, a credential inside a URL, a header,
an environment variable, a key this version does not know) is masked, showing only that it is
set and how long it is. A new setting stays masked until it is added here.

Paths are dotted key names; `*` stands for any name in a mapping (servers, roles, prices) or any
item of a list (jobs, rules, caps)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel

from gateway.config.root import SECRETS

MASK = "••••"


def _paths(text: str) -> frozenset[tuple[str, ...]]:
    return frozenset(tuple(line.split(".")) for line in text.split())


# Values shown as they are.
SHOWN = _paths(
    """
    database.auto_migrate database.echo database.pool_size database.max_overflow
    llm.model llm.fallback_models llm.fallback llm.context_window llm.reserve_pct
    llm.prices.*.input llm.prices.*.output llm.prices.*.cached_input llm.prices.*.cache_read
    llm.prices.*.cache_write llm.prices.*.per_minute
    llm.models.*.model llm.models.*.context_window llm.models.*.prices.input llm.models.*.prices.output
    llm.models.*.prices.cached_input llm.models.*.prices.cache_read llm.models.*.prices.cache_write
    llm.models.*.prices.per_minute
    llm.request_timeout_s llm.connect_timeout_s llm.max_retries llm.retry_budget_s llm.max_tokens
    llm.temperature llm.verbatim_tool_results llm.vision llm.transcription_model llm.tool_call_content
    agent.system_prompt agent.max_rounds agent.workspace agent.tools agent.timezone agent.max_tool_result_chars
    agent.shell_timeout_s agent.shell_output_chars agent.http_fetch_max_bytes agent.http_fetch_timeout_s
    agent.http_fetch_allow_private agent.max_parallel_children agent.max_depth agent.show_children
    agent.http_allow_hosts agent.shell_sandbox
    agent.shared_dir agent.shared_writable agent.shell_network agent.shell_env agent.shell_ro_paths
    context.headroom_tokens context.keep_messages context.keep_tool_exchanges context.pin_first_user
    context.lod_above_chars context.lod_step context.max_tool_result_chars context.max_folds_per_build
    traces.max_payload_chars
    telemetry.service_name telemetry.resource_attributes telemetry.export_interval telemetry.max_batch
    telemetry.max_queue telemetry.export_timeout telemetry.shutdown_timeout
    logging.level
    attachments.max_bytes attachments.dir attachments.image_max_side attachments.image_turns
    attachments.max_inline_chars attachments.download_attempts attachments.download_backoff_s
    attachments.download_timeout_s attachments.album_wait_s
    attachments.max_image_pixels attachments.pdf_max_pages attachments.pdf_cpu_s attachments.pdf_memory_mb
    attachments.pdf_timeout_s
    inbox.busy_mode inbox.busy_mode_by_channel inbox.max_concurrent_turns inbox.lease_ttl_s inbox.poll_interval_s
    inbox.on_edit
    outbox.max_attempts outbox.backoff_s outbox.backoff_max_s outbox.sweep_after_s outbox.give_up_after_s
    retention.inbox_days retention.outbox_days retention.prompts_days retention.run_events_days
    retention.audit_days retention.files_days retention.every_s retention.batch retention.memory_days
    memory.enabled memory.budget_tokens memory.scope memory.max_entries memory.max_chars
    approvals.rules.*.tool approvals.rules.*.action approvals.rules.*.args approvals.rules.*.source
    approvals.rules.*.priority
    approvals.approvers approvals.admins approvals.separate_requester approvals.self_approve approvals.expire_after
    questions.timeout
    http.host http.port http.trusted_proxies http.public_status
    admin.enabled
    serve.shutdown_grace serve.instance_id
    telegram.mode telegram.allowed_users telegram.allowed_chats telegram.group_trigger telegram.streaming
    telegram.show_tool_progress telegram.process_edited telegram.poll_timeout_s telegram.edit_interval_s
    telegram.typing_after_s
    telegram.rate_overall_per_s telegram.rate_private_per_s telegram.rate_group_per_min
    telegram.request_timeout_s telegram.link_previews telegram.group_context
    slack.allowed_users slack.allowed_channels slack.thread_followups slack.streaming slack.send_interval_s
    slack.stream_interval_s slack.link_previews slack.channel_context
    scheduler.enabled scheduler.timezone scheduler.misfire_grace scheduler.quiet_sentinel scheduler.timeout
    scheduler.poll_interval
    scheduler.jobs.*.name scheduler.jobs.*.kind scheduler.jobs.*.cron scheduler.jobs.*.every scheduler.jobs.*.at
    scheduler.jobs.*.in_ scheduler.jobs.*.timezone scheduler.jobs.*.prompt scheduler.jobs.*.deliver_to
    scheduler.jobs.*.max_rounds scheduler.jobs.*.max_tokens scheduler.jobs.*.model scheduler.jobs.*.timeout
    scheduler.jobs.*.misfire
    scheduler.jobs.*.misfire_grace scheduler.jobs.*.notify_on_failure scheduler.jobs.*.enabled
    scheduler.jobs.*.active_hours scheduler.jobs.*.quiet_sentinel
    mcp.servers.*.cwd mcp.servers.*.transport mcp.servers.*.protocol mcp.servers.*.tools mcp.servers.*.trusted
    mcp.servers.*.timeout_s mcp.servers.*.connect_timeout_s mcp.servers.*.sampling mcp.servers.*.description_chars
    mcp.servers.*.enabled
    mcp.restart_initial_s mcp.restart_max_s mcp.health_interval_s
    mcp.restart_reset_s mcp.import_files mcp.servers.*.auth mcp.servers.*.oauth_scope
    access.dm_policy access.group_policy access.pairing_ttl access.max_pending_per_channel
    access.roles.*.tools access.roles.*.deny_tools access.roles.*.approve access.roles.*.compact
    access.roles.*.new_for_others access.roles.*.schedule access.roles.*.models
    access.users
    budgets.caps.*.scope budgets.caps.*.period budgets.caps.*.usd budgets.caps.*.tokens
    budgets.alert_at budgets.unpriced budgets.reply_tokens budgets.prompt_bytes_per_token budgets.reservation_ttl
    search.provider search.max_results search.default_results search.timeout_s search.max_response_bytes
    """
)
# URLs: scheme, host, port and path shown; the user and password, and query values, masked.
URLS = _paths(
    """
    database.url llm.base_url llm.models.*.base_url telegram.api_base_url telegram.api_file_url telegram.webhook_url
    slack.api_base_url mcp.servers.*.url mcp.servers.*.oauth_redirect search.url telemetry.otlp_endpoint
    """
)
# Mappings whose names are shown and values masked (header names, environment variable names).
NAMES_ONLY = _paths("mcp.servers.*.headers mcp.servers.*.env telemetry.otlp_headers")
# A command line: the program shown, its arguments (which may carry a token) masked.
PROGRAMS = _paths("mcp.servers.*.command")
# Masked on purpose (everything not listed above is masked anyway; these say it was decided).
# args: a command's arguments, like command's; a named model's key, like llm.api_key
MASKED = frozenset(SECRETS) | _paths("mcp.servers.*.args llm.models.*.api_key")

_ALL = SHOWN | URLS | NAMES_ONLY | PROGRAMS


def _matches(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    return len(pattern) == len(path) and all(p in ("*", part) for p, part in zip(pattern, path, strict=True))


def _in(patterns: Iterable[tuple[str, ...]], path: tuple[str, ...]) -> bool:
    return any(_matches(p, path) for p in patterns)


def _leads_somewhere(path: tuple[str, ...]) -> bool:
    """Some allowlisted key lies under this path: descend into it."""
    return any(len(p) > len(path) and _matches(p[: len(path)], path) for p in _ALL)


def mask(value: Any) -> Any:
    """That a value is set and its size, never the value."""
    if value is None or value == "" or value == [] or value == {}:
        return value
    if isinstance(value, str):
        return f"{MASK} (set, {len(value)} characters)"
    if isinstance(value, dict):
        return f"{MASK} ({len(value)} {'entry' if len(value) == 1 else 'entries'})"
    if isinstance(value, list):
        return f"{MASK} ({len(value)} {'item' if len(value) == 1 else 'items'})"
    return f"{MASK} (set)"


def redact_url(url: str) -> str:
    """`scheme://host:port/path`, with `••••@` for a user or password and `name=••••` for each
    query parameter; what does not parse as a URL is masked whole."""
    if not url:
        return url
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return mask(url)
    if not parts.scheme or "://" not in url:
        return mask(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = ("••••@" if parts.username is not None or parts.password is not None else "") + host
    netloc += f":{port}" if port is not None else ""
    query = "&".join(f"{name}={MASK}" for name, _ in parse_qsl(parts.query, keep_blank_values=True))
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


def _program(command: Any) -> Any:
    if not isinstance(command, list) or not command:
        return mask(command)
    rest = len(command) - 1
    return [str(command[0]), *([f"{MASK} ({rest} more {'argument' if rest == 1 else 'arguments'})"] if rest else [])]


def _walk(value: Any, path: tuple[str, ...]) -> Any:
    if _in(SHOWN, path):
        return value
    if _in(URLS, path):
        return redact_url(value) if isinstance(value, str) else mask(value)
    if _in(NAMES_ONLY, path):
        return {str(k): mask(v) for k, v in value.items()} if isinstance(value, dict) else mask(value)
    if _in(PROGRAMS, path):
        return _program(value)
    if _leads_somewhere(path):
        if isinstance(value, dict):
            return {str(k): _walk(v, (*path, str(k))) for k, v in value.items()}
        if isinstance(value, list):
            return [_walk(v, (*path, str(i))) for i, v in enumerate(value)]
    return mask(value)


def redacted_config(config: BaseModel) -> dict[str, Any]:
    """The effective configuration as the console shows it (see the module's docstring)."""
    return _walk(config.model_dump(mode="json"), ())


def secret_values(config: BaseModel, *, shortest: int = 4) -> set[str]:
    """Every string the view masks (whole values, URL credentials and query values, arguments),
    for scrubbing text that may quote them (an MCP server's error message)."""
    found: set[str] = set()

    def collect(value: Any, path: tuple[str, ...]) -> None:
        if _in(SHOWN, path):
            return
        if isinstance(value, dict):
            for key, item in value.items():
                collect(item, (*path, str(key)))
        elif isinstance(value, list):
            start = 1 if _in(PROGRAMS, path) else 0
            for i, item in enumerate(value[start:], start):
                collect(item, (*path, str(i)))
        elif isinstance(value, str) and _in(URLS, path):
            found.update(_url_secrets(value))
        elif isinstance(value, str):
            # "Bearer <token>": the token may be quoted alone
            found.update({value, *(word for word in value.split() if len(word) >= 8)})

    collect(config.model_dump(mode="json"), ())
    return {text for text in found if len(text) >= shortest}


def _url_secrets(url: str) -> set[str]:
    try:
        parts = urlsplit(url)
        values = {parts.username or "", parts.password or ""}
    except ValueError:
        return set()
    return values | {value for _, value in parse_qsl(parts.query)}


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` with each of `secrets` replaced by ••••, longest first (one may contain another)."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
