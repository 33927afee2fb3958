"""The neutral vocabulary shared by the core and the channels.

Channels translate platform payloads into these events and render these outbound
messages and prompts back. Nothing here knows about a platform, the store or the LLM,
so this module imports nothing from the project (a test enforces it).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, Protocol, runtime_checkable


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, order=True)
class ThreadKey:
    """One conversation: Telegram chat + topic, Slack channel + thread_ts, a DM, a cron run.

    `thread` is "" when the platform has no sub-thread (a private chat, the general topic).
    Keys are written (`str`, `format`) and read (`parse`, `channel_of`) here only.
    """

    channel: str
    chat: str
    thread: str = ""

    def __str__(self) -> str:
        return self.format(self.channel, self.chat, self.thread)

    @staticmethod
    def format(channel: str, chat: str, thread: str = "") -> str:
        return f"{channel}:{chat}:{thread}"

    @staticmethod
    def _parts(text: str) -> tuple[str, str, str]:
        channel, _, rest = text.partition(":")
        chat, _, thread = rest.partition(":")
        return channel, chat, thread

    @classmethod
    def channel_of(cls, text: str) -> str:
        """The channel of a stored key, checked no further (any key a session was opened with)."""
        return cls._parts(text)[0]

    @classmethod
    def parse(cls, text: str) -> ThreadKey:
        channel, chat, thread = cls._parts(text)
        if not channel or not chat:
            raise ValueError(f"not a thread key: {text!r} (expected channel:chat[:thread])")
        return cls(channel, chat, thread)


@dataclass(frozen=True)
class Sender:
    id: str  # platform user id ("123456789", "U012ABCDEF"); "scheduler" for cron runs
    name: str = ""  # display name, shown in "Approved by <name>"
    username: str = ""  # Telegram @username without the @, when known


@dataclass(frozen=True)
class Attachment:
    """A file sent with a message, as the platform describes it (nothing is downloaded yet).

    The channel fetches its bytes with `fetch_file`; the core stores them and tells the model.
    `mime` and `name` are what the sender claims: the core sniffs the content itself."""

    kind: str  # photo | document | audio | voice | video | file
    file_id: str
    name: str = ""
    mime: str = ""
    size: int = 0  # 0 when the platform did not say
    url: str = ""  # where the channel downloads it from, when the platform gives it up front
    width: int = 0
    height: int = 0
    duration: int = 0  # seconds (audio, voice, video)


@dataclass(frozen=True)
class Quoted:
    """Earlier words a message refers to: the message it replies to (or the part of it the
    person quoted), or a thread's messages from before the agent was first mentioned there."""

    who: str  # the author's display name ("" when unknown)
    text: str
    from_bot: bool = False  # the agent's own message
    fragment: bool = False  # only the part the person quoted (Telegram's reply quote)
    relation: Literal["reply", "thread"] = "reply"  # replied to / said earlier in the thread
    who_id: str = ""  # the author's platform id ("" when unknown): their words keep their rights


@dataclass(frozen=True)
class InboundMessage:
    """A message a person (or the scheduler) sent into a thread."""

    thread: ThreadKey
    sender: Sender
    text: str
    event_id: str  # platform-unique, e.g. "tg:<bot>:<update_id>", "slack:<channel>:<ts>"
    received_at: datetime = field(default_factory=utcnow)
    attachments: tuple[Attachment, ...] = ()
    message_id: str = ""  # the platform id of this message (reply anchor, reactions)
    group: str = ""  # an album: parts sharing a group id are taken as one message
    private: bool = False  # a direct message (Telegram private chat, Slack DM), not a group
    kind: Literal["message"] = "message"
    context: tuple[Quoted, ...] = ()  # what it replies to; a thread's earlier messages
    edit_of: str = ""  # an edit of the message with this platform id; `text` is its new text
    # Group chatter not addressed to the agent, kept (never answered) as context for the next
    # addressed message: the newest `context_keep` of its thread are kept. 0: a message to answer.
    context_keep: int = 0
    surroundings: ThreadKey | None = None  # where its unaddressed context is kept, when not its own thread
    # A part of a group's album that does not itself address the agent: answered only with an
    # addressed part of the same album (`group`), dropped when none is.
    album_part: bool = False
    # A Stop pressed on a reply stream (the /stop it amounts to): the platform's id of that stream
    # (a Telegram draft), for the instance running the turn, wherever the press was read.
    stops_stream: str = ""


