"""`Config`: every section under its key, and the keys the environment fills in."""

from __future__ import annotations

from pydantic import Field

from gateway.config.access import AccessConfig, BudgetsConfig
from gateway.config.base import Section
from gateway.config.connections import McpConfig, SlackConfig, TelegramConfig
from gateway.config.core import (
    AdminConfig,
    AgentConfig,
    ApprovalsConfig,
    AttachmentsConfig,
    ContextConfig,
    DatabaseConfig,
    HttpConfig,
    InboxConfig,
    LLMConfig,
    OutboxConfig,
    QuestionsConfig,
    RetentionConfig,
    ServeConfig,
    TracesConfig,
)
from gateway.config.scheduler import SchedulerConfig


class Config(Section):
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
    admin: AdminConfig = AdminConfig()
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
    ("admin", "token"): "GATEWAY_ADMIN_TOKEN",
}
# Plain settings the environment overrides (handy for containers and tests).
ENV_OVERRIDES: dict[tuple[str, ...], str] = {
    ("database", "url"): "GATEWAY_DATABASE_URL",
}
