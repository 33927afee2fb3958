"""A fake Slack: the Web API methods the gateway uses, a Socket Mode endpoint, and a sender of
correctly (or deliberately wrongly) signed Events API and interactivity requests.

`FakeSlack` is a real aiohttp server on 127.0.0.1 (random port). Point slack_sdk at
`fake.base_url`. It accepts form, query and JSON bodies like Slack, records every call,
keeps messages per channel (with their thread), and injects faults: a 429 with Retry-After
on the next call(s) of a method, or a method that always answers an error code.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlencode

from aiohttp import ClientSession, WSMsgType, web

from fakes.channel import MemoryChannelState
from fakes.slack_files import SharedFiles

_JSON_FIELDS = ("blocks", "files", "metadata", "chunks", "attachments")


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    token: str
    at: float = field(default_factory=time.monotonic)  # when it arrived (Retry-After checks)


@dataclass
class _Fault:
    status: int
    error: str
    retry_after: float | None
    remaining: int


class SlackError(Exception):
    """A handler's way to answer {"ok": false, "error": code}."""

    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


@dataclass
class FakeSlack:
    token: str = "xoxb-test"
    app_token: str = "xapp-test"
    bot_user_id: str = "UBOT"
    bot_id: str = "BBOT"
    team_id: str = "T1"
    calls: list[Call] = field(default_factory=list)
    messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    ephemerals: list[dict[str, Any]] = field(default_factory=list)
    reactions: set[tuple[str, str, str]] = field(default_factory=set)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    suggested: list[dict[str, Any]] = field(default_factory=list)  # suggested prompts shown
    agent_view: bool = False  # the app uses the agent messaging experience (features.agent_view)
    sessions: dict[tuple[str, str], str] = field(default_factory=dict)  # (channel, thread_ts) -> agent session status
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    acks: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._faults: dict[str, list[_Fault]] = {}
        self._broken: dict[str, str] = {}
        self._latency: dict[str, float] = {}
        self._windows: dict[str, tuple[float, float]] = {}  # method -> (window seconds, when it last answered)
        self._counter = itertools.count(1)
        self._changed = asyncio.Condition()
        self._sockets: list[web.WebSocketResponse] = []
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.shared = SharedFiles(self.token)
        for user_id, (username, display_name) in PEOPLE.items():
            self.add_user(user_id, username, display_name)

    # ---- server ----------------------------------------------------------------------

    async def __aenter__(self) -> FakeSlack:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/socket", self._socket)
        self.shared.routes(app)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self.shared.url = self.url

    async def close(self) -> None:
        for ws in list(self._sockets):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        return self.url + "/api/"

    # ---- test controls and views -----------------------------------------------------

    def add_user(self, user_id: str, name: str, display_name: str = "") -> None:
        self.users[user_id] = {
            "id": user_id,
            "name": name,
            "real_name": display_name or name,
            "profile": {"display_name": display_name, "real_name": display_name or name},
        }

    def fail_next(
        self,
        method: str,
        *,
        status: int = 429,
        retry_after: float | None = 1,
        error: str = "ratelimited",
        times: int = 1,
    ) -> None:
        """The next `times` calls of `method` fail (429 + Retry-After by default)."""
        self._faults.setdefault(method, []).append(_Fault(status, error, retry_after, times))

    def rate_limit(self, method: str, per_s: float = 60.0) -> None:
        """At most one answered call of `method` per `per_s` seconds, like conversations.replies
        for apps outside the Marketplace since 2025 (one request a minute): others get a 429 with
        the seconds left as Retry-After (rounded up, at least 1)."""
        self._windows[method] = (per_s, float("-inf"))

    def fail_always(self, method: str, error: str) -> None:
        """`method` answers {"ok": false, "error": error} until `heal(method)`."""
        self._broken[method] = error

    def heal(self, method: str) -> None:
        self._broken.pop(method, None)

    def slow_down(self, method: str, seconds: float) -> None:
        """`method` answers only after `seconds` (0 restores it): a slow or loaded Slack."""
        self._latency[method] = seconds

    def calls_to(self, method: str) -> list[Call]:
        return [call for call in self.calls if call.method == method]

    def thread(self, channel: str, thread_ts: str) -> list[dict[str, Any]]:
        """The thread's root (when it exists) and its replies, oldest first."""
        return [m for m in self.messages.get(channel, []) if m["ts"] == thread_ts or m.get("thread_ts") == thread_ts]

    def top_level(self, channel: str) -> list[dict[str, Any]]:
        return [m for m in self.messages.get(channel, []) if not m.get("thread_ts") or m["thread_ts"] == m["ts"]]

    def message(self, channel: str, ts: str) -> dict[str, Any]:
        for message in self.messages.get(channel, []):
            if message["ts"] == ts:
                return message
        raise KeyError(f"no message {ts} in {channel}")

    def post_as_user(self, channel: str, user: str, text: str, thread_ts: str | None = None) -> dict[str, Any]:
        """A message a person wrote (for conversations.replies and reactions)."""
        return self._store(channel, {"user": user, "text": text, "thread_ts": thread_ts})

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)

    async def wait_for_call(self, method: str, count: int = 1, timeout: float = 5.0) -> list[Call]:
        await self.wait_for(lambda: len(self.calls_to(method)) >= count, timeout)
        return self.calls_to(method)

    # ---- Socket Mode -----------------------------------------------------------------

    async def wait_socket(self, timeout: float = 5.0) -> None:
        await self.wait_for(lambda: bool(self._sockets), timeout)

    async def push_envelope(self, kind: str, payload: dict[str, Any], *, retry_attempt: int = 0) -> str:
        """Send an envelope (events_api, interactive) to the connected app; returns its id."""
        envelope_id = str(uuid.uuid4())
        envelope = {
            "envelope_id": envelope_id,
            "type": kind,
            "payload": payload,
            "accepts_response_payload": False,
            "retry_attempt": retry_attempt,
            "retry_reason": "timeout" if retry_attempt else "",
        }
        await self._sockets[-1].send_str(json.dumps(envelope))
        return envelope_id

    async def wait_ack(self, envelope_id: str, timeout: float = 5.0) -> dict[str, Any]:
        await self.wait_for(lambda: any(a.get("envelope_id") == envelope_id for a in self.acks), timeout)
        return next(a for a in self.acks if a.get("envelope_id") == envelope_id)

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        await ws.send_str(json.dumps({"type": "hello", "num_connections": 1, "connection_info": {"app_id": "A1"}}))
        async with self._changed:
            self._sockets.append(ws)
            self._changed.notify_all()
        async for frame in ws:
            if frame.type == WSMsgType.TEXT:
                async with self._changed:
                    self.acks.append(json.loads(frame.data))
                    self._changed.notify_all()
        self._sockets.remove(ws)
        return ws

    # ---- Web API plumbing ------------------------------------------------------------

    async def _params(self, request: web.Request) -> dict[str, Any]:
        params: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            body = await request.json()
            params.update(body if isinstance(body, dict) else {})
        elif request.can_read_body:
            params.update({k: v for k, v in (await request.post()).items() if isinstance(v, str)})
        for name in _JSON_FIELDS:
            if isinstance(params.get(name), str) and params[name][:1] in "[{":
                params[name] = json.loads(params[name])
        return params

    def _token(self, request: web.Request, params: dict[str, Any]) -> str:
        header = request.headers.get("Authorization", "")
        return header.removeprefix("Bearer ").strip() or str(params.pop("token", ""))

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await self._params(request)
        token = self._token(request, params)
        async with self._changed:
            self.calls.append(Call(method, params, token))
            self._changed.notify_all()
        if self._latency.get(method):
            await asyncio.sleep(self._latency[method])
        window = self._windows.get(method)
        if window is not None:
            per_s, last = window
            left = last + per_s - time.monotonic()
            if left > 0:
                headers = {"Retry-After": str(max(1, int(left + 0.999)))}
                return web.json_response({"ok": False, "error": "ratelimited"}, status=429, headers=headers)
            self._windows[method] = (per_s, time.monotonic())
        fault = self._take_fault(method)
        if fault is not None:
            headers = {"Retry-After": str(int(fault.retry_after))} if fault.retry_after is not None else {}
            return web.json_response({"ok": False, "error": fault.error}, status=fault.status, headers=headers)
        if method in self._broken:
            return web.json_response({"ok": False, "error": self._broken[method]})
        expected = self.app_token if method == "apps.connections.open" else self.token
        if token != expected:
            return web.json_response({"ok": False, "error": "invalid_auth"})
        handler = _HANDLERS.get(method)
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method"})
        try:
            async with self._changed:
                result = handler(self, params)
                self._changed.notify_all()
        except SlackError as exc:
            return web.json_response({"ok": False, "error": exc.code})
        except (KeyError, TypeError, ValueError) as exc:
            return web.json_response({"ok": False, "error": "invalid_arguments", "detail": str(exc)})
        return web.json_response({"ok": True, **result})

    def _take_fault(self, method: str) -> _Fault | None:
        queue = self._faults.get(method)
        if not queue:
            return None
        fault = queue[0]
        fault.remaining -= 1
        if fault.remaining <= 0:
            queue.pop(0)
        return fault

    async def _upload(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        if file_id not in self.files:
            return web.Response(status=404, text="no such upload")
        self.files[file_id]["content"] = await request.read()
        return web.Response(text=f"OK - {len(self.files[file_id]['content'])}")

    # ---- state helpers ---------------------------------------------------------------

    def _next_ts(self) -> str:
        n = next(self._counter)
        return f"{1_700_000_000 + n}.{n:06d}"

    def _store(self, channel: str, fields: dict[str, Any]) -> dict[str, Any]:
        ts = self._next_ts()
        message = {"type": "message", "ts": ts, **{k: v for k, v in fields.items() if v not in (None, "")}}
        self.messages.setdefault(channel, []).append(message)
        return message

    def _find(self, channel: str, ts: str) -> dict[str, Any]:
        try:
            return self.message(channel, ts)
        except KeyError:
            raise SlackError("message_not_found") from None


# ---- Web API methods ---------------------------------------------------------------------


def _auth_test(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    return {
        "url": "https://fake.slack.com/",
        "team": "Fake",
        "user": "gateway",
        "team_id": fake.team_id,
        "user_id": fake.bot_user_id,
        "bot_id": fake.bot_id,
    }


def _dm_of(user: str) -> str:
    return "D" + user[1:]  # the bot's DM channel with a user (a D… id, not the user id)


def _open_conversation(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    users = [u for u in str(p.get("users", "")).split(",") if u]
    if len(users) != 1:
        raise SlackError("not_enough_users" if not users else "invalid_arguments")
    return {"channel": {"id": _dm_of(users[0])}}


def _post_message(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    if not p.get("text") and not p.get("blocks"):
        raise SlackError("no_text")
    if p["channel"][:1] in ("U", "W"):  # Slack posts to the app's DM with that user and names it
        p = {**p, "channel": _dm_of(p["channel"])}
    message = fake._store(
        p["channel"],
        {
            "user": fake.bot_user_id,
            "bot_id": fake.bot_id,
            "text": p.get("text"),
            "blocks": p.get("blocks"),
            "thread_ts": p.get("thread_ts"),
        },
    )
    return {"channel": p["channel"], "ts": message["ts"], "message": message}


def _update(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    message = fake._find(p["channel"], p["ts"])
    message["text"] = p.get("text", message.get("text"))
    if "blocks" in p:
        message["blocks"] = p["blocks"]
    message["edits"] = message.get("edits", 0) + 1
    return {"channel": p["channel"], "ts": p["ts"], "text": message["text"]}


def _delete(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    fake.messages[p["channel"]].remove(fake._find(p["channel"], p["ts"]))
    return {"channel": p["channel"], "ts": p["ts"]}


def _post_ephemeral(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    ts = fake._next_ts()
    fake.ephemerals.append(
        {
            "channel": p["channel"],
            "user": p["user"],
            "text": p.get("text", ""),
            "thread_ts": p.get("thread_ts"),
            "ts": ts,
        }
    )
    return {"message_ts": ts}


# Streamed chunks as chat.startStream / appendStream / stopStream take them (slack_sdk's
# models/messages/chunk.py; docs.slack.dev/reference/methods/chat.appendStream#chunks): an
# unknown chunk type, a missing field, an unknown field or an unknown task status is refused.
_CHUNK_FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "markdown_text": (frozenset({"text"}), frozenset()),
    "task_update": (frozenset({"id", "title", "status"}), frozenset({"details", "output", "sources"})),
    "plan_update": (frozenset({"title"}), frozenset()),
    "blocks": (frozenset({"blocks"}), frozenset()),
}
TASK_STATUSES = frozenset({"pending", "in_progress", "complete", "error"})
TASK_DISPLAY_MODES = frozenset({"timeline", "plan"})


def _chunks(p: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = p.get("chunks")
    if chunks is None:
        return []
    if not isinstance(chunks, list):
        raise SlackError("invalid_chunks")
    for chunk in chunks:
        kind = chunk.get("type") if isinstance(chunk, dict) else None
        if kind not in _CHUNK_FIELDS:
            raise SlackError("invalid_chunks")
        required, optional = _CHUNK_FIELDS[kind]
        present = set(chunk) - {"type"}
        if not required <= present or present - required - optional:
            raise SlackError("invalid_chunks")
        if kind == "task_update" and (chunk["status"] not in TASK_STATUSES or not str(chunk["title"]).strip()):
            raise SlackError("invalid_chunks")
    return list(chunks)


def _take_chunks(message: dict[str, Any], p: dict[str, Any]) -> None:
    """Text and task cards of a streaming message: a task_update with a known id updates its card."""
    chunks = _chunks(p)
    text = p.get("markdown_text", "") + "".join(c["text"] for c in chunks if c["type"] == "markdown_text")
    message["text"] = message.get("text", "") + text
    tasks = message.setdefault("tasks", {})
    for chunk in chunks:
        if chunk["type"] == "task_update":
            tasks[chunk["id"]] = {**tasks.get(chunk["id"], {}), **chunk}
        elif chunk["type"] == "plan_update":
            message["plan_title"] = chunk["title"]
    message.setdefault("chunks", []).extend(chunks)


def _start_stream(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    if not p.get("thread_ts"):
        raise SlackError("invalid_arguments")
    if not p["channel"].startswith("D") and not (p.get("recipient_user_id") and p.get("recipient_team_id")):
        raise SlackError("invalid_arguments")  # recipients are required when streaming to channels
    mode = p.get("task_display_mode")
    if mode is not None and mode not in TASK_DISPLAY_MODES:
        raise SlackError("invalid_arguments")
    _chunks(p)  # refused before anything is posted
    message = fake._store(
        p["channel"],
        {
            "user": fake.bot_user_id,
            "thread_ts": p["thread_ts"],
            "streaming": True,
            "task_display_mode": mode,
            "recipient_user_id": p.get("recipient_user_id"),
            "recipient_team_id": p.get("recipient_team_id"),
        },
    )
    _take_chunks(message, p)
    return {"channel": p["channel"], "ts": message["ts"]}


def _append_stream(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    message = fake._find(p["channel"], p["ts"])
    if not message.get("streaming"):
        raise SlackError("message_not_in_streaming_state")
    _take_chunks(message, p)
    return {"channel": p["channel"], "ts": p["ts"]}


def _feedback_button(button: Any) -> bool:
    text = button.get("text") if isinstance(button, dict) else None
    return (
        isinstance(text, dict) and text.get("type") == "plain_text" and 0 < len(str(text.get("text") or "")) <= 75
        and 0 < len(str(button.get("value") or "")) <= 2000
        and len(str(button.get("accessibility_label") or "")) <= 75
        and not set(button) - {"text", "value", "accessibility_label"}
    )


def _check_context_actions(block: dict[str, Any]) -> None:
    """docs.slack.dev/reference/block-kit/blocks/context-actions-block: 1-5 elements, each
    `feedback_buttons` (both buttons) or `icon_button`."""
    elements = block.get("elements")
    if not isinstance(elements, list) or not 0 < len(elements) <= 5:
        raise SlackError("invalid_blocks")
    for element in elements:
        kind = element.get("type") if isinstance(element, dict) else None
        if kind == "feedback_buttons":
            buttons = (element.get("positive_button"), element.get("negative_button"))
            if not all(_feedback_button(button) for button in buttons):
                raise SlackError("invalid_blocks")
            if set(element) - {"type", "action_id", "positive_button", "negative_button"}:
                raise SlackError("invalid_blocks")
        elif kind != "icon_button":
            raise SlackError("invalid_blocks")


def _stop_stream(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    for block in p.get("blocks") or []:
        if block.get("type") == "context_actions":
            _check_context_actions(block)
    result = _append_stream(fake, p)
    message = fake._find(p["channel"], p["ts"])
    message["streaming"] = False
    if p.get("blocks"):
        message["blocks"] = p["blocks"]
    return result


def _set_status(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    loading = p.get("loading_messages")
    if loading is not None and (not isinstance(loading, list) or not all(isinstance(m, str) for m in loading)):
        raise SlackError("invalid_arguments")
    status = {"channel_id": p["channel_id"], "thread_ts": p["thread_ts"], "status": p["status"]}
    if loading is not None:
        status["loading_messages"] = loading
    fake.statuses.append(status)
    return {}


def _suggest(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    """assistant.threads.setSuggestedPrompts: up to four {title, message}. An agent app's call
    with a thread_ts "silently fails" (docs.slack.dev/reference/methods/assistant.threads.setSuggestedPrompts):
    answered ok, nothing shown."""
    prompts = p["prompts"]
    if not isinstance(prompts, list) or not 0 < len(prompts) <= 4:
        raise SlackError("invalid_arguments")
    for prompt in prompts:
        if not isinstance(prompt, dict) or set(prompt) != {"title", "message"} or not all(prompt.values()):
            raise SlackError("invalid_arguments")
    if fake.agent_view and p.get("thread_ts"):
        return {}
    fake.suggested.append({k: p[k] for k in ("channel_id", "thread_ts", "title", "prompts") if k in p})
    return {}


SESSION_STATUSES = frozenset({"processing", "active", "suspended", "closed"})  # agents.sessions.setStatus


def _session_status(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    if p["status"] not in SESSION_STATUSES:
        raise SlackError("invalid_arguments")
    fake.sessions[(p["channel_id"], p.get("thread_ts") or "")] = p["status"]
    return {}


def _reaction_add(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    key = (p["channel"], p["timestamp"], p["name"])
    fake._find(p["channel"], p["timestamp"])
    if key in fake.reactions:
        raise SlackError("already_reacted")
    fake.reactions.add(key)
    return {}


def _reaction_remove(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    key = (p["channel"], p["timestamp"], p["name"])
    if key not in fake.reactions:
        raise SlackError("no_reaction")
    fake.reactions.discard(key)
    return {}


def _in_range(ts: str, p: dict[str, Any]) -> bool:
    inclusive = str(p.get("inclusive", "0")).lower() in ("1", "true")
    value = float(ts)
    if "oldest" in p and (value < float(p["oldest"]) or (not inclusive and value == float(p["oldest"]))):
        return False
    return not ("latest" in p and (value > float(p["latest"]) or (not inclusive and value == float(p["latest"]))))


def _replies(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    thread = fake.thread(p["channel"], p["ts"])
    if not thread:
        raise SlackError("thread_not_found")
    root = thread[0]
    if root.get("thread_ts") and root["thread_ts"] != root["ts"]:  # asked with a reply's ts
        thread = fake.thread(p["channel"], root["thread_ts"])
    return {"messages": [m for m in thread if _in_range(m["ts"], p)], "has_more": False}


def _upload_url(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    file_id = f"F{next(fake._counter):06d}"
    fake.files[file_id] = {
        "id": file_id,
        "name": p["filename"],
        "length": int(p["length"]),
        "snippet_type": p.get("snippet_type"),
        "shared": False,
    }
    return {"upload_url": f"{fake.url}/upload/{file_id}", "file_id": file_id}


def _complete_upload(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    done = []
    for item in p["files"]:
        record = fake.files[item["id"]]
        record.update(title=item.get("title"), channel=p.get("channel_id"), thread_ts=p.get("thread_ts"), shared=True)
        done.append({"id": record["id"], "name": record["name"], "title": record.get("title")})
    if p.get("channel_id"):
        fake._store(
            p["channel_id"],
            {
                "user": fake.bot_user_id,
                "text": p.get("initial_comment"),
                "thread_ts": p.get("thread_ts"),
                "files": done,
            },
        )
    return {"files": done}


def _users_info(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    if p["user"] not in fake.users:
        raise SlackError("user_not_found")
    return {"user": fake.users[p["user"]]}


def _connections_open(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    return {"url": fake.url.replace("http://", "ws://") + f"/socket?ticket={uuid.uuid4()}"}


def _files_info(fake: FakeSlack, p: dict[str, Any]) -> dict[str, Any]:
    return fake.shared.files_info(p)


_HANDLERS: dict[str, Callable[[FakeSlack, dict[str, Any]], dict[str, Any]]] = {
    "files.info": _files_info,
    "auth.test": _auth_test,
    "chat.postMessage": _post_message,
    "conversations.open": _open_conversation,
    "chat.update": _update,
    "chat.delete": _delete,
    "chat.postEphemeral": _post_ephemeral,
    "chat.startStream": _start_stream,
    "chat.appendStream": _append_stream,
    "chat.stopStream": _stop_stream,
    "assistant.threads.setStatus": _set_status,
    "agents.sessions.setStatus": _session_status,
    "assistant.threads.setSuggestedPrompts": _suggest,
    "reactions.add": _reaction_add,
    "reactions.remove": _reaction_remove,
    "conversations.replies": _replies,
    "files.getUploadURLExternal": _upload_url,
    "files.completeUploadExternal": _complete_upload,
    "users.info": _users_info,
    "apps.connections.open": _connections_open,
}


# ---- signed inbound requests -------------------------------------------------------------

Forgery = Literal["bad", "stale", "missing"]


@dataclass
class Reply:
    status: int
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class SlackEventSender:
    """Posts Events API and interactivity requests to the gateway, signed like Slack signs them."""

    def __init__(self, url: str, signing_secret: str, *, team_id: str = "T1", api_app_id: str = "A1"):
        self.url = url
        self.signing_secret = signing_secret
        self.team_id = team_id
        self.api_app_id = api_app_id
        self._session: ClientSession | None = None
        self._ts = itertools.count(1)

    async def __aenter__(self) -> SlackEventSender:
        self._session = ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    def next_ts(self) -> str:
        """A fresh message ts, as Slack would stamp a new message."""
        n = next(self._ts)
        return f"{1_690_000_000 + n}.{n:06d}"

    def sign(self, body: str, timestamp: int | None = None) -> dict[str, str]:
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        digest = hmac.new(self.signing_secret.encode(), f"v0:{stamp}:{body}".encode(), hashlib.sha256).hexdigest()
        return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": f"v0={digest}"}

    def _headers(self, body: str, forge: Forgery | None, retry_num: int | None, content_type: str) -> dict[str, str]:
        headers = {"Content-Type": content_type}
        if forge == "stale":
            headers.update(self.sign(body, int(time.time()) - 6 * 60))
        elif forge == "bad":
            headers.update(self.sign(body))
            headers["X-Slack-Signature"] = "v0=" + "0" * 64
        elif forge is None:
            headers.update(self.sign(body))
        if retry_num is not None:
            headers.update({"X-Slack-Retry-Num": str(retry_num), "X-Slack-Retry-Reason": "http_timeout"})
        return headers

    async def post(
        self,
        body: str,
        *,
        forge: Forgery | None = None,
        retry_num: int | None = None,
        content_type: str = "application/json",
    ) -> Reply:
        assert self._session is not None, "use `async with SlackEventSender(...)`"
        headers = self._headers(body, forge, retry_num, content_type)
        async with self._session.post(self.url, data=body.encode(), headers=headers) as response:
            return Reply(response.status, await response.text())

    def envelope(self, event: dict[str, Any], event_id: str | None = None) -> dict[str, Any]:
        return {
            "token": "legacy",
            "team_id": self.team_id,
            "api_app_id": self.api_app_id,
            "event": event,
            "type": "event_callback",
            "event_id": event_id or f"Ev{uuid.uuid4().hex[:10].upper()}",
            "event_time": int(time.time()),
            "authorizations": [{"team_id": self.team_id, "user_id": "UBOT", "is_bot": True}],
        }

    async def event(
        self,
        event: dict[str, Any],
        *,
        event_id: str | None = None,
        forge: Forgery | None = None,
        retry_num: int | None = None,
    ) -> Reply:
        return await self.post(json.dumps(self.envelope(event, event_id)), forge=forge, retry_num=retry_num)

    async def url_verification(self, challenge: str, *, forge: Forgery | None = None) -> Reply:
        body = {"token": "legacy", "challenge": challenge, "type": "url_verification"}
        return await self.post(json.dumps(body), forge=forge)

    def block_actions(
        self,
        *,
        user: str,
        channel: str,
        message_ts: str,
        value: str,
        thread_ts: str | None = None,
        action_id: str = "gw:0:0",
        action_ts: str | None = None,
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "message", "ts": message_ts, "user": "UBOT"}
        username = PEOPLE.get(user, (user.lower(), ""))[0]
        if thread_ts:
            message["thread_ts"] = thread_ts
        return {
            "type": "block_actions",
            "team": {"id": self.team_id},
            "api_app_id": self.api_app_id,
            # Slack names the tapper by username here, never by display name
            "user": {"id": user, "username": username, "name": username, "team_id": self.team_id},
            "container": {"type": "message", "message_ts": message_ts, "channel_id": channel, "is_ephemeral": False},
            "channel": {"id": channel},
            "message": message,
            "trigger_id": f"trig-{uuid.uuid4().hex[:8]}",
            "response_url": "https://hooks.invalid/actions",
            "actions": [
                {
                    "type": "button",
                    "action_id": action_id,
                    "block_id": "gw_actions_0_0",
                    "value": value,
                    "action_ts": action_ts or f"{time.time():.6f}",
                }
            ],
        }

    def feedback_actions(self, *, user: str, channel: str, message_ts: str, value: str,
                         thread_ts: str | None = None, action_ts: str | None = None) -> dict[str, Any]:
        """A press on a `feedback_buttons` element (bolt-js FeedbackButtonsAction: type, action_id,
        block_id, action_ts, value, text)."""
        payload = self.block_actions(user=user, channel=channel, message_ts=message_ts, value=value,
                                     thread_ts=thread_ts, action_id="gw_feedback", action_ts=action_ts)
        action = payload["actions"][0]
        action.update(type="feedback_buttons", block_id="gw_feedback",
                      text={"type": "plain_text", "text": "👍" if value == "up" else "👎"})
        return payload

    async def feedback(self, *, forge: Forgery | None = None, **fields: Any) -> Reply:
        body = urlencode({"payload": json.dumps(self.feedback_actions(**fields))})
        return await self.post(body, forge=forge, content_type="application/x-www-form-urlencoded")

    async def block_action(self, *, forge: Forgery | None = None, **fields: Any) -> Reply:
        body = urlencode({"payload": json.dumps(self.block_actions(**fields))})
        return await self.post(body, forge=forge, content_type="application/x-www-form-urlencoded")

    # ---- event builders --------------------------------------------------------------

    def mention(
        self, channel: str, user: str, text: str, *, ts: str | None = None, thread_ts: str | None = None
    ) -> dict[str, Any]:
        event = {
            "type": "app_mention",
            "channel": channel,
            "user": user,
            "text": text,
            "ts": ts or self.next_ts(),
            "team": self.team_id,
            "event_ts": ts,
        }
        if thread_ts:
            event["thread_ts"] = thread_ts
        return event

    def message(
        self,
        channel: str,
        user: str | None,
        text: str,
        *,
        ts: str | None = None,
        thread_ts: str | None = None,
        channel_type: str = "channel",
        **extra: Any,
    ) -> dict[str, Any]:
        event = {
            "type": "message",
            "channel": channel,
            "text": text,
            "ts": ts or self.next_ts(),
            "channel_type": channel_type,
            "team": self.team_id,
            **extra,
        }
        if user is not None:
            event["user"] = user
        if thread_ts:
            event["thread_ts"] = thread_ts
        return event

    def home_opened(self, user: str, channel: str, tab: str = "messages") -> dict[str, Any]:
        """`app_home_opened`: the person opened the app's Messages (or Home) tab; `channel` is
        their DM with the app."""
        return {"type": "app_home_opened", "user": user, "channel": channel, "tab": tab, "event_ts": self.next_ts()}

    def assistant_thread_started(self, user: str, channel: str, thread_ts: str) -> dict[str, Any]:
        """`assistant_thread_started` (the assistant view): a new assistant thread."""
        return {
            "type": "assistant_thread_started",
            "assistant_thread": {"user_id": user, "channel_id": channel, "thread_ts": thread_ts, "context": {}},
            "event_ts": self.next_ts(),
        }

    def context_changed(self, channel: str) -> dict[str, Any]:
        """`app_context_changed` as docs.slack.dev shows it: only the context's entities."""
        entity = {"type": "slack#/types/channel_id", "value": channel, "team_id": self.team_id}
        return {"type": "app_context_changed", "context": {"entities": [entity]}}

    def session_stopped(
        self, channel: str, thread_ts: str, user: str, streaming: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """`agent_session_stopped` (docs.slack.dev/reference/events/agent_session_stopped): the
        stop button pressed while the thread's agent session was processing."""
        return {"type": "agent_session_stopped", "channel": channel, "thread_ts": thread_ts, "user": user,
                "streaming_message_ts": list(streaming), "event_ts": self.next_ts()}

    def dm(self, channel: str, user: str, text: str, **fields: Any) -> dict[str, Any]:
        return self.message(channel, user, text, channel_type="im", **fields)

    def changed(
        self, previous: dict[str, Any], text: str, *, channel_type: str = "channel", edited_by: str | None = None
    ) -> dict[str, Any]:
        """`message_changed` for the message event `previous` (as it was delivered), now saying
        `text`: the event has its own ts, the message keeps its ts and gains `edited`."""
        ts = self.next_ts()
        old = {k: v for k, v in previous.items() if k not in ("channel", "channel_type", "event_ts")}
        old["type"] = "message"
        new = {**old, "text": text, "edited": {"user": edited_by or previous.get("user"), "ts": ts}}
        return {
            "type": "message",
            "subtype": "message_changed",
            "hidden": True,
            "channel": previous["channel"],
            "channel_type": channel_type,
            "ts": ts,
            "event_ts": ts,
            "message": new,
            "previous_message": old,
        }

    def deleted(self, previous: dict[str, Any], *, channel_type: str = "channel") -> dict[str, Any]:
        """`message_deleted` for the message event `previous`."""
        ts = self.next_ts()
        old = {k: v for k, v in previous.items() if k not in ("channel", "channel_type", "event_ts")}
        old["type"] = "message"
        return {
            "type": "message",
            "subtype": "message_deleted",
            "hidden": True,
            "channel": previous["channel"],
            "channel_type": channel_type,
            "ts": ts,
            "event_ts": ts,
            "deleted_ts": previous["ts"],
            "previous_message": old,
        }

    def reaction(
        self, channel: str, ts: str, user: str, name: str, *, item_user: str = "UBOT", added: bool = True
    ) -> dict[str, Any]:
        """`reaction_added` / `reaction_removed` on the message `ts` (written by `item_user`)."""
        return {
            "type": "reaction_added" if added else "reaction_removed",
            "user": user,
            "reaction": name,
            "item_user": item_user,
            "item": {"type": "message", "channel": channel, "ts": ts},
            "event_ts": self.next_ts(),
        }


# ---- an in-memory core for channel tests -------------------------------------------------

MemoryState = MemoryChannelState


class RecordingSubmit:
    """A submit that stores events once per event id (like the inbox) and records every call.

    `answers[token]` is the SubmitResult given for a button press with that token;
    `failure` makes the next calls raise (a database outage).
    """

    def __init__(self, state: MemoryState | None = None) -> None:
        from gateway.events import SubmitResult

        self._result = SubmitResult
        self.state = state
        self.calls: list[list[Any]] = []
        self.stored: dict[str, Any] = {}
        self.answers: dict[str, Any] = {}
        self.failure: Exception | None = None

    @property
    def events(self) -> list[Any]:
        return list(self.stored.values())

    async def __call__(self, events: Any, *, cursor: tuple[str, str] | None = None) -> list[Any]:
        self.calls.append(list(events))
        if self.failure is not None:
            raise self.failure
        results = []
        for event in events:
            duplicate = event.event_id in self.stored
            self.stored.setdefault(event.event_id, event)
            if self.state is not None and event.kind == "message":
                self.state.threads.add(event.thread)
            answer = self.answers.get(getattr(event, "token", None))
            results.append(answer or self._result(event.event_id, duplicate=duplicate))
        return results


class FakeClock:
    """A monotonic clock the test moves by hand (stream throttling without sleeping)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
PEOPLE = {"U1": ("ann", "Ann"), "U2": ("bob", "Bob")}  # user id -> (username, display name)


@dataclass
class Harness:
    fake: FakeSlack
    channel: Any
    state: MemoryState
    submit: RecordingSubmit
    events: SlackEventSender
    clock: FakeClock


def slack_config(fake: FakeSlack, **overrides: Any) -> Any:
    from gateway.config import SlackConfig

    settings: dict[str, Any] = {
        "bot_token": fake.token,
        "signing_secret": SIGNING_SECRET,
        "api_base_url": fake.base_url,
        "send_interval_s": 0,
        **overrides,
    }
    return SlackConfig(**settings)


class channel_harness:
    """`async with channel_harness(**config) as h`: the fake, a started SlackChannel whose
    routes() are mounted on a small aiohttp app, and a signed event sender pointed at it."""

    def __init__(self, **config: Any) -> None:
        self._config = config
        self._stack: list[Any] = []

    async def __aenter__(self) -> Harness:
        from channels.slack.channel import SlackChannel

        fake = await FakeSlack().__aenter__()
        self._stack.append(fake)
        state = MemoryState()
        submit = RecordingSubmit(state)
        clock = FakeClock()
        channel = SlackChannel(slack_config(fake, **self._config), state, clock=clock)
        app = web.Application()
        for method, path, handler in channel.routes():
            app.router.add_route(method, path, handler)
        runner = web.AppRunner(app)
        await runner.setup()
        self._stack.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        await channel.start(submit)
        self._stack.append(channel)
        port = runner.addresses[0][1]
        sender = await SlackEventSender(f"http://127.0.0.1:{port}/slack/events", SIGNING_SECRET).__aenter__()
        self._stack.append(sender)
        return Harness(fake, channel, state, submit, sender, clock)

    async def __aexit__(self, *exc: object) -> None:
        for item in reversed(self._stack):
            if isinstance(item, web.AppRunner):
                await item.cleanup()
            elif isinstance(item, (FakeSlack, SlackEventSender)):
                await item.__aexit__(None, None, None)
            else:
                await item.stop()
