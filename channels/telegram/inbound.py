"""Telegram updates -> neutral events.

Decides, for one update, whether it becomes an event, a refusal (a user who is not
allowed, in a private chat), a callback answer without an event, or nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from telegram import (
    CallbackQuery,
    Chat,
    Message,
    MessageEntity,
    MessageReactionUpdated,
    ReactionTypeEmoji,
    Update,
    User,
)

from gateway.config import TelegramConfig
from gateway.events import (
    Attachment,
    ButtonPress,
    InboundEvent,
    InboundMessage,
    Quoted,
    Reaction,
    Sender,
    ThreadKey,
)

# message_reaction is sent only when asked for (and, in groups, only to an administrator bot).
# stopped_message_generation (Bot API 10.3): Stop pressed on a draft sent with can_stop.
ALLOWED_UPDATES = [
    "message", "edited_message", "callback_query", "my_chat_member", "message_reaction", "stopped_message_generation"
]
FEEDBACK = {"👍": "up", "👎": "down"}
QUOTED_MAX = 2000  # characters of a replied-to message carried with the event (the core clips further)
NOT_ALLOWED_ALERT = "You are not allowed to use this bot."


@dataclass(frozen=True)
class Reading:
    """What one update amounts to."""

    kind: Literal["event", "refuse", "answer", "ignore"]
    update_id: int
    event: InboundEvent | None = None
    callback_id: str = ""  # a callback query to answer (after submit for "event")
    chat_id: int = 0  # "refuse": the private chat to refuse
    day: str = ""  # "refuse": the UTC day the refusal is counted in
    text: str = ""  # "answer": the alert text; "ignore": why
    user_id: str = ""
    draft_id: int = 0  # a Stop pressed on this draft (the event is the /stop it amounts to)


@dataclass(frozen=True)
class BotIdentity:
    id: int
    username: str


class UpdateReader:
    def __init__(
        self, config: TelegramConfig, bot: BotIdentity, *, max_download_bytes: int = 0, pair_unlisted: bool = False
    ) -> None:
        self._config = config
        # an explicit `access.dm_policy`: private chats of people not listed go to the core's check
        self._pair_unlisted = pair_unlisted
        self._bot = bot
        self._max_download = max_download_bytes or BOT_API_DOWNLOAD_LIMIT
        self._user_ids = {u for u in config.allowed_users if not u.startswith("@")}
        self._usernames = {u[1:].lower() for u in config.allowed_users if u.startswith("@")}
        self._chats = set(config.allowed_chats)
        name = re.escape(bot.username)
        self._leading_mention = re.compile(rf"^\s*@{name}\b[\s,:;.!-]*", re.IGNORECASE)
        self._command_suffix = re.compile(rf"^(/\w+)@{name}\b", re.IGNORECASE)

    def event_id(self, update_id: int) -> str:
        return f"tg:{self._bot.id}:{update_id}"

    def read(self, update: Update) -> Reading:
        if update.callback_query is not None:
            return self._read_callback(update.update_id, update.callback_query)
        if update.message is not None:
            return self._read_message(update.update_id, update.message, edited=False)
        if update.edited_message is not None:
            return self._read_message(update.update_id, update.edited_message, edited=True)
        if update.message_reaction is not None:
            return self._read_reaction(update.update_id, update.message_reaction)
        if update.channel_post is not None or update.edited_channel_post is not None:
            return Reading("ignore", update.update_id, text="channel post (channels are not read)")
        if update.my_chat_member is not None:
            return Reading("ignore", update.update_id, text="membership change")
        stopped = update.api_kwargs.get("stopped_message_generation")  # newer than the library
        if stopped is not None:
            return self._read_stop(update.update_id, stopped)
        return Reading("ignore", update.update_id, text=f"{kind_of(update)} (not read by the gateway)")

    # --- access ------------------------------------------------------------------

    def allowed(self, user: User, chat: Chat) -> bool:
        """Allowed when no list is set, the sender is listed, or the chat is listed."""
        if not self._user_ids and not self._usernames and not self._chats:
            return True
        if self._pair_unlisted and chat.type == Chat.PRIVATE:
            return True
        if str(user.id) in self._user_ids or str(chat.id) in self._chats:
            return True
        return user.username is not None and user.username.lower() in self._usernames

    # --- messages ----------------------------------------------------------------

    def _read_message(self, update_id: int, message: Message, *, edited: bool) -> Reading:
        user = message.from_user
        if user is None or user.is_bot or message.sender_chat is not None:
            return Reading("ignore", update_id, text="not from a person")
        if not self.allowed(user, message.chat):
            if message.chat.type != Chat.PRIVATE:
                return Reading("ignore", update_id, text="not allowed (group)", user_id=str(user.id))
            day = message.date.date().isoformat()
            return Reading("refuse", update_id, chat_id=message.chat.id, day=day, user_id=str(user.id))
        keep, album_part = 0, False
        if not self._addressed(message):
            # A part of an album: the caption (and so the mention) is on one part only; the
            # others belong to it when that part is addressed (the core decides, album whole).
            album_part = bool(message.media_group_id) and not edited
            keep = 0 if album_part else self._config.group_context  # kept as context for the next addressed one
            if not keep and not album_part:
                return Reading("ignore", update_id, text="not addressed to the bot")
        text, attachments = self._content(message)
        if keep:
            attachments = ()  # chatter is kept as words only
        if not text and not attachments:
            return Reading("ignore", update_id, text="nothing to read")
        event = InboundMessage(
            thread=thread_of(message),
            sender=sender_of(user),
            text=text,
            event_id=self.event_id(update_id),
            attachments=attachments,
            message_id=str(message.message_id),
            group=f"{message.chat.id}:{message.media_group_id}" if message.media_group_id else "",
            private=message.chat.type == Chat.PRIVATE,
            context=() if keep else self._quoted(message),
            edit_of=str(message.message_id) if edited else "",
            context_keep=keep,
            album_part=album_part,
        )
        return Reading("event", update_id, event=event)

    def _quoted(self, message: Message) -> tuple[Quoted, ...]:
        """What the message replies to: the part the person quoted, else the whole message."""
        reply = message.reply_to_message
        if reply is None or reply.forum_topic_created is not None:  # a topic's first message: no reply
            return ()
        author = reply.from_user
        who = author.full_name if author is not None else (reply.sender_chat.title or "" if reply.sender_chat else "")
        from_bot = author is not None and author.id == self._bot.id
        who_id = str(author.id) if author is not None else ""  # a channel's post: nobody known
        if message.quote is not None and message.quote.text:
            return (Quoted(who, message.quote.text[:QUOTED_MAX], from_bot=from_bot, fragment=True, who_id=who_id),)
        text = reply.text or reply.caption or ("[a file]" if attachments_of(reply) else "")
        return (Quoted(who, text[:QUOTED_MAX], from_bot=from_bot, who_id=who_id),) if text else ()

    def _read_reaction(self, update_id: int, changed: MessageReactionUpdated) -> Reading:
        """A thumbs up or down put on or taken off a message: feedback when it is a reply of ours."""
        user = changed.user
        if user is None or user.is_bot:
            return Reading("ignore", update_id, text="an anonymous reaction")
        if not self.allowed(user, changed.chat):
            return Reading("ignore", update_id, text="a reaction by someone not allowed", user_id=str(user.id))
        old, new = _thumbs(changed.old_reaction), _thumbs(changed.new_reaction)
        added, removed = tuple(sorted(new - old)), tuple(sorted(old - new))
        if not added and not removed:
            return Reading("ignore", update_id, text="a reaction that is not a thumbs up or down")
        event = Reaction(
            thread=private_or_group(changed.chat),
            sender=sender_of(user),
            message_id=str(changed.message_id),
            event_id=self.event_id(update_id),
            added=added,
            removed=removed,
        )
        return Reading("event", update_id, event=event)

    def _addressed(self, message: Message) -> bool:
        """Private chats always; groups per `group_trigger`; never commands for another bot."""
        if message.chat.type == Chat.PRIVATE:
            return True
        found = self._entities(message)
        for entity, value in found:
            if entity.type == MessageEntity.BOT_COMMAND and entity.offset == 0 and "@" in value:
                if value.partition("@")[2].lower() != self._bot.username.lower():
                    return False
        if self._config.group_trigger == "all" or self._replies_to_bot(message):
            return True
        return any(self._names_bot(entity, value) for entity, value in found)

    def _names_bot(self, entity: MessageEntity, value: str) -> bool:
        if entity.type == MessageEntity.MENTION:
            return value.lower() == f"@{self._bot.username.lower()}"
        if entity.type == MessageEntity.TEXT_MENTION:
            return entity.user is not None and entity.user.id == self._bot.id
        return entity.type == MessageEntity.BOT_COMMAND and entity.offset == 0

    def _replies_to_bot(self, message: Message) -> bool:
        reply = message.reply_to_message
        # In forums every topic message "replies" to the topic's first message: not a reply.
        if reply is None or reply.forum_topic_created is not None:
            return False
        return reply.from_user is not None and reply.from_user.id == self._bot.id

    @staticmethod
    def _entities(message: Message) -> list[tuple[MessageEntity, str]]:
        if message.text is not None:
            return list(message.parse_entities().items())
        return list(message.parse_caption_entities().items())

    def _content(self, message: Message) -> tuple[str, tuple[Attachment, ...]]:
        text = message.text or message.caption or ""
        text = self._leading_mention.sub("", text, count=1)
        text = self._command_suffix.sub(r"\1", text, count=1).strip()
        if message.sticker is not None:  # a sticker says what its emoji says
            text = "\n".join(part for part in (text, message.sticker.emoji or "[a sticker]") if part)
        return text, attachments_of(message, self._max_download)

    # --- Stop pressed on a draft ------------------------------------------------------

    def _read_stop(self, update_id: int, stopped: object) -> Reading:
        """MessageGenerationStopped (Bot API 10.3: chat, message_thread_id, draft_id): the /stop
        of the private chat's person, in the chat's topic when it has one. Drafts are only
        shown in private chats, so the person is the chat (its id is theirs)."""
        if not isinstance(stopped, dict):
            return Reading("ignore", update_id, text="stopped_message_generation without its fields")
        chat, draft_id, topic = stopped.get("chat"), stopped.get("draft_id"), stopped.get("message_thread_id")
        if not isinstance(chat, dict) or chat.get("type") != Chat.PRIVATE or not isinstance(chat.get("id"), int):
            return Reading("ignore", update_id, text="stopped_message_generation outside a private chat")
        if not isinstance(draft_id, int) or (topic is not None and not isinstance(topic, int)):
            return Reading("ignore", update_id, text="stopped_message_generation without a draft id")
        person = User(chat["id"], str(chat.get("first_name") or ""), False,
                      last_name=chat.get("last_name"), username=chat.get("username"))
        if not self.allowed(person, Chat(chat["id"], Chat.PRIVATE)):
            return Reading("ignore", update_id, text="a stop by someone not allowed", user_id=str(person.id))
        event = InboundMessage(
            thread=ThreadKey("telegram", str(chat["id"]), str(topic) if topic else ""),
            sender=sender_of(person),
            text="/stop",
            event_id=self.event_id(update_id),
            private=True,
            stops_stream=str(draft_id),
        )
        return Reading("event", update_id, event=event, draft_id=draft_id)

    # --- callbacks ---------------------------------------------------------------

    def _read_callback(self, update_id: int, query: CallbackQuery) -> Reading:
        message = query.message
        if message is None and query.inline_message_id and query.data:
            return self._read_inline_callback(update_id, query)
        if message is None:
            return Reading("answer", update_id, callback_id=query.id, text="This button has expired.")
        if not self.allowed(query.from_user, message.chat):
            return Reading(
                "answer", update_id, callback_id=query.id, text=NOT_ALLOWED_ALERT, user_id=str(query.from_user.id)
            )
        if not query.data:
            return Reading("answer", update_id, callback_id=query.id, text="")
        thread = thread_of(message) if isinstance(message, Message) else private_or_group(message.chat)
        event = ButtonPress(
            thread=thread,
            sender=sender_of(query.from_user),
            token=query.data,
            event_id=self.event_id(update_id),
            message_id=str(message.message_id),
        )
        return Reading("event", update_id, event=event, callback_id=query.id)

    def _read_inline_callback(self, update_id: int, query: CallbackQuery) -> Reading:
        """A tap that names its message by `inline_message_id` instead of carrying it (Bot API
        10.5 `callback_query_mode`): the chat is unknown here, so the core finds the thread by
        the button's token (`UNKNOWN_CHAT`). Only `allowed_users` can admit such a tap: with
        `allowed_chats` alone it is refused (fail closed)."""
        user = query.from_user
        listed = not self._user_ids and not self._usernames and not self._chats
        listed = listed or self._pair_unlisted or str(user.id) in self._user_ids
        listed = listed or (user.username is not None and user.username.lower() in self._usernames)
        if not listed:
            return Reading("answer", update_id, callback_id=query.id, text=NOT_ALLOWED_ALERT, user_id=str(user.id))
        event = ButtonPress(
            thread=UNKNOWN_CHAT,
            sender=sender_of(user),
            token=query.data or "",
            event_id=self.event_id(update_id),
        )
        return Reading("event", update_id, event=event, callback_id=query.id)


# A button press whose chat Telegram did not say: the core finds its prompt's thread by the token.
UNKNOWN_CHAT = ThreadKey("telegram", "", "")


def kind_of(update: Update) -> str:
    """The update's kind (its one field besides update_id), known to the library or not."""
    fields = update.to_dict(recursive=False)  # api_kwargs (fields the library does not know) included
    kinds = [k for k, v in fields.items() if k != "update_id" and v is not None]
    return kinds[0] if kinds else "an empty update"


