"""Slack event and interactivity payloads -> what the channel should do with them.

Pure functions over the JSON Slack sends: which conversation a message belongs to, whether it
addresses the agent, its text for the model, its files. The channel adds the I/O (allow
lists, known threads, user names, submit).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any, Literal

from gateway.events import Attachment, ThreadKey

from .blocks import ACTION_PREFIX, FEEDBACK_ACTION, FEEDBACK_VALUES

# chatter: a top-level channel message not for the agent, kept as context (slack.channel_context)
Route = Literal["mention", "followup", "dm", "chatter"]
# Message subtypes that are still a person talking; edits, deletions, joins, bot posts are not.
_PERSON_SUBTYPES = (None, "", "file_share", "thread_broadcast")
_LINK = re.compile(r"<((?:https?|mailto):[^|>]+)(?:\|([^>]*))?>")


@dataclass(frozen=True)
class Identity:
    """Who the app is in the workspace (from auth.test)."""

    bot_user_id: str
    bot_id: str = ""
    team_id: str = ""


@dataclass(frozen=True)
class Candidate:
    """A message that may be for the agent."""

    route: Route
    thread: ThreadKey
    channel: str
    user: str
    team: str
    ts: str
    text: str
    attachments: tuple[Attachment, ...] = ()

    @property
    def event_id(self) -> str:
        # app_mention and message for one mention, and retries, share channel + ts.
        return f"slack:{self.channel}:{self.ts}"


@dataclass(frozen=True)
class Press:
    """A click on one of the gateway's buttons."""

    thread: ThreadKey
    channel: str
    user: str
    username: str
    token: str
    message_ts: str
    event_id: str


def _mention_pattern(bot_user_id: str) -> re.Pattern[str]:
    return re.compile(r"<@" + re.escape(bot_user_id) + r"(?:\|[^>]*)?>")


def mentions(text: str, bot_user_id: str) -> bool:
    return bool(bot_user_id) and bool(_mention_pattern(bot_user_id).search(text))


def text_for_model(text: str, bot_user_id: str) -> str:
    """Slack's escaped mrkdwn -> plain text: the bot mention removed, links as Markdown."""
    if bot_user_id:
        text = _mention_pattern(bot_user_id).sub("", text)
    text = _LINK.sub(lambda m: f"[{m.group(2)}]({m.group(1)})" if m.group(2) else m.group(1), text)
    text = html.unescape(text) if "&" in text else text
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def _attachment_kind(mime: str) -> str:
    major = mime.split("/", 1)[0]
    return {"image": "photo", "audio": "audio", "video": "video"}.get(major, "document")


def attachments_of(event: dict[str, Any]) -> tuple[Attachment, ...]:
    """The files of a message. A file still being processed comes without its URLs
    (`file_access: check_file_info`); the channel asks files.info for them at download time."""
    found = []
    for item in event.get("files") or []:
        if not isinstance(item, dict) or not item.get("id") or item.get("mode") == "tombstone":
            continue
        mime = str(item.get("mimetype") or "")
        size = item.get("size")
        found.append(
            Attachment(
                kind=_attachment_kind(mime),
                file_id=str(item["id"]),
                name=str(item.get("name") or item.get("title") or ""),
                mime=mime,
                size=size if isinstance(size, int) else 0,
                url=str(item.get("url_private_download") or item.get("url_private") or ""),
                width=_int(item.get("original_w")),
                height=_int(item.get("original_h")),
                duration=_int(item.get("duration_ms")) // 1000,
            )
        )
    return tuple(found)


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _route(event: dict[str, Any], me: Identity) -> Route | None:
    if event.get("channel_type") == "im":
        return "dm"
    if event.get("type") == "app_mention" or mentions(str(event.get("text") or ""), me.bot_user_id):
        return "mention"
    thread_ts = event.get("thread_ts")
    if thread_ts and thread_ts != event.get("ts"):
        return "followup"
    return None


def _is_from_a_person(event: dict[str, Any], me: Identity) -> bool:
    if event.get("subtype") not in _PERSON_SUBTYPES or not event.get("user"):
        return False
    if event.get("user") == me.bot_user_id:
        return False
    return not (me.bot_id and event.get("bot_id") == me.bot_id)