@dataclass(frozen=True)
class ButtonPress:
    """Someone tapped an inline button. `token` is opaque to the channel."""

    thread: ThreadKey
    sender: Sender
    token: str
    event_id: str
    received_at: datetime = field(default_factory=utcnow)
    message_id: str = ""  # the prompt message that carried the button
    # Pressed in the web console by someone holding the admin token: decides as an admin would.
    # Channels never set it (a platform event cannot claim it).
    operator: bool = False
    kind: Literal["button"] = "button"


@dataclass(frozen=True)
class MessageDeleted:
    """A person deleted one of their messages (Slack `message_deleted`)."""

    thread: ThreadKey
    message_id: str
    event_id: str
    received_at: datetime = field(default_factory=utcnow)
    kind: Literal["deleted"] = "deleted"


@dataclass(frozen=True)
class Reaction:
    """A thumbs up or down put on (or taken off) a message in `thread.chat`: feedback on the
    agent's reply when it is one. The chat is what counts: Telegram does not say the topic."""

    thread: ThreadKey
    sender: Sender
    message_id: str
    event_id: str
    added: tuple[str, ...] = ()  # "up" | "down"
    removed: tuple[str, ...] = ()
    received_at: datetime = field(default_factory=utcnow)
    kind: Literal["reaction"] = "reaction"


InboundEvent = InboundMessage | ButtonPress | MessageDeleted | Reaction


@dataclass(frozen=True)
class SubmitResult:
    """What `submit` did with one event.

    `duplicate` is True when the event id was already stored (a redelivery: no-op).
    For a button press, `answer` is the short text to show the tapper (Telegram
    answerCallbackQuery / Slack ephemeral) and `alert` says whether it is an error
    the tapper must notice (stale, foreign, unknown).
    """

    event_id: str
    duplicate: bool = False
    answer: str = ""
    alert: bool = False


class Submit(Protocol):
    """The core's intake. Returns only after the events (and the cursor) are committed.

    `cursor` is (name, value) progress recorded in the same transaction, e.g. the
    Telegram getUpdates offset, so that confirming to the platform happens only after
    the batch is durable.
    """

    def __call__(
        self,
        events: Sequence[InboundEvent],
        *,
        cursor: tuple[str, str] | None = None,
    ) -> Awaitable[list[SubmitResult]]: ...


@dataclass(frozen=True)
class OutboundFile:
    """A workspace file to send: `photo` shows inline (Telegram sendPhoto), `voice` plays as a
    voice note (Telegram sendVoice; an audio file elsewhere), `document` as a file."""

    path: str  # absolute, already confined to the workspace
    name: str
    mime: str
    kind: Literal["photo", "voice", "document"] = "document"
    caption: str = ""


@dataclass(frozen=True)
class Outbound:
    """A reply to send. `text` is the model's Markdown; the channel renders it."""

    thread: ThreadKey
    text: str
    key: str  # idempotency key, recorded by the outbox
    reply_to: str = ""  # platform message id the reply relates to (Slack reactions, Telegram reply)
    document: tuple[str, str] | None = None  # (file name, content) attached in full
    file: OutboundFile | None = None  # a workspace file (send_file); `text` is then empty
    already: tuple[str, ...] = ()  # parts posted by an earlier attempt: not posted again
    links: tuple[str, ...] = ()  # links (`links_in`) of the person's message this answers: previews may show


@dataclass(frozen=True)
class Button:
    label: str
    token: str  # opaque, <= 64 bytes
    url: str = ""  # a link button: opens this page (no press comes back)
    # what pressing it means, for channels that colour buttons (Approve positive, Deny negative)
    tone: Literal["", "positive", "negative"] = ""


@dataclass(frozen=True)
class Prompt:
    """An approval request or a clarifying question, shown with inline buttons."""

    kind: Literal["approval", "question", "notice"]  # notice: a message with action buttons
    thread: ThreadKey
    key: str  # idempotency key
    text: str  # approval: a one-line summary; question: the question
    buttons: tuple[tuple[Button, ...], ...]  # rows of buttons
    tool_name: str = ""
    arguments: str = ""  # pretty JSON of the call's arguments (approval)
    hint: str = ""  # e.g. "or type your answer"
    # Shown in `thread` (a group) to this person only (a decider's card there); sent only to a
    # channel with `private_prompts` (Telegram's ephemeral messages, Bot API 10.2).
    receiver: str = ""


