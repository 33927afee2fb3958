"""One call of an MCP tool: the round trips with the server, the questions it asks (parked as
chat questions on the 2026-07-28 protocol, waited for inside the call on older ones: see
midcall.py; declined in headless sessions), its sampling requests (refused unless the server
is allowed to sample, then answered by our model and counted in the run: sampling.py), the
images of its result (shown to a vision model), and the MCP_CALL trace event of each round
trip (server, tool, duration, result size).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from gateway.config import McpServerConfig
from gateway.mcp import elicitation
from gateway.mcp.midcall import MidCall
from gateway.mcp.results import Rendered, render_result
from gateway.mcp.sampling import PerCall, ensure_enabled, sample
from gateway.mcp.sdk import (
    Answer,
    Busy,
    CallFailed,
    CallResult,
    Connection,
    ElicitAnswer,
    Elicitation,
    InputRequest,
    OtherRequest,
    SamplingAnswer,
    SamplingRequest,
    ServerGone,
)
from gateway.tools.registry import NeedsAnswer, ToolContext, ToolError

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 2.0
MAX_ROUNDS = 8  # input rounds of one call, so a server that keeps asking cannot loop forever


async def call(
    connection: Connection, server: str, config: McpServerConfig, tool: str, args: dict[str, Any], ctx: ToolContext
) -> str:
    """One call of `tool` on the live `connection` to `server`, through its input rounds."""
    answers: dict[str, Answer] = {}
    token: str | None = None
    sampled = PerCall(server, config)
    if ctx.resume is not None:
        answers, token, pending = _resumed(ctx.resume)
        sampled.used = int(ctx.resume["state"].get("sampled", 0))
        answers = await _answer(server, config, pending, answers, token, ctx, sampled)
    mid_call = MidCall(server, config, tool, ctx, sampled)
    progress = ProgressTrace(ctx, server, tool)
    for _ in range(MAX_ROUNDS):
        started = time.monotonic()
        try:
            result = await connection.call(
                tool, args, answers=answers or None, state=token, on_request=mid_call.answer, on_progress=progress
            )
        except Busy:
            await _trace(ctx, server, tool, started, "busy", 0)
            raise ToolError(
                f"The MCP server {server!r} is busy with another call that is waiting for an answer "
                f"(it takes one call at a time); try again later."
            ) from None
        except ServerGone as exc:
            await _trace(ctx, server, tool, started, "server_gone", 0)
            raise ToolError(
                f"The MCP server {server!r} stopped during the call ({exc}); it is being restarted. "
                "The call may or may not have taken effect."
            ) from None
        except CallFailed as exc:
            await _trace(ctx, server, tool, started, "protocol_error", 0)
            refused = "".join(f" {why}" for why in mid_call.refusals)
            raise ToolError(f"The MCP server {server!r} rejected the call: {exc}{refused}") from None
        except TimeoutError:
            await _trace(ctx, server, tool, started, "timeout", 0)
            raise ToolError(
                f"The MCP server {server!r} did not answer within {config.timeout_s:g}s; the call was abandoned."
            ) from None
        if isinstance(result, CallResult):
            rendered = render_result(result, server=server, workspace=ctx.workspace)
            text = rendered.text
            await _trace(ctx, server, tool, started, "error" if result.is_error else "ok", len(text))
            if result.is_error:
                refused = "".join(f" ({why})" for why in mid_call.refusals)
                raise ToolError(f"The MCP tool {tool} of {server!r} returned an error: {text}{refused}")
            await show_images(ctx, rendered, f"{tool} of {server!r}")
            return text
        await _trace(ctx, server, tool, started, "input_required", 0)
        token = result.state
        answers = await _answer(server, config, result.requests, {}, token, ctx, sampled)
    raise ToolError(f"The MCP server {server!r} kept asking for input ({MAX_ROUNDS} rounds); the call was abandoned.")


async def _answer(
    server: str,
    config: McpServerConfig,
    requests: dict[str, InputRequest],
    answers: dict[str, Answer],
    token: str | None,
    ctx: ToolContext,
    sampled: PerCall,
) -> dict[str, Answer]:
    """Answers for every request; parks the turn (NeedsAnswer) on the first unanswered question.
    The round's sampling requests are refused together when they would pass the call's cap."""
    answers = dict(answers)
    samples = [k for k, r in requests.items() if isinstance(r, SamplingRequest) and k not in answers]
    if samples:
        ensure_enabled(server, config, ctx)
        sampled.ensure_room(len(samples))
    for key, request in requests.items():
        if key in answers:
            continue
        if isinstance(request, Elicitation):
            if not ctx.interactive:
                answers[key] = ElicitAnswer("decline")  # headless: nobody can answer
                continue
            asked = elicitation.question(server, request)
            state = {
                "token": token,
                "requests": _dump_requests(requests),
                "answers": _dump_answers(answers),
                "asking": key,
                "sampled": sampled.used,
            }
            raise NeedsAnswer(asked.text, choices=asked.choices, allow_free_text=asked.allow_free_text, state=state)
        if isinstance(request, SamplingRequest):
            answers[key] = await sample(server, config, request, ctx, sampled)
            continue
        assert isinstance(request, OtherRequest)
        raise ToolError(f"The MCP server {server!r} asked for {request.method!r}, which this gateway does not provide.")
    return answers


async def show_images(ctx: ToolContext, rendered: Rendered, source: str) -> None:
    """Images of a result reach a vision model (`llm.vision`) like those people send: a notice
    row after the call carries them (tool results are text only in Chat Completions)."""
    config, store = ctx.services.get("config"), ctx.services.get("store")
    if not rendered.images or config is None or store is None or not config.llm.vision or not ctx.session_id:
        return
    names = ", ".join(image["path"] for image in rendered.images)
    text = f"[The images returned by the MCP tool {source} (call {ctx.call_id}): {names}]"
    # Image records name their file from the workspace's root (`sessions/<id>/…`), the paths
    # shown to the model from the session's own directory.
    root = Path(ctx.agent.workspace).expanduser().resolve()
    images = []
    for image in rendered.images:
        located = (ctx.workspace / image["path"]).resolve()
        if located.is_relative_to(root):
            images.append({**image, "path": located.relative_to(root).as_posix()})
    if not images:
        return
    await store.sessions.append(
        ctx.session_id, "user", text, synthetic=True, run_id=ctx.run_id or None, fence=ctx.fence, images=images
    )


def _resumed(resume: dict[str, Any]) -> tuple[dict[str, Answer], str | None, dict[str, InputRequest]]:
    """The state a parked call was saved with, plus the user's answer to the question it asked."""
    state = resume["state"]
    requests = _load_requests(state["requests"])
    answers = _load_answers(state["answers"])
    asking = state["asking"]
    request = requests[asking]
    assert isinstance(request, Elicitation)
    answers[asking] = elicitation.answer(request, resume.get("status", ""), resume.get("answer"))
    return answers, state.get("token"), requests