def _thread_of(route: Route, channel: str, event: dict[str, Any], dm_threads: bool = False) -> ThreadKey:
    thread_ts = str(event.get("thread_ts") or "")
    if route == "chatter":
        return ThreadKey("slack", channel, "")
    if route == "dm" and dm_threads:  # the agent view: each top-level DM message starts a thread
        return ThreadKey("slack", channel, thread_ts or str(event["ts"]))
    if route == "dm":
        return ThreadKey("slack", channel, thread_ts)  # one session per DM, per thread if threaded
    return ThreadKey("slack", channel, thread_ts or str(event["ts"]))


def candidate(event: Any, me: Identity, *, chatter: bool = False, dm_threads: bool = False) -> Candidate | None:
    """The message in an `app_mention` / `message` event, or None when it is not for us.
    With `chatter`, a top-level channel message not for us is one too (route "chatter", in
    the channel's top-level thread `slack:<channel>:`). With `dm_threads` (the agent view) a
    top-level DM message is the root of its own thread `slack:<dm>:<ts>`."""
    if not isinstance(event, dict) or event.get("type") not in ("app_mention", "message"):
        return None
    if not event.get("channel") or not event.get("ts") or not _is_from_a_person(event, me):
        return None
    route = _route(event, me)
    if route is None and chatter and event.get("type") == "message" and not event.get("thread_ts"):
        route = "chatter"
    if route is None:
        return None
    channel = str(event["channel"])
    files = attachments_of(event)
    text = text_for_model(str(event.get("text") or ""), me.bot_user_id)
    return Candidate(
        route=route,
        thread=_thread_of(route, channel, event, dm_threads),
        channel=channel,
        user=str(event["user"]),
        team=str(event.get("team") or me.team_id),
        ts=str(event["ts"]),
        text=text,
        attachments=files,
    )


def why_not(event: Any, me: Identity) -> str:
    """Why `candidate` found no message for us in the event (for the log)."""
    if not isinstance(event, dict):
        return "no event"
    kind = "/".join(str(part) for part in (event.get("type"), event.get("subtype")) if part)
    if event.get("type") not in ("app_mention", "message"):
        return f"{kind}: not a message"
    if not event.get("channel") or not event.get("ts"):
        return f"{kind}: no channel or timestamp"
    if not _is_from_a_person(event, me):
        return f"{kind}: not from a person (a bot, this app, or a system message)"
    return f"{kind}: not addressed to the bot"


# ---- revisions: edits, deletions, reactions ------------------------------------------------

_UP, _DOWN = {"+1", "thumbsup"}, {"-1", "thumbsdown"}


def changed_message(event: Any) -> dict[str, Any] | None:
    """A `message_changed` event's new message, shaped as a message event (its channel and
    channel type added), or None when its text did not change: Slack also sends the event for
    unfurls and for a thread's reply count."""
    if not isinstance(event, dict) or event.get("subtype") != "message_changed":
        return None
    new, old = event.get("message"), event.get("previous_message") or {}
    if not isinstance(new, dict) or not event.get("channel") or not new.get("ts"):
        return None
    if isinstance(old, dict) and old.get("text") == new.get("text"):
        return None
    shaped = {**new, "type": "message", "channel": event["channel"], "channel_type": event.get("channel_type")}
    if shaped.get("subtype") not in _PERSON_SUBTYPES:
        shaped.pop("subtype", None)  # the edited message itself is a person's words
    return shaped


@dataclass(frozen=True)
class Deletion:
    thread: ThreadKey
    channel: str
    ts: str  # the deleted message's


def deletion(event: Any, dm_threads: bool = False) -> Deletion | None:
    if not isinstance(event, dict) or event.get("subtype") != "message_deleted":
        return None
    channel, ts = event.get("channel"), event.get("deleted_ts")
    if not channel or not ts:
        return None
    previous = event.get("previous_message") or {}
    thread_ts = str(previous.get("thread_ts") or "") if isinstance(previous, dict) else ""
    dm = event.get("channel_type") == "im"
    own = thread_ts if dm and not dm_threads else thread_ts or str(ts)
    return Deletion(ThreadKey("slack", str(channel), own), str(channel), str(ts))


@dataclass(frozen=True)
class Reacted:
    channel: str
    user: str
    ts: str  # the message reacted to
    feedback: str  # up | down
    added: bool