def _thumbs(reactions: object) -> set[str]:
    found = set()
    for reaction in reactions or ():  # type: ignore[attr-defined]
        if isinstance(reaction, ReactionTypeEmoji) and reaction.emoji in FEEDBACK:
            found.add(FEEDBACK[reaction.emoji])
    return found


def private_or_group(chat: Chat) -> ThreadKey:
    return ThreadKey("telegram", str(chat.id), "")


def thread_of(message: Message) -> ThreadKey:
    """A topic -> (chat, topic id): a forum's, or a private chat's (Bot API 9.3, a bot with
    topics enabled); other chats -> (chat, ""). Outside topics a group reply may carry a
    message_thread_id too: only `is_topic_message` makes it a topic."""
    if message.is_topic_message and message.message_thread_id:
        return ThreadKey("telegram", str(message.chat.id), str(message.message_thread_id))
    return private_or_group(message.chat)


def sender_of(user: User) -> Sender:
    return Sender(id=str(user.id), name=user.full_name, username=user.username or "")


# The cloud Bot API hands out files up to 20 MB (getFile); larger ones cannot be downloaded.
BOT_API_DOWNLOAD_LIMIT = 20 * 1024 * 1024


def attachments_of(message: Message, max_bytes: int = BOT_API_DOWNLOAD_LIMIT) -> tuple[Attachment, ...]:
    """The files of a message, as Telegram describes them (downloaded later, by the core). Of a
    photo's sizes, the largest that can be downloaded under `max_bytes` (else the largest: the
    core says why it was not downloaded)."""
    found: list[Attachment] = []
    if message.photo:
        fitting = [p for p in message.photo if (p.file_size or 0) <= max_bytes]
        best = max(fitting or message.photo, key=lambda p: (p.width * p.height, p.file_size or 0))
        found.append(
            Attachment(
                "photo", best.file_id, mime="image/jpeg", size=best.file_size or 0, width=best.width, height=best.height
            )
        )
    media = (
        ("document", message.document),
        ("audio", message.audio),
        ("voice", message.voice),
        ("video", message.video),
        ("video_note", message.video_note),
    )
    for kind, item in media:
        if item is not None:
            found.append(
                Attachment(
                    kind,
                    item.file_id,
                    name=getattr(item, "file_name", None) or "",
                    mime=getattr(item, "mime_type", None) or "",
                    size=item.file_size or 0,
                    width=getattr(item, "width", 0) or getattr(item, "length", 0) or 0,
                    height=getattr(item, "height", 0) or getattr(item, "length", 0) or 0,
                    duration=_seconds(getattr(item, "duration", 0)),
                )
            )
    return tuple(found)


def _seconds(value: object) -> int:
    """PTB gives durations as int seconds or timedelta, depending on its settings."""
    total = getattr(value, "total_seconds", None)
    return int(total()) if callable(total) else int(value or 0)  # type: ignore[call-overload]
