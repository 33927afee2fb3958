"""What the gateway shows of its configuration, and of any text that may quote it: the one
redactor behind the console, the admin API, /readyz, `gateway doctor`, /status and the log
lines that name an MCP server's target or error.

The configuration view is an allowlist. A value is shown only when its key is listed below as
harmless; every other value (a secret, a credential inside a URL, a header, an environment
variable, a key this version does not know) is masked, showing only that it is set and how long
it is. A new setting stays masked until it is added here. Paths are dotted key names; `*` stands
for any name in a mapping (servers, roles, prices) or any item of a list (jobs, rules, caps).

Targets and texts (an MCP server's command line or URL, an error, a stderr line) go through
`redact_url`, `redact_command` and `redact_text`: a URL keeps scheme, host, port and path; a
command line keeps its program and its harmless arguments; in any text, URL credentials and
query values, the values of secret-looking flags, `NAME=value` and `Name: value` pairs
(key, token, secret, password, auth, sig, ...), bearer and basic credentials and well-known token
shapes are masked. `scrub` then masks the exact values a configuration holds, wherever they are
quoted."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel

from gateway.config.connections import McpServerConfig
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
    llm.prices.*.cache_write llm.prices.*.per_minute llm.prices.*.per_million_chars
    llm.models.*.model llm.models.*.context_window llm.models.*.prices.input llm.models.*.prices.output
    llm.models.*.prices.cached_input llm.models.*.prices.cache_read llm.models.*.prices.cache_write
    llm.models.*.prices.per_minute llm.models.*.prices.per_million_chars
    llm.models.*.api llm.models.*.reasoning llm.models.*.prompt_cache_key
    llm.api llm.reasoning llm.prompt_cache_key
    llm.request_timeout_s llm.connect_timeout_s llm.max_retries llm.retry_budget_s llm.max_tokens
    llm.temperature llm.verbatim_tool_results llm.vision llm.transcription_model llm.tool_call_content
    llm.speech_model voice.default voice.voice voice.max_chars voice.timeout_s
    agent.system_prompt agent.max_rounds agent.workspace agent.tools agent.timezone agent.max_tool_result_chars
    agent.shell_timeout_s agent.shell_output_chars agent.http_fetch_max_bytes agent.http_fetch_timeout_s
    agent.http_fetch_allow_private agent.max_parallel_children agent.max_depth agent.show_children
    agent.http_allow_hosts agent.shell_sandbox agent.tool_priority
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
    skills.dirs skills.read_max_chars skills.write skills.chats
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
    telegram.request_timeout_s telegram.link_previews telegram.group_context telegram.stop_button
    telegram.rich_messages telegram.group_approvals telegram.new_topic_per_conversation
    slack.allowed_users slack.allowed_channels slack.thread_followups slack.streaming slack.send_interval_s
    slack.stream_interval_s slack.link_previews slack.channel_context slack.task_cards slack.feedback_buttons
    slack.app_view slack.suggested_prompts.*.title slack.suggested_prompts.*.message slack.suggested_prompts_title
    scheduler.enabled scheduler.timezone scheduler.misfire_grace scheduler.quiet_sentinel scheduler.timeout
    scheduler.poll_interval
    scheduler.jobs.*.name scheduler.jobs.*.kind scheduler.jobs.*.cron scheduler.jobs.*.every scheduler.jobs.*.at
    scheduler.jobs.*.in_ scheduler.jobs.*.timezone scheduler.jobs.*.prompt scheduler.jobs.*.deliver_to
    scheduler.jobs.*.max_rounds scheduler.jobs.*.max_tokens scheduler.jobs.*.model scheduler.jobs.*.timeout
    scheduler.jobs.*.misfire
    scheduler.jobs.*.misfire_grace scheduler.jobs.*.notify_on_failure scheduler.jobs.*.enabled
    scheduler.jobs.*.active_hours scheduler.jobs.*.quiet_sentinel scheduler.check_failures_before_report
    scheduler.jobs.*.check.wake_when scheduler.jobs.*.check.timeout scheduler.jobs.*.check.max_output
    scheduler.jobs.*.check.network scheduler.jobs.*.check.mcp.server scheduler.jobs.*.check.mcp.tool
    scheduler.jobs.*.checklist scheduler.jobs.*.idle_backoff.max_every scheduler.jobs.*.check_failures_before_report
    scheduler.jobs.*.topic
    mcp.servers.*.cwd mcp.servers.*.transport mcp.servers.*.protocol mcp.servers.*.tools mcp.servers.*.trusted
    mcp.servers.*.timeout_s mcp.servers.*.connect_timeout_s mcp.servers.*.sampling mcp.servers.*.description_chars
    mcp.servers.*.sampling_max_tokens mcp.servers.*.sampling_per_call
    mcp.servers.*.enabled
    mcp.restart_initial_s mcp.restart_max_s mcp.health_interval_s
    mcp.restart_reset_s mcp.import_files mcp.servers.*.auth mcp.servers.*.oauth_scope
    access.dm_policy access.group_policy access.pairing_ttl access.max_pending_per_channel
    access.roles.*.tools access.roles.*.deny_tools access.roles.*.approve access.roles.*.compact
    access.roles.*.new_for_others access.roles.*.schedule access.roles.*.models access.roles.*.skills
    access.users
    budgets.caps.*.scope budgets.caps.*.period budgets.caps.*.usd budgets.caps.*.tokens
    budgets.alert_at budgets.unpriced budgets.reply_tokens budgets.prompt_bytes_per_token budgets.reservation_ttl
    search.provider search.max_results search.default_results search.timeout_s search.max_response_bytes
    """
)
# URLs: scheme, host, port and path shown; the user and password, and query values, masked.
URLS = _paths(
    """
    database.url llm.base_url llm.speech_base_url
    llm.models.*.base_url telegram.api_base_url telegram.api_file_url telegram.webhook_url
    slack.api_base_url mcp.servers.*.url mcp.servers.*.oauth_redirect search.url telemetry.otlp_endpoint
    scheduler.jobs.*.check.url
    """
)
# Mappings whose names are shown and values masked (header names, environment variable names).
NAMES_ONLY = _paths("mcp.servers.*.headers mcp.servers.*.env telemetry.otlp_headers")
# A command line: the program and its harmless arguments shown, secrets among them masked (redact_command).
PROGRAMS = _paths("mcp.servers.*.command")
# Masked on purpose (everything not listed above is masked anyway; these say it was decided).
# args: appended to command when loaded (empty once loaded); a named model's key, like llm.api_key
# a job check's command line (a shell string, may carry a token) and its MCP arguments, like a tool call's
MASKED = frozenset(SECRETS) | _paths(
    "mcp.servers.*.args llm.models.*.api_key scheduler.jobs.*.check.command scheduler.jobs.*.check.mcp.arguments"
)

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
    return redact_command([str(part) for part in command])


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
            start = 1 if _in(PROGRAMS, path) else 0  # every argument, shown or not: the console is strict
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