def _dump_requests(requests: dict[str, InputRequest]) -> dict[str, Any]:
    dumped: dict[str, Any] = {}
    for key, request in requests.items():
        if isinstance(request, Elicitation):
            dumped[key] = {"kind": "elicit", "message": request.message, "schema": request.schema}
        elif isinstance(request, SamplingRequest):
            dumped[key] = {
                "kind": "sample",
                "messages": [list(m) for m in request.messages],
                "system": request.system_prompt,
                "max_tokens": request.max_tokens,
            }
        else:
            dumped[key] = {"kind": "other", "method": request.method}
    return dumped


def _load_requests(dumped: dict[str, Any]) -> dict[str, InputRequest]:
    loaded: dict[str, InputRequest] = {}
    for key, item in dumped.items():
        if item["kind"] == "elicit":
            loaded[key] = Elicitation(item["message"], item["schema"])
        elif item["kind"] == "sample":
            loaded[key] = SamplingRequest(
                tuple((r, t) for r, t in item["messages"]), item["system"], item["max_tokens"]
            )
        else:
            loaded[key] = OtherRequest(item["method"])
    return loaded


def _dump_answers(answers: dict[str, Answer]) -> dict[str, Any]:
    dumped: dict[str, Any] = {}
    for key, answer in answers.items():
        if isinstance(answer, ElicitAnswer):
            dumped[key] = {"kind": "elicit", "action": answer.action, "content": answer.content}
        elif isinstance(answer, SamplingAnswer):
            dumped[key] = {"kind": "sample", "text": answer.text, "model": answer.model}
    return dumped


def _load_answers(dumped: dict[str, Any]) -> dict[str, Answer]:
    loaded: dict[str, Answer] = {}
    for key, item in dumped.items():
        if item["kind"] == "elicit":
            loaded[key] = ElicitAnswer(item["action"], item["content"])
        else:
            loaded[key] = SamplingAnswer(item["text"], item["model"])
    return loaded


class ProgressTrace:
    """A call's progress notifications as MCP_PROGRESS run events: the first, then at most one
    every PROGRESS_EVERY_S (a chatty server cannot flood the trace), each with the count so far."""

    def __init__(self, ctx: ToolContext, server: str, tool: str):
        self.ctx, self.server, self.tool = ctx, server, tool
        self.count = 0
        self._last = float("-inf")

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        payload = {
            "server": self.server,
            "tool": self.tool,
            "call_id": self.ctx.call_id,
            "progress": progress,
            "total": total,
            "message": (message or "")[:200],
            "notifications": self.count,
        }
        await _record(self.ctx, "MCP_PROGRESS", payload)


async def _trace(ctx: ToolContext, server: str, tool: str, started: float, status: str, result_chars: int) -> None:
    await _record(
        ctx,
        "MCP_CALL",
        {
            "server": server,
            "tool": tool,
            "call_id": ctx.call_id,
            "status": status,
            "duration_ms": round((time.monotonic() - started) * 1000, 2),
            "result_chars": result_chars,
        },
    )


async def _record(ctx: ToolContext, kind: str, payload: dict[str, Any], **totals: Any) -> None:
    store = ctx.services.get("store")
    if store is None or not ctx.run_id:
        return
    try:
        await store.runs.add_events(ctx.run_id, [(kind, payload, None)], **totals)
    except Exception:  # noqa: BLE001 - a trace write never fails the call
        log.exception("run %s: could not record %s", ctx.run_id, kind)
