"""What the console's handlers share: the application and request keys, and rendering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

from gateway.admin.auth import ConsoleSession, LoginLimiter, Sessions
from gateway.admin.operations import Operations

HERE = Path(__file__).parent
PREFIX = "/admin"
OPEN_PATHS = {f"{PREFIX}/login", f"{PREFIX}/static/console.css"}
API_USER_HEADER = "X-Admin-User"  # who is acting, for the records (the token says only that they may)

OPS: web.AppKey[Operations] = web.AppKey("ops", Operations)
SESSIONS: web.AppKey[Sessions] = web.AppKey("sessions", Sessions)
LIMITER: web.AppKey[LoginLimiter] = web.AppKey("limiter", LoginLimiter)
USER: web.RequestKey[str] = web.RequestKey("user", str)
SESSION: web.RequestKey[ConsoleSession] = web.RequestKey("session", ConsoleSession)
TEMPLATES: web.AppKey[jinja2.Environment] = web.AppKey("templates", jinja2.Environment)


MAX_ID = 2**63 - 1  # the largest id a database column holds


class NotFound(Exception):
    """What the address names is not there: a page answers with the console's 404 page, the API
    with a JSON 404 (the message says what was looked for)."""


def record_id(request: web.Request, name: str, what: str) -> int:
    """The id in the address; `NotFound` for one no row can have (not a number, or past what
    the database's columns hold: asking for it would be an error, not an answer)."""
    text = request.match_info[name]
    if not (text.isascii() and text.isdigit() and len(text) <= 19 and int(text) <= MAX_ID):
        raise NotFound(f"No {what} {text[:40]}.")
    return int(text)


def client_of(request: web.Request) -> str:
    return request.remote or "?"


def render(request: web.Request, name: str, status: int = 200, **context: Any) -> web.Response:
    session = request.get(SESSION)
    page = request.app[TEMPLATES].get_template(name).render(
        prefix=PREFIX, user=session.user if session else None, csrf=session.csrf if session else "",
        notice=request.query.get("notice", ""), **context,
    )
    return web.Response(text=page, status=status, content_type="text/html")