# ---- texts: targets, command lines, errors, log lines ---------------------------------------

# A name that says its value is a credential: a flag, a query parameter, an environment variable,
# a header, a JSON key. "max_tokens" and other counts are not; over-masking (a "keyboard") is safe.
_SECRET_NAME = r"(?:key|token(?!s\b)|secret|pass|pwd|auth|sig|credential|cookie|session|private|jwt)"
_SECRET = re.compile(_SECRET_NAME, re.IGNORECASE)
# Single-letter flags whose value is a secret by convention (mysql -p, curl -H "Authorization: ...").
_SECRET_SHORT_FLAGS = frozenset({"-p", "-H", "--header", "--headers"})
_NAME = re.compile(r"-{0,2}[A-Za-z_][\w.-]*\Z")
# A bare argument that looks like a credential: a word of token characters (no path, package,
# host or version separators) with letters and digits, or a long one in mixed case.
_TOKEN_LIKE = re.compile(
    r"(?!-)(?:(?=.*[A-Za-z])(?=.*\d)[A-Za-z0-9_+=~-]{8,}|(?=.*[a-z])(?=.*[A-Z])[A-Za-z0-9_+=~-]{20,})\Z"
)
# Every rule starts only where a run of its characters starts (a lookbehind, not \b), and checks
# names in code: the time is linear in the text's length, whatever the text (a server's stderr).
_URL = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_CREDENTIAL = re.compile(r"(?i)(?<![\w-])(bearer|basic)\s+[A-Za-z0-9._~+/=-]{4,}")
_AUTHORIZATION = re.compile(r"(?i)(?<![\w-])((?:proxy-)?authorization\s*[:=]\s*)[^\r\n\"']+")
# --api-key X, -token X, -p X: a flag and its value (that is not the next flag)
_FLAG_VALUE = re.compile(r"(?<![\w-])(-{1,2}[\w-]+)(\s+)(?!-)([^\s\"']+)")
# name=value, name: value, "name": "value" (env, query strings, headers, JSON, --flag=value); a
# colon needs a space or a quote after it: host.example:8443 is no pair
_PAIR = re.compile(r"(?<![\w.-])([\w.-]+)([\"']?\s*=\s*[\"']?|:\s+[\"']?|[\"']\s*:\s*[\"']?)([^\s\"'&,;)]+)")
# well-known token shapes (OpenAI/Anthropic sk-, Slack xox?-, GitHub, AWS, Telegram bot tokens)
_SHAPES = re.compile(
    r"(?<![\w-])(?:sk-[A-Za-z0-9_-]{16,}|xox[abposr]-[A-Za-z0-9-]{10,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|AKIA[0-9A-Z]{16}\b|\d{6,12}:[A-Za-z0-9_-]{30,})"
)


