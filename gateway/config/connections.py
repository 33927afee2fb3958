"""The settings of what the gateway connects to: MCP tool servers, Telegram, Slack."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from gateway.config.base import Section, parse_duration

_SERVER_NAME = re.compile(r"^[A-Za-z0-9-]{1,24}$")


class McpServerConfig(Section):
    """One MCP server: `command` (stdio, a subprocess) or `url` (Streamable HTTP, or SSE)."""

    command: list[str] = []  # the program and its arguments; or one program as a string, with `args`
    args: list[str] = []  # appended to `command` (the `command` + `args` shape of Claude Desktop's mcpServers)
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
    sampling_max_tokens: int = Field(1000, ge=1)  # a sampling request's max_tokens is clamped to this
    sampling_per_call: int = Field(3, ge=1)  # sampling requests answered in one tool call; one more ends the call
    description_chars: int = Field(300, ge=0)  # tool descriptions are cut to this, so the prompt stays small
    enabled: bool = True
    # oauth: a remote server behind OAuth (`gateway mcp login <name>` signs in; the tokens are kept
    # in the database, encrypted with GATEWAY_SECRET_KEY); the redirect goes to this loopback address
    auth: Literal["none", "oauth"] = "none"
    oauth_redirect: str = "http://127.0.0.1:33418/callback"
    oauth_scope: str = ""

    _duration = field_validator("timeout_s", "connect_timeout_s", mode="before")(lambda cls, v: parse_duration(v))

    @field_validator("command", mode="before")
    @classmethod
    def _program(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return _strings(value)
        if value.strip() != value or (" " in value and shutil.which(value) is None and not Path(value).exists()):
            raise ValueError(
                f"{value!r}: a string command is one program; put its arguments in args "
                "(e.g. command: uvx, args: [mcp-server-time]), or give command as a list"
            )
        return [value] if value else []

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if self.args:  # validated again (a copy, a reload) it must not append them twice
            if not self.command:
                raise ValueError("args are the arguments of command: give command too")
            self.command, self.args = [*self.command, *self.args], []
        if bool(self.command) == bool(self.url):
            raise ValueError("give either command (a stdio server) or url (an HTTP server), not both or neither")
        if self.auth == "oauth" and not self.url:
            raise ValueError("auth: oauth is for a server with a url")
        return self


class McpConfig(Section):
    model_config = ConfigDict(extra="forbid", validate_default=True, populate_by_name=True)

    servers: dict[str, McpServerConfig] = {}
    # JSON files of `mcpServers` (Claude Desktop, Cursor) read into `servers` (gateway/config/mcp_import.py)
    import_files: str | list[str] = Field("", alias="import")
    restart_initial_s: float = Field(1.0, gt=0)  # first wait before restarting a failed server; doubles
    restart_max_s: float = Field(60.0, gt=0)
    restart_reset_s: float = Field(60.0, gt=0)  # a connection up this long starts the restart backoff afresh
    health_interval_s: float = Field(15.0, gt=0)  # a running server's tools are listed again this often

    _duration = field_validator(
        "restart_initial_s", "restart_max_s", "restart_reset_s", "health_interval_s", mode="before"
    )(lambda cls, v: parse_duration(v))

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


def _switch(value: Any) -> Any:
    """YAML reads a bare `off` / `on` as false / true: the words they were."""
    return {False: "off", True: "on"}.get(value, value) if isinstance(value, bool) else value


class TelegramConfig(Section):
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
    process_edited: bool = False  # no longer read: edits are handled by inbox.on_edit
    # Keep the newest N messages of an admitted group not addressed to the bot (it sees them
    # only with privacy mode off) and give them to the next addressed turn as context. 0: off.
    group_context: int = Field(0, ge=0, le=200)
    poll_timeout_s: int = 30
    edit_interval_s: float = 1.0  # streaming edits/drafts: at most one per chat per interval
    typing_after_s: float = Field(1.0, ge=0)  # "typing…" from this long into a turn (a quicker reply needs none)
    rate_overall_per_s: float = 30.0  # sends per second for the whole bot (0 = no pacing)
    rate_private_per_s: float = 1.0  # sends per second per private chat (bursts of 3)
    rate_group_per_min: float = 20.0  # sends per minute per group
    request_timeout_s: float = Field(10.0, gt=0)  # a send unanswered this long may still have been delivered
    # Link previews fetch the link: "own" shows them only for links the person sent (docs/security.md).
    link_previews: Literal["own", "all", "none"] = "own"
    # Drafts carry Telegram's Stop button (Bot API 10.3), which stops the turn as /stop does:
    # "keep" posts what was generated so far as a message, "discard" lets it vanish, "off": no button.
    stop_button: Literal["keep", "discard", "off"] = "keep"
    # Rich messages (Bot API 10.1): a long reply, or one with a table or headings, as one rich
    # message; refused ones go as plain messages. Off by default: Telegram Web does not show them.
    # The default of a chat that never chose: `/rich on|off` chooses per chat.
    rich_messages: Literal["off", "on"] = "off"
    # An approval asked in a group: "shared" posts its card there (taps by those who may not decide
    # are refused); "private" shows the group that it waits and each decider a card only they see
    # there (ephemeral messages, Bot API 10.2), besides the DM copy. Ephemeral delivery is not
    # guaranteed to someone offline: with no decider reached, the card is posted as "shared".
    group_approvals: Literal["shared", "private"] = "shared"
    # `/new` in a private chat opens a new topic for the new conversation (the old one stays, to
    # go back to), where the bot has topics in private chats (Bot API 9.4, BotFather's Threaded Mode).
    new_topic_per_conversation: bool = False

    _ids = field_validator("allowed_users", "allowed_chats", mode="before")(lambda cls, v: _strings(v))
    _switches = field_validator("streaming", "stop_button", "rich_messages", mode="before")(
        lambda cls, v: _switch(v)
    )

    @property
    def enabled(self) -> bool:
        return bool(self.token)


class SuggestedPrompt(Section):
    """A prompt Slack offers when a person opens the conversation with the agent."""

    title: str = Field(min_length=1, max_length=75)  # what the button says (Slack's limit is not documented)
    message: str = Field(min_length=1, max_length=2000)  # what is sent when it is picked


class SlackConfig(Section):
    bot_token: str = ""
    signing_secret: str = ""
    app_token: str = ""
    api_base_url: str = "https://slack.com/api/"
    allowed_users: list[str] = []
    allowed_channels: list[str] = []
    thread_followups: bool = True
    # Keep the newest N top-level messages of a channel not addressed to the bot and give them
    # to the next mention there as context (needs the message.channels event). 0: off.
    channel_context: int = Field(0, ge=0, le=200)
    streaming: Literal["auto", "native", "edit", "off"] = "auto"
    send_interval_s: float = Field(1.0, ge=0)  # per-channel pacing of posts (Slack: ~1 message/s)
    stream_interval_s: float = Field(1.0, ge=0)  # at most one streamed append / edit per interval
    # Unfurls fetch the link: "own" unfurls only links the person sent (docs/security.md).
    link_previews: Literal["own", "all", "none"] = "own"
    # Tool calls as task cards in the native stream (chat.startStream task_display_mode): each
    # its own card ("timeline"), together in one plan block ("plan"), or none ("off").
    task_cards: Literal["timeline", "plan", "off"] = "timeline"
    # 👍 / 👎 feedback buttons (context_actions) under answers streamed natively.
    feedback_buttons: bool = True
    # "agent": the app uses the agent messaging experience (features.agent_view, apps created
    # since the 2026 change): each top-level DM message starts its own thread (and session).
    # "assistant": the assistant view or none (older apps): a DM is one session until threaded.
    app_view: Literal["assistant", "agent"] = "assistant"
    # Up to four prompts offered when a person opens the conversation (assistant.threads.setSuggestedPrompts).
    suggested_prompts: list[SuggestedPrompt] = Field([], max_length=4)
    suggested_prompts_title: str = ""

    _ids = field_validator("allowed_users", "allowed_channels", mode="before")(lambda cls, v: _strings(v))
    _switches = field_validator("streaming", "task_cards", mode="before")(lambda cls, v: _switch(v))

    @property
    def enabled(self) -> bool:
        return bool(self.bot_token)
