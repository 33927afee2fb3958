"""`Config`: every section under its key, and the keys the environment fills in."""

from __future__ import annotations

from pydantic import Field, model_validator

from gateway.config.access import AccessConfig, BudgetsConfig
from gateway.config.base import Section
from gateway.config.connections import McpConfig, SlackConfig, TelegramConfig
from gateway.config.core import (
    DEFAULT_MODEL,
    AdminConfig,
    AgentConfig,
    ApprovalsConfig,
    AttachmentsConfig,
    ContextConfig,
    DatabaseConfig,
    HttpConfig,
    InboxConfig,
    LLMConfig,
    LoggingConfig,
    MemoryConfig,
    OutboxConfig,
    QuestionsConfig,
    RetentionConfig,
    ServeConfig,
    TelemetryConfig,
    TracesConfig,
    VoiceConfig,
)
from gateway.config.scheduler import SchedulerConfig
from gateway.config.skills import SkillsConfig
from gateway.config.web import SearchConfig


class Config(Section):
    database: DatabaseConfig = DatabaseConfig()
    llm: LLMConfig = LLMConfig()
    agent: AgentConfig = AgentConfig()
    context: ContextConfig = ContextConfig()
    traces: TracesConfig = TracesConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    logging: LoggingConfig = LoggingConfig()
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
    search: SearchConfig = SearchConfig()
    memory: MemoryConfig = MemoryConfig()
    skills: SkillsConfig = SkillsConfig()
    voice: VoiceConfig = VoiceConfig()

    source: str = Field("<defaults>", exclude=True)

    @model_validator(mode="after")
    def _job_models(self) -> Config:
        for job in self.scheduler.jobs:
            if job.model and job.model != DEFAULT_MODEL and job.model not in self.llm.models:
                known = ", ".join([DEFAULT_MODEL, *sorted(self.llm.models)])
                raise ValueError(f"scheduler.jobs[{job.name}].model: {job.model!r} is not in llm.models ({known})")
        return self


# Secret key paths and the environment variable each falls back to.
SECRETS: dict[tuple[str, ...], str] = {
    ("llm", "api_key"): "LLM_API_KEY",
    ("llm", "speech_api_key"): "SPEECH_API_KEY",
    ("telegram", "token"): "TELEGRAM_BOT_TOKEN",
    ("telegram", "webhook_secret"): "TELEGRAM_WEBHOOK_SECRET",
    ("slack", "bot_token"): "SLACK_BOT_TOKEN",
    ("slack", "signing_secret"): "SLACK_SIGNING_SECRET",
    ("slack", "app_token"): "SLACK_APP_TOKEN",
    ("admin", "token"): "GATEWAY_ADMIN_TOKEN",
    ("search", "api_key"): "SEARCH_API_KEY",
}
# Plain settings the environment fills in when the file does not set them (or there is no file):
# the variables the README documents work the same with or without a config.yml.
ENV_DEFAULTS: dict[tuple[str, ...], str] = {
    ("llm", "base_url"): "LLM_BASE_URL",
    ("llm", "model"): "LLM_MODEL",
    ("llm", "context_window"): "LLM_CONTEXT_WINDOW",
    ("telemetry", "otlp_endpoint"): "OTEL_EXPORTER_OTLP_ENDPOINT",
}
# Plain settings the environment overrides (handy for containers and tests).
ENV_OVERRIDES: dict[tuple[str, ...], str] = {
    ("database", "url"): "GATEWAY_DATABASE_URL",
}
