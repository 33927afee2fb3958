"""The JSON admin API (/admin/api/, Authorization: Bearer <token>): the pages' data and actions.
docs/admin-api.md lists the endpoints."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.admin import actions, queries
from gateway.admin.keys import OPS, USER, record_id
from gateway.config.redaction import redacted_config


def reply(data: Any, status: int = 200) -> web.Response:
    return web.json_response(queries.jsonable(data), status=status)


def acted(outcome: actions.Outcome) -> web.Response:
    return reply({"ok": outcome.ok, "message": outcome.message}, status=200 if outcome.ok else 409)


async def overview(request: web.Request) -> web.Response:
    return reply(await queries.overview(request.app[OPS]))


async def config(request: web.Request) -> web.Response:
    """The effective configuration as the console shows it: harmless keys only, the rest masked."""
    return reply(redacted_config(request.app[OPS].config))


async def run(request: web.Request) -> web.Response:
    detail = await queries.run_detail(request.app[OPS], record_id(request, "run_id", "run"))
    return reply(detail) if detail is not None else reply({"error": "no such run"}, status=404)


async def runs(request: web.Request) -> web.Response:
    try:
        return reply(await queries.runs(request.app[OPS], request.query))
    except ValueError as exc:
        return reply({"error": str(exc)}, status=400)


async def queues(request: web.Request) -> web.Response:
    return reply(await queries.queues(request.app[OPS]))


async def approvals(request: web.Request) -> web.Response:
    return reply(await queries.approvals(request.app[OPS]))


async def decide_approval(request: web.Request) -> web.Response:
    approve = request.match_info["action"] == "approve"
    return acted(
        await actions.decide_prompt(
            request.app[OPS], record_id(request, "prompt_id", "approval request"), approve, request[USER]
        )
    )


async def sessions(request: web.Request) -> web.Response:
    return reply(await queries.sessions(request.app[OPS], request.query.get("q", "")))


async def session(request: web.Request) -> web.Response:
    detail = await queries.session_detail(request.app[OPS], record_id(request, "session_id", "session"))
    return reply(detail) if detail is not None else reply({"error": "no such session"}, status=404)


async def jobs(request: web.Request) -> web.Response:
    return reply(await queries.jobs(request.app[OPS]))


async def job_action(request: web.Request) -> web.Response:
    match = request.match_info
    return acted(await actions.job_action(request.app[OPS], match["name"], match["action"], request[USER]))


async def access(request: web.Request) -> web.Response:
    return reply(await queries.access(request.app[OPS]))


async def decide_pairing(request: web.Request) -> web.Response:
    approve = request.match_info["action"] == "approve"
    request_id = record_id(request, "request_id", "pairing request")
    return acted(await actions.decide_pairing(request.app[OPS], request_id, approve, request[USER]))


async def revoke(request: web.Request) -> web.Response:
    return acted(await actions.revoke_grant(request.app[OPS], request.match_info["grant_id"], request[USER]))


async def audit(request: web.Request) -> web.Response:
    try:
        return reply(await queries.audit(request.app[OPS], request.query))
    except ValueError as exc:
        return reply({"error": str(exc)}, status=400)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/overview", overview)
    app.router.add_get("/api/config", config)
    app.router.add_get("/api/runs", runs)
    app.router.add_get("/api/runs/{run_id}", run)
    app.router.add_get("/api/queues", queues)
    app.router.add_get("/api/approvals", approvals)
    app.router.add_post("/api/approvals/{prompt_id:\\d+}/{action:approve|deny}", decide_approval)
    app.router.add_get("/api/sessions", sessions)
    app.router.add_get("/api/sessions/{session_id}", session)
    app.router.add_get("/api/jobs", jobs)
    app.router.add_post("/api/jobs/{name}/{action:run-now|kill|enable|disable}", job_action)
    app.router.add_get("/api/access", access)
    app.router.add_get("/api/audit", audit)
    app.router.add_post("/api/access/requests/{request_id:\\d+}/{action:approve|deny}", decide_pairing)
    app.router.add_post("/api/access/grants/{grant_id:\\d+}/revoke", revoke)
