"""The console's aiohttp application, mounted at /admin on the gateway's HTTP server: the
login, the session and CSRF checks (pages), the bearer check (API), templates and the stylesheet."""

from __future__ import annotations

import logging
import math

import jinja2
from aiohttp import web

from gateway.admin import api, pages
from gateway.admin.auth import COOKIE, LoginLimiter, Sessions, bearer, csrf_matches, token_matches
from gateway.admin.keys import (
    API_USER_HEADER,
    HERE,
    LIMITER,
    OPEN_PATHS,
    OPS,
    PREFIX,
    SESSION,
    SESSIONS,
    TEMPLATES,
    USER,
    NotFound,
    client_of,
)
from gateway.admin.operations import Operations

log = logging.getLogger(__name__)

def _api_user(request: web.Request) -> str:
    return (request.headers.get(API_USER_HEADER) or "api").strip()[:64] or "api"


async def _api(request: web.Request, handler):  # noqa: ANN001, ANN202
    """The bearer check, limited like logins (one budget of guesses per client address)."""
    limiter, client = request.app[LIMITER], client_of(request)
    wait = limiter.blocked(client)
    if wait:
        return web.json_response(
            {"error": f"too many wrong tokens: try again in {wait:.0f} s"}, status=429,
            headers={"Retry-After": str(math.ceil(wait))},
        )
    if not token_matches(bearer(request.headers.get("Authorization", "")), request.app[OPS].config.admin.token):
        limiter.failed(client)
        return web.json_response({"error": "missing or wrong bearer token"}, status=401)
    limiter.succeeded(client)
    request[USER] = _api_user(request)
    try:
        return await handler(request)
    except NotFound as exc:
        return web.json_response({"error": str(exc)}, status=404)


@web.middleware
async def guard(request: web.Request, handler):  # noqa: ANN001, ANN201
    app = request.app
    if request.path.startswith(f"{PREFIX}/api/"):
        return await _api(request, handler)
    if request.path in OPEN_PATHS:
        return await handler(request)
    session = await app[SESSIONS].get(request.cookies.get(COOKIE))
    if session is None:
        if request.method == "GET":
            raise web.HTTPSeeOther(f"{PREFIX}/login")
        return web.Response(text="not logged in", status=403)
    request[SESSION] = session
    request[USER] = session.user
    if request.method == "POST":
        form = await request.post()
        if not csrf_matches(session, str(form.get("csrf", ""))):
            return web.Response(text="missing or wrong CSRF token: reload the page and try again", status=403)
    try:
        return await handler(request)
    except NotFound as exc:
        return pages.not_found(request, str(exc))
    except web.HTTPNotFound:  # no page at this address
        return pages.not_found(request, f"There is no page {request.path}.")


def build_admin(ops: Operations, guesses: LoginLimiter | None = None) -> web.Application:
    app = web.Application(middlewares=[guard])
    app[OPS] = ops
    app[SESSIONS] = Sessions(ops.store.console)
    app[LIMITER] = guesses or LoginLimiter()
    app[TEMPLATES] = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )
    app.router.add_static("/static", HERE / "static")
    pages.add_routes(app)
    api.add_routes(app)
    return app


async def _to_overview(request: web.Request) -> web.Response:
    raise web.HTTPFound(f"{PREFIX}/")


def mount_console(root: web.Application, ops: Operations, guesses: LoginLimiter | None = None) -> None:
    root.router.add_get(PREFIX, _to_overview)
    root.add_subapp(PREFIX, build_admin(ops, guesses))
