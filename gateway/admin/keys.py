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


def client_of(request: web.Request) -> str:
    return request.remote or "?"


def render(request: web.Request, name: str, status: int = 200, **context: Any) -> web.Response:
    session = request.get(SESSION)
    page = request.app[TEMPLATES].get_template(name).render(
        prefix=PREFIX, user=session.user if session else None, csrf=session.csrf if session else "",
        notice=request.query.get("notice", ""), **context,
    )
    return web.Response(text=page, status=status, content_type="text/html")
