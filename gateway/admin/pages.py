"""The console's HTML pages and forms (server-rendered; a form answers with a redirect)."""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from gateway.admin import actions, queries
from gateway.admin.auth import COOKIE, SESSION_TTL_S, token_matches
from gateway.admin.keys import LIMITER, OPS, PREFIX, SESSIONS, USER, NotFound, client_of, record_id, render
from gateway.admin.skills_page import skills
from gateway.config.redaction import redacted_config


def _back(path: str, outcome: actions.Outcome) -> web.HTTPSeeOther:
    mark = "" if outcome.ok else "⚠ "
    return web.HTTPSeeOther(f"{PREFIX}{path}?notice={quote(mark + outcome.message)}")


async def login_form(request: web.Request) -> web.Response:
    return render(request, "login.html", error="")


async def login(request: web.Request) -> web.Response:
    limiter, client = request.app[LIMITER], client_of(request)
    wait = limiter.blocked(client)
    if wait:
        return render(request, "login.html", status=429, error=f"Too many wrong tokens: try again in {wait:.0f} s.")
    form = await request.post()
    user = str(form.get("user", "")).strip()[:64] or "admin"
    audit = request.app[OPS].store.audit
    if not token_matches(str(form.get("token", "")), request.app[OPS].config.admin.token):
        limiter.failed(client)
        await audit.record_console_action(user=user, action="login", outcome="refused", detail={"client": client})
        return render(request, "login.html", status=401, error="Wrong token.")
    limiter.succeeded(client)
    await audit.record_console_action(user=user, action="login", detail={"client": client})
    session_id, _ = await request.app[SESSIONS].open(user)
    response = web.HTTPSeeOther(f"{PREFIX}/")
    response.set_cookie(
        COOKIE, session_id, max_age=int(SESSION_TTL_S), httponly=True, samesite="Strict", path=PREFIX,
        secure=request.secure,
    )
    raise response


async def logout(request: web.Request) -> web.Response:
    await request.app[SESSIONS].close(request.cookies.get(COOKIE))
    response = web.HTTPSeeOther(f"{PREFIX}/login")
    response.del_cookie(COOKIE, path=PREFIX)
    raise response


async def overview(request: web.Request) -> web.Response:
    ops = request.app[OPS]
    data = await queries.overview(ops)
    return render(request, "overview.html", page="overview", o=data, config=redacted_config(ops.config))


async def run(request: web.Request) -> web.Response:
    run_id = record_id(request, "run_id", "run")
    detail = await queries.run_detail(request.app[OPS], run_id)
    if detail is None:
        raise NotFound(f"No run {run_id}.")
    return render(request, "run.html", page="sessions", d=detail)


async def runs(request: web.Request) -> web.Response:
    try:
        data = await queries.runs(request.app[OPS], request.query)
    except ValueError as exc:
        empty = queries.empty_runs(request.query)
        return render(request, "runs.html", status=400, page="overview", r=empty, error=str(exc))
    return render(request, "runs.html", page="overview", r=data, error="")


async def queues(request: web.Request) -> web.Response:
    return render(request, "queues.html", page="overview", q=await queries.queues(request.app[OPS]))


def not_found(request: web.Request, what: str) -> web.Response:
    """A page that is not there (a run or session that does not exist, a mistyped address):
    the console's own 404 page, with the way back."""
    return render(request, "not_found.html", status=404, page="", what=what)


async def approvals(request: web.Request) -> web.Response:
    data = await queries.approvals(request.app[OPS])
    return render(request, "approvals.html", page="approvals", a=data)


async def decide_approval(request: web.Request) -> web.Response:
    approve = request.match_info["action"] == "approve"
    outcome = await actions.decide_prompt(
        request.app[OPS], record_id(request, "prompt_id", "approval request"), approve, request[USER]
    )
    raise _back("/approvals", outcome)


async def sessions(request: web.Request) -> web.Response:
    data = await queries.sessions(request.app[OPS], request.query.get("q", ""))
    return render(request, "sessions.html", page="sessions", s=data)


async def session(request: web.Request) -> web.Response:
    session_id = record_id(request, "session_id", "session")
    detail = await queries.session_detail(request.app[OPS], session_id)
    if detail is None:
        raise NotFound(f"No session {session_id}.")
    return render(request, "session.html", page="sessions", d=detail)


async def jobs(request: web.Request) -> web.Response:
    return render(request, "jobs.html", page="jobs", j=await queries.jobs(request.app[OPS]))


async def job_action(request: web.Request) -> web.Response:
    match = request.match_info
    outcome = await actions.job_action(request.app[OPS], match["name"], match["action"], request[USER])
    raise _back("/jobs", outcome)


async def access(request: web.Request) -> web.Response:
    return render(request, "access.html", page="access", a=await queries.access(request.app[OPS]))


async def decide_pairing(request: web.Request) -> web.Response:
    approve = request.match_info["action"] == "approve"
    outcome = await actions.decide_pairing(
        request.app[OPS], record_id(request, "request_id", "pairing request"), approve, request[USER]
    )
    raise _back("/access", outcome)


async def revoke(request: web.Request) -> web.Response:
    outcome = await actions.revoke_grant(request.app[OPS], request.match_info["grant_id"], request[USER])
    raise _back("/access", outcome)


async def audit(request: web.Request) -> web.Response:
    try:
        data = await queries.audit(request.app[OPS], request.query)
    except ValueError as exc:
        empty = queries.empty_audit(request.query)
        return render(request, "audit.html", status=400, page="audit", t=empty, error=str(exc))
    return render(request, "audit.html", page="audit", t=data, error="")


async def memory(request: web.Request) -> web.Response:
    data = await queries.memory(request.app[OPS], request.query.get("owner", "").strip())
    return render(request, "memory.html", page="memory", m=data)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)
    app.router.add_get("/", overview)
    app.router.add_get("/runs", runs)
    app.router.add_get("/runs/{run_id}", run)
    app.router.add_get("/queues", queues)
    app.router.add_get("/approvals", approvals)
    app.router.add_post("/approvals/{prompt_id:\\d+}/{action:approve|deny}", decide_approval)
    app.router.add_get("/sessions", sessions)
    app.router.add_get("/sessions/{session_id}", session)
    app.router.add_get("/jobs", jobs)
    app.router.add_post("/jobs/{name}/{action:run-now|kill|enable|disable}", job_action)
    app.router.add_get("/access", access)
    app.router.add_get("/audit", audit)
    app.router.add_get("/memory", memory)
    app.router.add_get("/skills", skills)
    app.router.add_post("/access/requests/{request_id:\\d+}/{action:approve|deny}", decide_pairing)
    app.router.add_post("/access/grants/{grant_id:\\d+}/revoke", revoke)