def redact_text(text: str) -> str:
    """`text` (an error, a log line, a stderr line) with the credentials it may quote masked:
    URLs as `redact_url` shows them, then credentials, secret flags' values, secret-named pairs
    and token shapes. Harmless text is left as it is."""
    if not text:
        return text
    text = _URL.sub(_url_in_text, text)
    text = _CREDENTIAL.sub(lambda m: f"{m.group(1)} {MASK}", text)
    text = _AUTHORIZATION.sub(lambda m: f"{m.group(1)}{MASK}", text)
    text = _FLAG_VALUE.sub(_flag_value, text)
    text = _PAIR.sub(_pair, text)
    return _SHAPES.sub(MASK, text)


def _flag_value(match: re.Match[str]) -> str:
    flag, space, value = match.groups()
    hidden = flag == "-p" or (len(flag.lstrip("-")) > 1 and _SECRET.search(flag) is not None)
    return f"{flag}{space}{MASK}" if hidden and value != MASK else match.group(0)


def _pair(match: re.Match[str]) -> str:
    name, separator, value = match.groups()
    return f"{name}{separator}{MASK}" if _SECRET.search(name) and value != MASK else match.group(0)


def _url_in_text(match: re.Match[str]) -> str:
    url = match.group(0)
    trail = len(url) - len(url.rstrip(".,;:)]}"))
    url, rest = (url[:-trail], url[-trail:]) if trail else (url, "")
    shown = redact_url(url)
    return (shown if not shown.startswith(MASK) else f"{url.split('://', 1)[0]}://{MASK}") + rest


def _secret_flag(arg: str) -> bool:
    """A flag whose next argument is its value, and a secret: --api-key, -token, -p."""
    if not arg.startswith("-") or "=" in arg:
        return False
    return arg in _SECRET_SHORT_FLAGS or (len(arg.lstrip("-")) > 1 and bool(_SECRET.search(arg)))


def _command_parts(argv: Sequence[str]) -> list[tuple[str, str]]:
    """Each argument after the program as shown, with the secret it hides ("" when none)."""
    parts: list[tuple[str, str]] = []
    previous = ""
    for arg in argv[1:]:
        name, eq, value = arg.partition("=")
        if _secret_flag(previous):
            parts.append((MASK, arg))
        elif eq and _NAME.match(name) and _SECRET.search(name):
            parts.append((f"{name}={MASK}", value))  # --token=X, API_KEY=X
        elif _TOKEN_LIKE.match(arg):
            parts.append((MASK, arg))
        else:
            parts.append((redact_text(arg), ""))
        previous = arg
    return parts


def redact_command(argv: Sequence[str]) -> list[str]:
    """A command line as it may be shown: the program, and each argument unless it is a secret
    (the value of a secret-looking flag or `NAME=`, a token-like word, a URL's credentials)."""
    if not argv:
        return []
    return [redact_text(argv[0]), *(shown for shown, _ in _command_parts(argv))]


def command_secrets(argv: Sequence[str]) -> set[str]:
    """The arguments `redact_command` hides, to scrub from texts that quote them."""
    return {hidden for _, hidden in _command_parts(argv) if hidden}


def shown_target(command: Sequence[str], url: str) -> str:
    """Where an MCP server is, as anything that shows it says it: its URL or its command line."""
    return " ".join(redact_command(command)) if command else redact_url(url)


def target_secrets(command: Sequence[str], url: str, *values: str) -> set[str]:
    """What a server's texts must not quote: what its target hides, and `values` (its headers'
    and environment's values), each long enough to be worth looking for."""
    found = command_secrets(command) | (_url_secrets(url) if url else set())
    for value in values:
        found.update({value, *(word for word in value.split() if len(word) >= 8)})
    return {text for text in found if len(text) >= 4}


def mcp_secrets(server: McpServerConfig) -> set[str]:
    """What an MCP server's errors and stderr lines must not quote: what its target hides, and
    its headers' and environment's values."""
    return target_secrets(server.command, server.url, *server.headers.values(), *server.env.values())


def redact_error(text: str, secrets: Iterable[str] = ()) -> str:
    """An error's text as shown: the exact `secrets` scrubbed, then `redact_text`."""
    return redact_text(scrub(text, secrets))