def reacted(event: Any, me: Identity) -> Reacted | None:
    """A thumbs up or down put on (`reaction_added`) or taken off one of the agent's messages."""
    if not isinstance(event, dict) or event.get("type") not in ("reaction_added", "reaction_removed"):
        return None
    item = event.get("item") or {}
    if not isinstance(item, dict) or item.get("type") != "message" or event.get("item_user") != me.bot_user_id:
        return None
    name = str(event.get("reaction") or "").split("::", 1)[0]  # "+1::skin-tone-2"
    feedback = "up" if name in _UP else "down" if name in _DOWN else ""
    if not feedback or event.get("user") in (None, "", me.bot_user_id) or not item.get("channel") or not item.get("ts"):
        return None
    return Reacted(
        str(item["channel"]), str(event["user"]), str(item["ts"]), feedback, event["type"] == "reaction_added"
    )


def press(payload: Any) -> Press | None:
    """The click in a `block_actions` payload, or None when it is not one of our buttons."""
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        return None
    actions = payload.get("actions") or []
    action = actions[0] if actions and isinstance(actions[0], dict) else {}
    if not str(action.get("action_id", "")).startswith(ACTION_PREFIX) or not action.get("value"):
        return None
    container = payload.get("container") or {}
    message = payload.get("message") or {}
    channel = (payload.get("channel") or {}).get("id") or container.get("channel_id")
    message_ts = container.get("message_ts") or message.get("ts")
    user = payload.get("user") or {}
    if not channel or not message_ts or not user.get("id"):
        return None
    thread_ts = message.get("thread_ts") or container.get("thread_ts") or ""
    unique = action.get("action_ts") or payload.get("trigger_id") or f"{message_ts}:{user['id']}"
    return Press(
        thread=ThreadKey("slack", str(channel), str(thread_ts)),
        channel=str(channel),
        user=str(user["id"]),
        username=str(user.get("username") or user.get("name") or ""),
        token=str(action["value"]),
        message_ts=str(message_ts),
        event_id=f"slack:action:{unique}",
    )


@dataclass(frozen=True)
class Rated:
    """A press on the 👍 / 👎 feedback buttons under one of the agent's answers."""

    channel: str
    user: str
    username: str
    ts: str  # the answer rated
    feedback: str  # up | down
    event_id: str


def rating(payload: Any) -> Rated | None:
    """The feedback button pressed in a `block_actions` payload (action type `feedback_buttons`,
    its `value` the pressed button's), or None."""
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        return None
    actions = payload.get("actions") or []
    action = actions[0] if actions and isinstance(actions[0], dict) else {}
    feedback = FEEDBACK_VALUES.get(str(action.get("value") or ""))
    if action.get("action_id") != FEEDBACK_ACTION or action.get("type") != "feedback_buttons" or not feedback:
        return None
    container = payload.get("container") or {}
    message = payload.get("message") or {}
    channel = (payload.get("channel") or {}).get("id") or container.get("channel_id")
    ts = container.get("message_ts") or message.get("ts")
    user = payload.get("user") or {}
    if not channel or not ts or not user.get("id"):
        return None
    unique = action.get("action_ts") or payload.get("trigger_id") or f"{ts}:{user['id']}:{feedback}"
    return Rated(str(channel), str(user["id"]), str(user.get("username") or user.get("name") or ""), str(ts),
                 feedback, f"slack:action:{unique}")


def app_home_dm(event: Any) -> tuple[str, str] | None:
    """(the person's DM channel with the app, the person) of an `app_home_opened` on the
    Messages tab (`tab: "messages"`), else None (the Home tab, or no channel)."""
    if not isinstance(event, dict) or event.get("type") != "app_home_opened" or event.get("tab") != "messages":
        return None
    channel, user = str(event.get("channel") or ""), str(event.get("user") or "")
    return (channel, user) if channel and user else None


def assistant_thread(event: Any) -> tuple[str, str, str] | None:
    """(channel, thread_ts, person) of an `assistant_thread_started` (the assistant view: its
    `assistant_thread` names them), else None."""
    if not isinstance(event, dict) or event.get("type") != "assistant_thread_started":
        return None
    thread = event.get("assistant_thread") or {}
    if not isinstance(thread, dict):
        return None
    channel, ts, user = (str(thread.get(k) or "") for k in ("channel_id", "thread_ts", "user_id"))
    return (channel, ts, user) if channel and ts and user else None