@dataclass(frozen=True)
class Delivered:
    """Platform message ids of what was sent (one per chunk); `finished_run` when the write
    that recorded it also wrote the run's final stage (see `RunTrace.end_with`)."""

    message_ids: tuple[str, ...]
    finished_run: bool = False


class ChannelError(Exception):
    """A send failed. `retry_after` (seconds) when the platform asked us to wait;
    `permanent` when retrying cannot help (chat not found, bot blocked); `ambiguous` when a
    new message may have been delivered all the same (a timed-out send); `delivered`: the
    messages a multi-part send had already posted before it failed (a retry skips them)."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        permanent: bool = False,
        ambiguous: bool = False,
        delivered: tuple[str, ...] = (),
    ):
        super().__init__(message)
        self.retry_after = retry_after
        self.permanent = permanent
        self.ambiguous = ambiguous
        self.delivered = delivered


class StoreUnwritable(Exception):
    """The gateway's database cannot be written just now (its disk is full, or it went
    read-only): nothing of the call was stored. A channel does not acknowledge what it was
    submitting (the platform delivers it again) and need not log it: the store has said why, in
    one line, and /readyz says so until a write succeeds again."""


# What failed, for the command line's exit code (gateway/cli/toplevel.py, docs/operations.md).
FailureKind = Literal[
    "database_url", "database_unreachable", "database_missing", "database_login", "database_schema",
    "http_bind", "token_rejected", "platform_unreachable", "channel_settings", "path", "backup", "migration",
]


class OperatorError(Exception):
    """A failure the operator causes and fixes (a setting, a server that is down, a port in use),
    worded as one line: what happened, the setting (and its environment variable), what to do."""

    def __init__(self, line: str, *, kind: FailureKind):
        super().__init__(line)
        self.kind = kind


class ChannelStartError(OperatorError, ChannelError):
    """A channel cannot start: its token was rejected, its platform cannot be reached, or its
    settings are incomplete. Retrying does not help; the operator does."""

    def __init__(self, line: str, *, kind: FailureKind):
        ChannelError.__init__(self, line, permanent=True)
        self.kind = kind


class FileTooLarge(ChannelError):
    """The platform will not hand this file over (or it is larger than we accept)."""

    def __init__(self, message: str, *, size: int = 0):
        super().__init__(message, permanent=True)
        self.size = size


@dataclass(frozen=True)
class Fetched:
    """A downloaded file; `name` and `mime` when the platform told more than the event did."""

    data: bytes
    name: str = ""
    mime: str = ""


class FetchFile(Protocol):
    """What a channel offers to download an attachment: the file, or ChannelError
    (FileTooLarge when it is over `max_bytes`; `permanent` when retrying cannot help)."""

    async def __call__(self, attachment: Attachment, max_bytes: int) -> Fetched: ...


@runtime_checkable
class ReplyStream(Protocol):
    """A reply being generated: shown progressively where the channel can.

    A stream may also have `wants_update() -> bool` (False when an update now would not be
    shown: paced, or nothing is shown before the end), so callers need not build the text,
    and `note(text)` (the newest text, kept without showing it, for `abort` to show)."""

    async def update(self, text: str) -> None:
        """The whole text so far (not a delta). Channels pace updates as they need."""

    async def finish(self, text: str) -> Delivered:
        """The final text; returns the ids of the messages that now hold it."""

    async def abort(self) -> None:
        """Stop showing progress (the turn parked, failed or was cancelled)."""

    def message_ids(self) -> tuple[str, ...]:
        """The platform messages now showing the partial reply (none for drafts)."""


@runtime_checkable
class Channel(Protocol):
    """A platform adapter. It may also have `show_tool_progress = True` to get a short
    "🔧 tool args" line before each tool runs, `typed_buttons = True` when a button is
    chosen by typing its number (the terminal: the core's notices then say what to type,
    not what to tap), `fetch_file` (a `FetchFile`) when its messages can carry attachments,
    and `share_rate_limits(instances: int)` when the platform's limits are the bot's as a
    whole (told how many instances send for it), and `show_task(thread, task_id, title,
    status, details)` to show a tool call as a task card while it runs (status `in_progress`,
    then `complete` or `error`; `pending` while it waits for an answer), and
    `private_prompts = True` when it can show a prompt in a group to one person only
    (`Prompt.receiver`): a decider's card that the rest of the group does not see."""

    name: str  # "telegram", "slack", "console"

    async def start(self, submit: Submit) -> None:
        """Begin receiving (polling / socket / webhook routes are ready)."""

    async def stop(self) -> None: ...

    async def send(self, message: Outbound) -> Delivered: ...

    async def send_prompt(self, prompt: Prompt) -> Delivered: ...

    async def close_prompt(self, thread: ThreadKey, message_ids: Sequence[str], outcome: str) -> None:
        """Remove the buttons of a decided prompt and show `outcome` (e.g. "✅ Approved by Ann")."""

    def open_stream(
        self, thread: ThreadKey, reply_to: str = "", adopt: Sequence[str] = (), links: Sequence[str] = ()
    ) -> ReplyStream:
        """`adopt`: messages of a reply interrupted by a restart, which this stream edits into
        the new reply instead of posting beside them; `links`: as `Outbound.links`."""

    async def set_busy(self, thread: ThreadKey, busy: bool, reply_to: str = "") -> None:
        """Presence while a turn runs (typing, a status line or a reaction)."""


