"""A fake Telegram Bot API: a real aiohttp server on 127.0.0.1 that PTB talks to.

    async with FakeTelegram() as fake:
        bot = ExtBot(fake.token, base_url=fake.base_url)   # f"{fake.url}/bot"
        fake.private_message(42, "hello")                  # queue an update
        ...
        fake.calls_to("sendMessage")                       # what the bot sent

Requests may be form-encoded (what PTB sends, with objects JSON-encoded in fields),
multipart (uploads) or JSON. getUpdates long-polls and confirms by offset like Telegram;
a second concurrent getUpdates terminates the first with 409, and getUpdates while a
webhook is set answers 409. `fail_next(method, kind)` injects one failure ("timeout": the
call is carried out, then answered only after `timeout_delay_s`, as when Telegram delivered a
message but the reply never reached the client); `random_faults(...)` injects them at rates
(off unless called). `hold_polls()`
makes getUpdates calls hang unanswered and unapplied (as if they never reached Telegram), to
stand for a gateway that dies between storing a batch and confirming it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any, Literal

from aiohttp import web

from fakes.audio import audio_kind, opus_seconds
from fakes.telegram_files import FakeFiles

BOT_ID = 7000001
BOT_USERNAME = "test_bot"
NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup "
    "are exactly the same as a current content and reply markup of the message"
)
Fault = Literal["429", "parse", "409", "500", "not_modified", "timeout"]
# What a flood wait holds back: the calls that post to or change a chat.
FLOOD_METHODS = frozenset(
    {"sendMessage", "editMessageText", "sendMessageDraft", "sendPhoto", "sendDocument", "deleteMessage",
     "sendRichMessage", "sendRichMessageDraft", "sendVoice"}
)
_OBJECT_FIELDS = {
    "entities",
    "caption_entities",
    "reply_markup",
    "reply_parameters",
    "allowed_updates",
    "link_preview_options",
    "rich_message",
    "ephemeral_message_parameters",
}


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    at: float  # time.monotonic() when the request arrived


@dataclass
class StoredMessage:
    message_id: int
    chat_id: int
    text: str = ""
    entities: list[dict[str, Any]] = field(default_factory=list)
    reply_markup: dict[str, Any] | None = None
    thread_id: int | None = None
    document: dict[str, Any] | None = None
    caption: str = ""
    reply_to: int | None = None
    from_bot: bool = True
    sender: dict[str, Any] | None = None  # a person's message: its `from`, as a reply to it shows it
    rich: dict[str, Any] | None = None  # a rich message's InputRichMessage (Bot API 10.1)
    receiver: int | None = None  # an ephemeral message (Bot API 10.2): the one person who sees it
    ephemeral_id: int | None = None

    @property
    def buttons(self) -> list[list[dict[str, Any]]]:
        return (self.reply_markup or {}).get("inline_keyboard", [])


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _auto_entities(text: str) -> list[dict[str, Any]]:
    """Mentions and commands, as the real server detects them (UTF-16 offsets)."""
    found = []
    for match in re.finditer(r"(?<!\w)@\w{3,}|^/\w+(?:@\w+)?", text):
        kind = "mention" if match.group().startswith("@") else "bot_command"
        offset = utf16_len(text[: match.start()])
        found.append({"type": kind, "offset": offset, "length": utf16_len(match.group())})
    return found


class FakeTelegram:
    def __init__(self, token: str = "123456:TEST-token") -> None:
        self.token = token
        self.calls: list[Call] = []
        self.messages: dict[int, dict[int, StoredMessage]] = {}
        self.drafts: dict[int, list[str]] = {}
        self.chat_types: dict[int, str] = {}
        self.webhook: dict[str, Any] = {}
        self._updates: list[dict[str, Any]] = []
        self._update_ids = itertools.count(1000)
        self._message_ids: dict[int, itertools.count[int]] = {}
        self._faults: dict[str, list[list[Any]]] = {}  # method -> [kind, retry_after, calls to let through first]
        self._random: _RandomFaults | None = None
        self.timeout_delay_s = 3.0
        # (method, kind, retry_after, params) of every fault served
        self.injected: list[tuple[str, Fault, int, dict[str, Any]]] = []
        # Flood waits as Telegram keeps them (`keep_flood_waits()`): a chat answered 429 with
        # retry_after N refuses what changes it for N seconds; each such call is recorded.
        self._flood_until: dict[str, float] | None = None
        self._flood_since: dict[str, float] = {}  # chat -> when the 429 that holds it was served
        # (method, chat, seconds too early, seconds after the 429 that began the hold)
        self.flood_violations: list[tuple[str, str, float, float]] = []
        self._new_update = asyncio.Event()
        self._poll_generation = 0
        self._polls_open = asyncio.Event()
        self._polls_open.set()
        self.held_polls: list[dict[str, Any]] = []  # params of the getUpdates calls held
        self.conflicts = 0  # long polls ended by a concurrent getUpdates (two pollers)
        self._polls_before_hold: int | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.files = FakeFiles(token)
        self.bot_settings: dict[str, Any] = {}  # getMe fields to add or override
        self.inline_ids: dict[str, tuple[int, int]] = {}  # inline_message_id -> (chat, message)
        self.draft_params: list[dict[str, Any]] = []  # every sendMessageDraft's parameters
        self.refuse_rich = ""  # a reason: sendRichMessage answers 400 with it (a server or content it refuses)
        self.voice_forbidden: set[int] = set()  # chats of people who do not take voice notes (a privacy setting)
        self.rich_drafts: list[dict[str, Any]] = []  # every sendRichMessageDraft's parameters
        # Ephemeral messages (Bot API 10.2), apart from what the chat shows: chat -> id -> message
        self.ephemeral: dict[int, dict[int, StoredMessage]] = {}
        self.non_members: set[int] = set()  # people an ephemeral message cannot reach (not in the group)
        self.never_started: set[int] = set()  # people who never opened a DM with the bot: sends there get 403
        self.topics: dict[int, dict[int, str]] = {}  # topics created by the bot: chat -> thread id -> name
        self.before_ephemeral = False  # a server older than 10.3: ephemeral_message_parameters is ignored

    # --- lifecycle ---------------------------------------------------------------

    async def __aenter__(self) -> FakeTelegram:
        app = web.Application(client_max_size=20 * 1024 * 1024)
        app.router.add_route("POST", "/bot{token}/{method}", self._handle)
        app.router.add_route("GET", "/bot{token}/{method}", self._handle)
        self.files.routes(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._poll_generation += 1
        self._new_update.set()
        self._polls_open.set()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        return f"{self.url}/bot"

    # --- scripting ---------------------------------------------------------------

    def fail_next(self, method: str, kind: Fault, retry_after: int = 1, *, after: int = 0) -> None:
        """The next call to `method` (after `after` calls let through) fails: 429 (retry_after),
        400 parse error, 409, 500, or "timeout" (done, but answered too late)."""
        self._faults.setdefault(method, []).append([kind, retry_after, after])

    def keep_flood_waits(self) -> None:
        """From now on a 429 holds its chat: calls that change the chat before its retry_after
        has passed are refused again (as Telegram does) and recorded in `flood_violations`."""
        self._flood_until = {}

    def _injected(self, method: str, kind: Fault, retry_after: int, params: dict[str, Any]) -> None:
        self.injected.append((method, kind, retry_after, params))
        if kind == "429" and self._flood_until is not None and "chat_id" in params:
            chat, now = str(params["chat_id"]), time.monotonic()
            if self._flood_until.get(chat, 0.0) <= now:
                self._flood_since[chat] = now
            self._flood_until[chat] = max(self._flood_until.get(chat, 0.0), now + retry_after)

    def _flood_wait_left(self, method: str, params: dict[str, Any]) -> float:
        if self._flood_until is None or method not in FLOOD_METHODS or "chat_id" not in params:
            return 0.0
        chat, now = str(params["chat_id"]), time.monotonic()
        left = self._flood_until.get(chat, 0.0) - now
        if left <= 0.05:  # a send timed to the hold's end may arrive a hair early
            return 0.0
        self.flood_violations.append((method, chat, left, now - self._flood_since.get(chat, now)))
        return left

    def random_faults(
        self, methods: tuple[str, ...], *, rate_429: float = 0.0, retry_after: tuple[int, int] = (1, 40),
        rate_timeout: float = 0.0, seed: int | None = None,
    ) -> None:
        """From now on, calls to `methods` fail at random: 429 with a retry_after drawn from
        `retry_after`, or a timeout after the call was carried out."""
        self._random = _RandomFaults(set(methods), rate_429, retry_after, rate_timeout, random.Random(seed))

    def hold_polls(self, after: int = 0) -> None:
        """After `after` more getUpdates calls are served, the next ones hang without
        confirming anything (see `release_polls`)."""
        self._polls_before_hold = after
        if after == 0:
            self._polls_open.clear()

    def release_polls(self) -> None:
        """New getUpdates calls are served again; the held ones are dropped unanswered."""
        self._polls_before_hold = None
        self._polls_open.set()

    def _count_poll(self) -> None:
        if self._polls_before_hold is None:
            return
        if self._polls_before_hold == 0:
            self._polls_open.clear()
        else:
            self._polls_before_hold -= 1

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def chat(self, chat_id: int) -> list[StoredMessage]:
        return sorted(self.messages.get(chat_id, {}).values(), key=lambda m: m.message_id)

    def bot_messages(self, chat_id: int) -> list[StoredMessage]:
        return [m for m in self.chat(chat_id) if m.from_bot]

    def enqueue(self, update: dict[str, Any]) -> dict[str, Any]:
        self._updates.append(update)
        self._new_update.set()
        return update

    @property
    def pending_updates(self) -> list[dict[str, Any]]:
        return list(self._updates)

    def message_update(
        self,
        chat_id: int,
        text: str = "",
        *,
        user_id: int = 42,
        first_name: str = "Ann",
        username: str = "ann",
        chat_type: str = "private",
        thread_id: int | None = None,
        reply_to: int | None = None,
        entities: list[dict[str, Any]] | None = None,
        photo: bool = False,
        document: dict[str, Any] | None = None,
        is_bot: bool = False,
        kind: str = "message",
        media: dict[str, Any] | None = None,
        quote: str | None = None,
    ) -> dict[str, Any]:
        """`quote`: the part of the replied-to message the person quoted (Bot API TextQuote).
        `media`: fields of a message with files (e.g. {"photo": fake.files.photo(...)},
        {"voice": ...}, {"media_group_id": "..."}); its text goes in the caption."""
        """An update as Telegram would deliver it (not queued: see `enqueue`)."""
        self.chat_types[chat_id] = chat_type
        message_id = self._next_message_id(chat_id)
        message: dict[str, Any] = {
            "message_id": message_id,
            "date": int(time.time()),
            "chat": self._chat_json(chat_id),
            "from": {"id": user_id, "is_bot": is_bot, "first_name": first_name, "username": username},
        }
        key, entity_key = ("caption", "caption_entities") if photo or document or media else ("text", "entities")
        if text:
            message[key] = text
            message[entity_key] = _auto_entities(text) if entities is None else entities
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            message["is_topic_message"] = True
        if reply_to is not None:
            replied = self.messages[chat_id][reply_to]
            message["reply_to_message"] = self._message_json(replied)
            if quote is not None:
                message["quote"] = {"text": quote, "position": max(replied.text.find(quote), 0), "is_manual": True}
        if photo:
            message["photo"] = [
                {"file_id": "small", "file_unique_id": "s", "width": 90, "height": 90, "file_size": 900},
                {"file_id": "large", "file_unique_id": "l", "width": 900, "height": 900, "file_size": 90_000},
            ]
        if document:
            message["document"] = {"file_unique_id": "d", **document}
        message.update(media or {})
        self.messages.setdefault(chat_id, {})[message_id] = StoredMessage(
            message_id, chat_id, text, thread_id=thread_id, from_bot=False, sender=message["from"]
        )
        return {"update_id": next(self._update_ids), kind: message}

    def edit(
        self, chat_id: int, message_id: int, text: str, *, user_id: int = 42, first_name: str = "Ann"
    ) -> dict[str, Any]:
        """A person edits their message: a new update (`edited_message`) carrying the whole
        message again, with its new text and an `edit_date`; queued like any update."""
        stored = self.messages[chat_id][message_id]
        stored.text = text
        kind = self.chat_types.get(chat_id, "private")
        message: dict[str, Any] = {
            "message_id": message_id,
            "date": int(time.time()) - 5,
            "edit_date": int(time.time()),
            "chat": self._chat_json(chat_id),
            "from": {"id": user_id, "is_bot": False, "first_name": first_name, "username": first_name.lower()},
            "text": text,
            "entities": _auto_entities(text),
        }
        if stored.thread_id is not None:
            message["message_thread_id"] = stored.thread_id
            message["is_topic_message"] = True
        key = "edited_channel_post" if kind == "channel" else "edited_message"
        return self.enqueue({"update_id": next(self._update_ids), key: message})

    def react(
        self, chat_id: int, message_id: int, new: list[str], old: list[str] = (), *, user_id: int = 42  # type: ignore[assignment]
    ) -> dict[str, Any]:
        """A person changes their reaction on a message (`message_reaction`, Bot API 7.0): the
        reactions before and after, as ReactionTypeEmoji lists."""
        update = {
            "update_id": next(self._update_ids),
            "message_reaction": {
                "chat": self._chat_json(chat_id),
                "message_id": message_id,
                "user": {"id": user_id, "is_bot": False, "first_name": "Ann", "username": "ann"},
                "date": int(time.time()),
                "old_reaction": [{"type": "emoji", "emoji": e} for e in old],
                "new_reaction": [{"type": "emoji", "emoji": e} for e in new],
            },
        }
        return self.enqueue(update)

    def private_message(self, chat_id: int, text: str, **kw: Any) -> dict[str, Any]:
        return self.enqueue(self.message_update(chat_id, text, user_id=kw.pop("user_id", chat_id), **kw))

    def group_message(self, chat_id: int, text: str, **kw: Any) -> dict[str, Any]:
        return self.enqueue(self.message_update(chat_id, text, chat_type="supergroup", **kw))

    def topic_message(self, chat_id: int, thread_id: int, text: str, **kw: Any) -> dict[str, Any]:
        return self.enqueue(self.message_update(chat_id, text, chat_type="supergroup", thread_id=thread_id, **kw))

    def callback_update(
        self,
        chat_id: int,
        message_id: int,
        data: str,
        *,
        user_id: int = 42,
        first_name: str = "Ann",
        username: str = "ann",
    ) -> dict[str, Any]:
        stored = self.messages[chat_id][message_id]
        query = {
            "id": f"cq{next(self._update_ids)}",
            "from": {"id": user_id, "is_bot": False, "first_name": first_name, "username": username},
            "chat_instance": f"ci{chat_id}",
            "message": self._message_json(stored),
            "data": data,
        }
        return {"update_id": next(self._update_ids), "callback_query": query}

    def press(self, chat_id: int, message_id: int, data: str, **kw: Any) -> dict[str, Any]:
        return self.enqueue(self.callback_update(chat_id, message_id, data, **kw))

    def inline_press(
        self, chat_id: int, message_id: int, data: str, *, user_id: int = 42, first_name: str = "Ann"
    ) -> dict[str, Any]:
        """A tap on a button of the bot's own message that Telegram reports by
        `inline_message_id` instead of `message` (Bot API 10.5, `callback_query_mode`): the
        query carries no chat; `chat_instance` stays opaque."""
        inline_id = f"AgAAA{chat_id}x{message_id}"
        self.inline_ids[inline_id] = (chat_id, message_id)
        query = {
            "id": f"cq{next(self._update_ids)}",
            "from": {"id": user_id, "is_bot": False, "first_name": first_name, "username": first_name.lower()},
            "inline_message_id": inline_id,
            "chat_instance": f"ci{chat_id}",
            "data": data,
        }
        return self.enqueue({"update_id": next(self._update_ids), "callback_query": query})

    def stop_generation(self, chat_id: int, draft_id: int, *, thread_id: int | None = None) -> dict[str, Any]:
        """The person pressed Stop on a draft (Bot API 10.3 MessageGenerationStopped: chat,
        message_thread_id, draft_id). Telegram shows Stop only on a draft sent with can_stop."""
        shown = [p for p in self.draft_params if int(p["chat_id"]) == chat_id and int(p["draft_id"]) == draft_id]
        assert shown and _true(shown[-1].get("can_stop")), "this draft has no Stop button"
        stopped: dict[str, Any] = {"chat": self._chat_json(chat_id), "draft_id": draft_id}
        if thread_id is not None:
            stopped["message_thread_id"] = thread_id
        return self.enqueue({"update_id": next(self._update_ids), "stopped_message_generation": stopped})

    # --- HTTP ----------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return self._error(401, "Unauthorized")
        method = request.match_info["method"]
        try:
            params = await self._params(request)
        except ValueError as exc:
            return self._error(400, f"Bad Request: {exc}")
        except ConnectionResetError:  # the client gave up (a cancelled long poll)
            return web.Response(status=499)
        self.calls.append(Call(method, params, time.monotonic()))
        early = self._flood_wait_left(method, params)
        if early:
            return self._fault_response("429", math.ceil(early))
        kind, retry_after = self._draw_fault(method)
        if kind is not None:
            self._injected(method, kind, retry_after, params)
        if kind is not None and kind != "timeout":
            return self._fault_response(kind, retry_after)
        handler = getattr(self, f"_api_{method}", None)
        if handler is None:
            return self._error(404, "Not Found")
        try:
            result = await handler(params)
        except _ApiError as exc:
            return self._error(exc.status, exc.description)
        if kind == "timeout":  # carried out; the answer comes after the client gave up
            await asyncio.sleep(self.timeout_delay_s)
        return web.json_response({"ok": True, "result": result})

    async def _params(self, request: web.Request) -> dict[str, Any]:
        if request.content_type == "application/json":
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the JSON body must be an object")
            return body
        form = await request.post()
        params: dict[str, Any] = {}
        for key, value in form.items():
            if isinstance(value, web.FileField):
                params[key] = {"filename": value.filename, "content": value.file.read()}
            elif key in _OBJECT_FIELDS:
                params[key] = json.loads(value)
            else:
                params[key] = value
        return params

    def _draw_fault(self, method: str) -> tuple[Fault | None, int]:
        queue = self._faults.get(method)
        if queue:
            if queue[0][2] > 0:
                queue[0][2] -= 1
            else:
                kind, retry_after, _ = queue.pop(0)
                return kind, retry_after
        if self._random is not None and method in self._random.methods:
            return self._random.draw()
        return None, 0

    def _fault_response(self, kind: Fault, retry_after: int) -> web.Response:
        if kind == "429":
            return self._error(429, f"Too Many Requests: retry after {retry_after}", retry_after=retry_after)
        if kind == "parse":
            return self._error(400, "Bad Request: can't parse entities: unsupported start tag at byte offset 0")
        if kind == "409":
            return self._error(
                409, "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
            )
        if kind == "not_modified":
            return self._error(400, NOT_MODIFIED)
        return self._error(500, "Internal Server Error")

    @staticmethod
    def _error(status: int, description: str, retry_after: int | None = None) -> web.Response:
        body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
        if retry_after is not None:
            body["parameters"] = {"retry_after": retry_after}
        return web.json_response(body, status=status)

    # --- helpers -------------------------------------------------------------------

    def _next_message_id(self, chat_id: int) -> int:
        return next(self._message_ids.setdefault(chat_id, itertools.count(1)))

    def _chat_json(self, chat_id: int) -> dict[str, Any]:
        kind = self.chat_types.get(chat_id, "private" if chat_id > 0 else "supergroup")
        chat: dict[str, Any] = {"id": chat_id, "type": kind}
        if kind == "private":
            chat["first_name"] = "Ann"
        else:
            chat["title"] = f"Group {chat_id}"
            chat["is_forum"] = True
        return chat

    def _message_json(self, stored: StoredMessage) -> dict[str, Any]:
        sender = (
            {"id": BOT_ID, "is_bot": True, "first_name": "Test Bot", "username": BOT_USERNAME}
            if stored.from_bot
            else stored.sender or {"id": 42, "is_bot": False, "first_name": "Ann"}
        )
        message: dict[str, Any] = {
            "message_id": stored.message_id,
            "date": int(time.time()),
            "chat": self._chat_json(stored.chat_id),
            "from": sender,
        }
        if stored.ephemeral_id is not None:  # no place in the chat's history: message_id 0
            message["ephemeral_message_id"] = stored.ephemeral_id
            message["receiver_user"] = {"id": stored.receiver, "is_bot": False, "first_name": f"User {stored.receiver}"}
        if stored.text:
            message["text"] = stored.text
            if stored.entities:
                message["entities"] = stored.entities
        if stored.reply_markup:
            message["reply_markup"] = stored.reply_markup
        if stored.thread_id is not None:
            message["message_thread_id"] = stored.thread_id
            message["is_topic_message"] = True
        if stored.document:
            message["document"] = stored.document
            if stored.caption:
                message["caption"] = stored.caption
        return message

    def _stored(self, params: dict[str, Any]) -> StoredMessage:
        inline_id = params.get("inline_message_id")
        if inline_id is not None:  # Telegram: either inline_message_id, or chat_id and message_id
            if "chat_id" in params or "message_id" in params or inline_id not in self.inline_ids:
                raise _ApiError(400, "Bad Request: MESSAGE_ID_INVALID")
            chat_id, message_id = self.inline_ids[inline_id]
        else:
            chat_id, message_id = int(params["chat_id"]), int(params["message_id"])
        stored = self.messages.get(chat_id, {}).get(message_id)
        if stored is None:
            raise _ApiError(400, "Bad Request: message to edit not found")
        return stored

    def _new_message(self, params: dict[str, Any], **fields: Any) -> StoredMessage:
        chat_id = int(params["chat_id"])
        if chat_id == 404:
            raise _ApiError(400, "Bad Request: chat not found")
        if chat_id in self.never_started:
            raise _ApiError(403, "Forbidden: bot can't initiate conversation with a user")
        thread = params.get("message_thread_id")
        topics = self.bot_info().get("has_topics_enabled")
        if thread is not None and chat_id > 0 and not topics:  # a private chat has topics only then (9.3)
            raise _ApiError(400, "Bad Request: message thread not found")
        reply = (params.get("reply_parameters") or {}).get("message_id")
        if "ephemeral_message_parameters" in params and not self.before_ephemeral:
            return self._new_ephemeral(params, thread, **fields)
        stored = StoredMessage(
            self._next_message_id(chat_id),
            chat_id,
            thread_id=int(thread) if thread is not None else None,
            reply_to=reply,
            **fields,
        )
        self.messages.setdefault(chat_id, {})[stored.message_id] = stored
        return stored

    def _new_ephemeral(self, params: dict[str, Any], thread: Any, **fields: Any) -> StoredMessage:
        """Bot API 10.2: shown in a group to `receiver_user_id` only, kept apart from the chat."""
        chat_id = int(params["chat_id"])
        shown_to = params["ephemeral_message_parameters"]
        if not isinstance(shown_to, dict):
            raise _ApiError(400, "Bad Request: ephemeral_message_parameters must be an object")
        unknown = sorted(set(shown_to) - {"receiver_user_id", "callback_query_id", "replace_callback_query_message"})
        if unknown:
            raise _ApiError(400, f"Bad Request: unknown field {unknown[0]} of EphemeralMessageParameters")
        receiver = shown_to.get("receiver_user_id")
        if not isinstance(receiver, int):
            raise _ApiError(400, "Bad Request: receiver_user_id must be an Integer")
        if chat_id > 0:
            raise _ApiError(400, "Bad Request: ephemeral messages can be sent only to groups")
        if receiver in self.non_members:
            raise _ApiError(400, "Bad Request: USER_NOT_PARTICIPANT")
        in_chat = self.ephemeral.setdefault(chat_id, {})
        stored = StoredMessage(0, chat_id, thread_id=int(thread) if thread is not None else None,
                               receiver=receiver, ephemeral_id=len(in_chat) + 1, **fields)
        in_chat[len(in_chat) + 1] = stored
        return stored

    def ephemeral_of(self, chat_id: int, receiver: int) -> list[StoredMessage]:
        """The ephemeral messages of the group that `receiver` sees (the rest of it sees none)."""
        return [m for m in self.ephemeral.get(chat_id, {}).values() if m.receiver == receiver]

    def ephemeral_press(self, chat_id: int, ephemeral_id: int, data: str, *, first_name: str = "Ann") -> dict[str, Any]:
        """A tap on an ephemeral message's button, by the one person who sees it."""
        stored = self.ephemeral[chat_id][ephemeral_id]
        query = {
            "id": f"cq{next(self._update_ids)}",
            "from": {"id": stored.receiver, "is_bot": False, "first_name": first_name, "username": first_name.lower()},
            "chat_instance": f"ci{chat_id}",
            "message": self._message_json(stored),
            "data": data,
        }
        return self.enqueue({"update_id": next(self._update_ids), "callback_query": query})

    def _ephemeral_stored(self, params: dict[str, Any]) -> StoredMessage:
        _known(params, EPHEMERAL_EDIT_PARAMS)
        chat_id, receiver = int(params["chat_id"]), int(params["receiver_user_id"])
        stored = self.ephemeral.get(chat_id, {}).get(int(params["ephemeral_message_id"]))
        if stored is None or stored.receiver != receiver:
            raise _ApiError(400, "Bad Request: message to edit not found")
        return stored

    # --- methods -------------------------------------------------------------------

    async def _api_createForumTopic(self, params: dict[str, Any]) -> dict[str, Any]:
        """A topic of a forum supergroup, or of a private chat with a bot that has topics (Bot API
        9.4); its thread id, as Telegram numbers them (the id of the topic's first message)."""
        _known(params, {"chat_id", "name", "icon_color", "icon_custom_emoji_id"})
        chat_id, name = int(params["chat_id"]), str(params.get("name") or "")
        if not 1 <= len(name) <= 128:
            raise _ApiError(400, "Bad Request: TOPIC_TITLE_EMPTY" if not name else "Bad Request: TOPIC_TITLE_TOO_LONG")
        if chat_id > 0 and not self.bot_info().get("has_topics_enabled"):
            raise _ApiError(400, "Bad Request: the bot has no topics in private chats")
        thread_id = self._next_message_id(chat_id)
        self.topics.setdefault(chat_id, {})[thread_id] = name
        return {"message_thread_id": thread_id, "name": name, "icon_color": 7322096}

    async def _api_editEphemeralMessageText(self, params: dict[str, Any]) -> bool:
        _check_keyboard(params.get("reply_markup"))
        stored = self._ephemeral_stored(params)
        text, entities = self._checked_text(params)
        stored.text, stored.entities, stored.reply_markup = text, entities, params.get("reply_markup")
        return True

    async def _api_editEphemeralMessageReplyMarkup(self, params: dict[str, Any]) -> bool:
        _check_keyboard(params.get("reply_markup"))
        self._ephemeral_stored(params).reply_markup = params.get("reply_markup") or None
        return True

    async def _api_deleteEphemeralMessage(self, params: dict[str, Any]) -> bool:
        stored = self._ephemeral_stored(params)
        del self.ephemeral[stored.chat_id][stored.ephemeral_id or 0]
        return True


    async def _api_getMe(self, params: dict[str, Any]) -> dict[str, Any]:
        return self.bot_info()

    def bot_info(self) -> dict[str, Any]:
        """BotFullInfo as Bot API 10.5 returns it: the User fields and every bot setting."""
        return {
            "id": BOT_ID,
            "is_bot": True,
            "first_name": "Test Bot",
            "username": BOT_USERNAME,
            "active_usernames": [BOT_USERNAME],
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_guest_queries": False,
            "supports_inline_queries": False,
            "needs_inline_query_location": False,
            "can_connect_to_business": False,
            "has_main_web_app": False,
            "has_topics_enabled": True,
            "allows_users_to_create_topics": True,
            "has_topic_sidebar": False,
            "can_manage_bots": False,
            "supports_join_request_queries": False,
            **self.bot_settings,
        }

    async def _api_getUpdates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        self._count_poll()
        if not self._polls_open.is_set():
            self.held_polls.append(params)
            await self._polls_open.wait()
            raise _ApiError(502, "Bad Gateway: this request was held and is dropped unapplied")
        if self.webhook.get("url"):
            raise _ApiError(
                409,
                "Conflict: can't use getUpdates method while webhook is active"
                "; use deleteWebhook to delete the webhook first",
            )
        offset = int(params.get("offset") or 0)
        if offset:
            self._updates = [u for u in self._updates if u["update_id"] >= offset]
        # Kinds the poller did not ask for are never delivered (Telegram drops them).
        self._updates = [u for u in self._updates if _wanted(u, params.get("allowed_updates"))]
        self._poll_generation += 1
        self._new_update.set()  # wakes an earlier poller, which then answers 409
        generation = self._poll_generation
        deadline = time.monotonic() + float(params.get("timeout") or 0)
        while not self._updates and time.monotonic() < deadline:
            self._new_update.clear()
            try:
                await asyncio.wait_for(self._new_update.wait(), deadline - time.monotonic())
            except TimeoutError:
                break
            if generation != self._poll_generation:
                self.conflicts += 1
                raise _ApiError(
                    409,
                    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
                )
        limit = int(params.get("limit") or 100)
        self._updates = [u for u in self._updates if _wanted(u, params.get("allowed_updates"))]
        return self._updates[:limit]

    async def _api_sendMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        _check_keyboard(params.get("reply_markup"))
        text, entities = self._checked_text(params)
        stored = self._new_message(params, text=text, entities=entities, reply_markup=params.get("reply_markup"))
        return self._message_json(stored)

    async def _api_sendRichMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        """Bot API 10.1: an InputRichMessage with exactly one of html, markdown or blocks. The
        answer here is the Message without its parsed RichMessage (its blocks are not modelled)."""
        _known(params, RICH_PARAMS)
        _check_keyboard(params.get("reply_markup"))
        rich = params.get("rich_message")
        content = self._checked_rich(rich)
        if any(block.get("type") == "thinking" for block in rich.get("blocks") or []):
            raise _ApiError(400, "Bad Request: thinking blocks can be used only in message drafts")
        if self.refuse_rich:
            raise _ApiError(400, f"Bad Request: {self.refuse_rich}")
        stored = self._new_message(params, text=content, rich=rich, reply_markup=params.get("reply_markup"))
        message = self._message_json(stored)
        message.pop("text", None)
        return message

    def _checked_rich(self, rich: Any) -> str:
        """An InputRichMessage as the Bot API checks it; its text (markdown or html)."""
        if not isinstance(rich, dict) or len({"html", "markdown", "blocks"} & set(rich)) != 1:
            raise _ApiError(400, "Bad Request: exactly one of html, markdown or blocks must be specified")
        unknown = sorted(set(rich) - {"html", "markdown", "blocks", "media", "is_rtl", "skip_entity_detection"})
        if unknown:
            raise _ApiError(400, f"Bad Request: unknown field {unknown[0]} of InputRichMessage")
        content = str(rich.get("markdown") or rich.get("html") or "")
        if "blocks" not in rich and not content.strip():
            raise _ApiError(400, "Bad Request: rich message is empty")
        if "html" in rich:
            _check_rich_html(content)
        for block in rich.get("blocks") or []:
            if not isinstance(block, dict) or not block.get("type"):
                raise _ApiError(400, "Bad Request: a rich block must have a type")
        return content

    async def _api_sendRichMessageDraft(self, params: dict[str, Any]) -> bool:
        """Bot API 10.2: a rich draft (a private chat's animated preview), where a "thinking"
        block may stand until the text comes. Kept in `rich_drafts`."""
        _known(params, RICH_DRAFT_PARAMS)
        if self.refuse_rich:
            raise _ApiError(400, f"Bad Request: {self.refuse_rich}")
        if int(params["chat_id"]) < 0:
            raise _ApiError(400, "Bad Request: drafts can be sent only to private chats")
        if not int(params.get("draft_id") or 0):
            raise _ApiError(400, "Bad Request: draft_id must be non-zero")
        self._checked_rich(params.get("rich_message"))
        self.rich_drafts.append(params)
        return True

    async def _api_editMessageText(self, params: dict[str, Any]) -> dict[str, Any]:
        _check_keyboard(params.get("reply_markup"))
        stored = self._stored(params)
        text, entities = self._checked_text(params)
        markup = params.get("reply_markup")
        if (text, entities, markup) == (stored.text, stored.entities, stored.reply_markup):
            raise _ApiError(400, NOT_MODIFIED)
        stored.text, stored.entities, stored.reply_markup = text, entities, markup
        return self._message_json(stored)

    async def _api_editMessageReplyMarkup(self, params: dict[str, Any]) -> dict[str, Any]:
        _check_keyboard(params.get("reply_markup"))
        stored = self._stored(params)
        markup = params.get("reply_markup") or None
        if markup == stored.reply_markup:
            raise _ApiError(400, NOT_MODIFIED)
        stored.reply_markup = markup
        return self._message_json(stored)

    async def _api_deleteMessage(self, params: dict[str, Any]) -> bool:
        stored = self._stored(params)
        del self.messages[stored.chat_id][stored.message_id]
        return True

    async def _api_answerCallbackQuery(self, params: dict[str, Any]) -> bool:
        return True

    async def _api_sendChatAction(self, params: dict[str, Any]) -> bool:
        return True

    async def _api_sendMessageDraft(self, params: dict[str, Any]) -> bool:
        _known(params, DRAFT_PARAMS)
        for flag in ("can_stop", "keep_on_stop"):
            if flag in params and str(params[flag]).lower() not in ("true", "false"):
                raise _ApiError(400, f"Bad Request: {flag} must be a Boolean")
        self.draft_params.append(params)
        chat_id = int(params["chat_id"])
        if chat_id < 0:
            raise _ApiError(400, "Bad Request: drafts can be sent only to private chats")
        if not int(params.get("draft_id") or 0):
            raise _ApiError(400, "Bad Request: draft_id must be non-zero")
        text = params.get("text") or ""
        if text:
            self._checked_text(params)
        self.drafts.setdefault(chat_id, []).append(text)
        return True

    async def _api_sendDocument(self, params: dict[str, Any]) -> dict[str, Any]:
        upload = params.get("document")
        if not isinstance(upload, dict):
            raise _ApiError(400, "Bad Request: there is no document in the request")
        document = {
            "file_id": f"doc{len(self.calls)}",
            "file_unique_id": "u",
            "file_name": upload["filename"],
            "file_size": len(upload["content"]),
            "content": upload["content"],
        }
        stored = self._new_message(params, document=document, caption=params.get("caption") or "")
        shown = {k: v for k, v in document.items() if k != "content"}
        return {**self._message_json(stored), "document": shown}

    async def _api_getFile(self, params: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.files.get_file(params)
        except LookupError as exc:
            raise _ApiError(400, str(exc)) from None

    async def _api_sendPhoto(self, params: dict[str, Any]) -> dict[str, Any]:
        upload = params.get("photo")
        if not isinstance(upload, dict):
            raise _ApiError(400, "Bad Request: there is no photo in the request")
        if len(upload["content"]) > 10 * 1024 * 1024:
            raise _ApiError(400, "Bad Request: PHOTO_SAVE_FILE_INVALID")
        caption = str(params.get("caption") or "")
        if len(caption) > 1024:
            raise _ApiError(400, "Bad Request: message caption is too long")
        photo = {
            "file_id": f"photo{len(self.calls)}",
            "file_unique_id": "p",
            "file_name": upload["filename"],
            "file_size": len(upload["content"]),
            "content": upload["content"],
        }
        stored = self._new_message(params, document=photo, caption=caption)
        shown = {k: v for k, v in photo.items() if k not in ("content", "file_name")}
        message = self._message_json(stored)
        message.pop("document", None)
        return {**message, "photo": [{**shown, "width": 1, "height": 1}]}

    async def _api_sendVoice(self, params: dict[str, Any]) -> dict[str, Any]:
        """A voice note: Ogg Opus, MP3 or M4A (what the Bot API documents); a person whose
        privacy settings forbid voice notes makes it fail as Telegram does."""
        upload = params.get("voice")
        if not isinstance(upload, dict):
            raise _ApiError(400, "Bad Request: there is no voice in the request")
        if int(params["chat_id"]) in self.voice_forbidden:
            raise _ApiError(400, "Bad Request: VOICE_MESSAGES_FORBIDDEN")
        content: bytes = upload["content"]
        kind = audio_kind(content)
        if kind not in ("ogg", "mp3", "m4a"):
            raise _ApiError(400, "Bad Request: wrong file type of the voice note")
        try:
            duration = round(opus_seconds(content)) if kind == "ogg" else 0
        except ValueError as exc:
            raise _ApiError(400, f"Bad Request: the voice note is broken ({exc})") from None
        voice = {
            "file_id": f"voice{len(self.calls)}",
            "file_unique_id": "v",
            "file_name": upload["filename"],
            "duration": duration,
            "mime_type": {"ogg": "audio/ogg", "mp3": "audio/mpeg", "m4a": "audio/mp4"}[kind],
            "file_size": len(content),
            "content": content,
        }
        stored = self._new_message(params, document=voice, caption=str(params.get("caption") or ""))
        message = self._message_json(stored)
        message.pop("document", None)
        return {**message, "voice": {k: v for k, v in voice.items() if k not in ("content", "file_name")}}

    async def _api_setWebhook(self, params: dict[str, Any]) -> bool:
        self.webhook = {
            "url": params.get("url", ""),
            "secret_token": params.get("secret_token", ""),
            "allowed_updates": params.get("allowed_updates"),
        }
        return True

    async def _api_deleteWebhook(self, params: dict[str, Any]) -> bool:
        self.webhook = {}
        if str(params.get("drop_pending_updates", "")).lower() == "true":
            self._updates.clear()
        return True

    async def _api_getWebhookInfo(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": self.webhook.get("url", ""),
            "has_custom_certificate": False,
            "pending_update_count": len(self._updates),
        }

    def _checked_text(self, params: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        text = str(params.get("text") or "")
        if not text.strip():
            raise _ApiError(400, "Bad Request: message text is empty")
        size = utf16_len(text)
        if size > 4096:
            raise _ApiError(400, "Bad Request: message is too long")
        entities = params.get("entities") or []
        for entity in entities:
            if entity["offset"] < 0 or entity["length"] <= 0 or entity["offset"] + entity["length"] > size:
                raise _ApiError(400, "Bad Request: can't parse entities: entity beyond the end of the text")
        return text, entities


RICH_PARAMS = frozenset({
    "chat_id", "rich_message", "business_connection_id", "message_thread_id", "direct_messages_topic_id",
    "disable_notification", "protect_content", "allow_paid_broadcast", "message_effect_id",
    "suggested_post_parameters", "reply_parameters", "reply_markup", "ephemeral_message_parameters",
})
EPHEMERAL_EDIT_PARAMS = frozenset({
    "chat_id", "receiver_user_id", "ephemeral_message_id", "text", "parse_mode", "entities", "link_preview_options",
    "reply_markup", "rich_message",
})
RICH_DRAFT_PARAMS = frozenset({"chat_id", "message_thread_id", "draft_id", "rich_message"})
DRAFT_PARAMS = frozenset(
    {"chat_id", "message_thread_id", "draft_id", "text", "parse_mode", "entities", "can_stop", "keep_on_stop"}
)
# InlineKeyboardButton: exactly one of these says what the button does (Bot API; `disabled` 10.3)
BUTTON_KINDS = frozenset({
    "url", "callback_data", "web_app", "login_url", "switch_inline_query", "switch_inline_query_current_chat",
    "switch_inline_query_chosen_chat", "copy_text", "callback_game", "pay", "disabled",
})
BUTTON_STYLES = frozenset({"danger", "success", "primary"})


# The tags of Telegram's rich HTML style that Markdown renders to (Bot API 10.1 "Rich HTML style").
RICH_HTML_TAGS = frozenset({
    "p", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "b", "em", "i", "s", "u", "code", "pre", "a", "ul", "ol",
    "li", "blockquote", "table", "thead", "tbody", "tr", "th", "td", "hr", "br", "details", "summary",
})


class _RichHtml(HTMLParser):
    """Refuses what Telegram's HTML parser refuses: an unknown tag, or one closed out of order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in RICH_HTML_TAGS:
            raise _ApiError(400, f"Bad Request: can't parse rich message: unsupported start tag \"{tag}\"")
        if tag not in ("hr", "br"):
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in ("hr", "br"):
            raise _ApiError(400, f"Bad Request: can't parse rich message: \"{tag}\" is not a void tag")

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open.pop() != tag:
            raise _ApiError(400, f"Bad Request: can't parse rich message: unexpected end tag \"{tag}\"")


def _check_rich_html(content: str) -> None:
    parser = _RichHtml()
    parser.feed(content)
    parser.close()
    if parser.open:
        raise _ApiError(400, f"Bad Request: can't parse rich message: unclosed tag \"{parser.open[-1]}\"")


def _true(value: Any) -> bool:
    return str(value).lower() == "true"


def _known(params: dict[str, Any], known: frozenset[str] | set[str]) -> None:
    """Stricter than Telegram, which passes over parameters it does not know: here a misspelt
    or invented parameter of a method newer than the library fails instead of doing nothing."""
    unknown = sorted(set(params) - known)
    if unknown:
        raise _ApiError(400, f"Bad Request: unknown parameter {unknown[0]}")


def _check_keyboard(markup: Any) -> None:
    """What Telegram refuses in an inline keyboard: a button that does nothing or several things,
    a style it does not know, callback data outside 1-64 bytes."""
    for row in (markup or {}).get("inline_keyboard", []):
        for button in row:
            kinds = set(button) & BUTTON_KINDS
            if not button.get("text") or len(kinds) != 1:
                raise _ApiError(400, "Bad Request: can't parse inline keyboard button: Text buttons are unallowed "
                                     "in the inline keyboard")
            if "style" in button and button["style"] not in BUTTON_STYLES:
                raise _ApiError(400, "Bad Request: can't parse inline keyboard button: invalid style")
            if "disabled" in button and button["disabled"] != {}:
                raise _ApiError(400, "Bad Request: can't parse inline keyboard button: DisabledButton holds no fields")
            if "callback_data" in button and not 1 <= len(str(button["callback_data"]).encode()) <= 64:
                raise _ApiError(400, "Bad Request: BUTTON_DATA_INVALID")


# Sent only when asked for by allowed_updates (Bot API getUpdates).
_ONLY_WHEN_ASKED = {"chat_member", "message_reaction", "message_reaction_count"}


def _wanted(update: dict[str, Any], allowed: Any) -> bool:
    kinds = set(update) - {"update_id"}
    if isinstance(allowed, str):
        allowed = json.loads(allowed) if allowed else None
    if not allowed:
        return not kinds & _ONLY_WHEN_ASKED
    return bool(kinds & set(allowed))


@dataclass
class _RandomFaults:
    methods: set[str]
    rate_429: float
    retry_after: tuple[int, int]
    rate_timeout: float
    rng: random.Random

    def draw(self) -> tuple[Fault | None, int]:
        roll = self.rng.random()
        if roll < self.rate_429:
            return "429", self.rng.randint(*self.retry_after)
        if roll < self.rate_429 + self.rate_timeout:
            return "timeout", 0
        return None, 0


class _ApiError(Exception):
    def __init__(self, status: int, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
