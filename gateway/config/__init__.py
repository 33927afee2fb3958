"""Settings: `config.yml` with `${VAR}` / `${VAR:-default}` interpolation, validated by pydantic.

Secrets (API keys, bot tokens, signing secrets) come only from the environment: in the file
they must be written as `${VAR}` references, and each has an environment default. A `.env`
file beside the config is read first (it never overrides variables already set).
Every error names the file and the key path, e.g. `llm.context_window: expected an integer`.

The sections live by concern: `core.py` (database, LLM, agent, context, inbox, outbox,
approvals, HTTP...), `connections.py` (MCP servers, Telegram, Slack), `scheduler.py`,
`access.py` (roles, pairing, budgets), `root.py` (`Config` and the environment's keys),
`loading.py` (`load_config`), `web.py` (`search`), `mcp_import.py` (`mcp.import`: mcpServers JSON files);
`base.py` what they share. Import them from here.
"""
from gateway.config.access import AccessConfig, BudgetsConfig, CapConfig, DmPolicy, GroupPolicy, RoleConfig
from gateway.config.base import ConfigError, parse_duration
from gateway.config.connections import McpConfig, McpServerConfig, SlackConfig, TelegramConfig
from gateway.config.core import (
    DEFAULT_MODEL,
    AgentConfig,
    ApprovalRule,
    ApprovalsConfig,
    AttachmentsConfig,
    BusyMode,
    ContextConfig,
    DatabaseConfig,
    HttpConfig,
    InboxConfig,
    LLMConfig,
    LoggingConfig,
    MemoryConfig,
    ModelEndpoint,
    ModelPrice,
    OutboxConfig,
    QuestionsConfig,
    RetentionConfig,
    ServeConfig,
    TelemetryConfig,
    TracesConfig,
    VoiceConfig,
)
from gateway.config.loading import DEFAULT_CONFIG_PATH, load_config, read_dotenv
from gateway.config.root import ENV_DEFAULTS, ENV_OVERRIDES, SECRETS, Config
from gateway.config.scheduler import CheckConfig, JobConfig, SchedulerConfig
from gateway.config.skills import SkillsConfig
from gateway.config.web import SearchConfig

__all__ = [
    "DEFAULT_MODEL",
    "AccessConfig",
    "AgentConfig",
    "ApprovalRule",
    "ApprovalsConfig",
    "AttachmentsConfig",
    "BudgetsConfig",
    "BusyMode",
    "CapConfig",
    "CheckConfig",
    "Config",
    "ConfigError",
    "ContextConfig",
    "DEFAULT_CONFIG_PATH",
    "DatabaseConfig",
    "DmPolicy",
    "ENV_DEFAULTS",
    "ENV_OVERRIDES",
    "GroupPolicy",
    "HttpConfig",
    "InboxConfig",
    "JobConfig",
    "LLMConfig",
    "LoggingConfig",
    "McpConfig",
    "MemoryConfig",
    "McpServerConfig",
    "ModelEndpoint",
    "ModelPrice",
    "OutboxConfig",
    "QuestionsConfig",
    "RetentionConfig",
    "RoleConfig",
    "SECRETS",
    "SchedulerConfig",
    "SearchConfig",
    "SkillsConfig",
    "ServeConfig",
    "SlackConfig",
    "TelegramConfig",
    "TelemetryConfig",
    "TracesConfig",
    "VoiceConfig",
    "load_config",
    "parse_duration",
    "read_dotenv",
]