ProgressCallback = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class TurnEnded:
    """Told to listeners (the scheduler) when a turn ends or parks."""

    thread: ThreadKey
    session_id: int
    run_id: int
    stage: str  # SUCCESS | FAILED | CANCELED | AWAITING_INPUT
    end_reason: (
        str  # reply | max_rounds | overflow | repetition | tool_loop | canceled | error | budget | awaiting_input
    )
    reply: str  # the final assistant text ("" when none)
    auto_denied: tuple[str, ...] = ()  # "tool(args)" summaries of calls auto-denied in a headless run
    error: str = ""
    tokens: int = 0
    cost_nano_usd: int | None = None


class ChannelState(Protocol):
    """The little durable state a channel may keep, provided by the core.

    Channels never touch the store; they get this instead.
    """

    async def load_cursor(self, name: str) -> str | None:
        """Progress committed by `submit(..., cursor=(name, value))`, e.g. the getUpdates offset."""

    async def bump_counter(self, name: str) -> int:
        """Increment a named counter and return its new value (e.g. refusals per chat per day)."""

    async def knows_thread(self, thread: ThreadKey) -> bool:
        """True when the agent already has a session in this thread (Slack thread follow-ups)."""

    async def chat_choice(self, chat: str, name: str) -> bool | None:
        """What `chat` ("<channel>:<chat id>") chose with a command (`rich`: `/rich on|off`);
        None when it never chose (the channel's configured default applies)."""


# Link previews: a platform that previews a link fetches it, so a link the model wrote can
# carry data out (in its URL) without any tool call. Generous on purpose (bare domains too,
# as the platforms auto-link them): a false match only turns a preview off.
_LINK = re.compile(
    r"(?i)\b(?:[a-z][a-z0-9+.-]*://[^\s<>|\"'`]+|(?:[a-z0-9-]+\.)+[a-z][a-z0-9-]+(?::\d+)?(?:/[^\s<>|\"'`]*)?)"
)


def normal_link(link: str) -> str:
    """A link as it is compared: no scheme, no trailing punctuation or slash, case-folded host."""
    link = link.strip().rstrip(".,;:!?)]}*_~'\"").rstrip("/")
    link = re.sub(r"(?i)^[a-z][a-z0-9+.-]*://", "", link)
    host, slash, rest = link.partition("/")
    return host.lower() + slash + rest


def links_in(text: str) -> tuple[str, ...]:
    """The links of a text, normalised (`normal_link`), in order, without repeats."""
    return tuple(dict.fromkeys(normal_link(m.group(0)) for m in _LINK.finditer(text or "")))


LinkPreviews = Literal["own", "all", "none"]


def previews_allowed(policy: str, text: str, own: Collection[str], extra: Sequence[str] = ()) -> bool:
    """Whether a message may show link previews: `all` always, `none` never, `own` only when
    every link in it (in `text`, or `extra`: links hidden behind labels) was in the person's
    own message."""
    if policy == "all":
        return True
    if policy != "own":
        return False
    found = set(links_in(text)) | {normal_link(link) for link in extra}
    return bool(found) and found <= set(own)
