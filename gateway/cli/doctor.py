"""`gateway doctor`: check the configured model server the way a user would before connecting a chat
(the database, the channels and the jobs are checked first: gateway/cli/doctor_parts.py).

Each check prints one line (ok / warn / fail) with what was found and, when something is wrong,
`-> ` what to change. The checks run in order and stop at the first failure that makes the rest
meaningless (an unreachable server, refused credentials). The exit status is 0 when nothing
failed, 1 otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from gateway.config import LLMConfig, McpConfig
from gateway.config.redaction import redact_text
from gateway.llm import AuthError, LLMClient, LLMError, Refused
from gateway.mcp.manager import doctor_checks

Status = Literal["ok", "warn", "fail"]
MARKS = {"ok": "✓", "warn": "!", "fail": "✗"}
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "description": "an IANA name, e.g. Europe/Oslo"}},
            "required": ["timezone"],
        },
    },
}
TOOL_PROMPT = "What time is it in Europe/Oslo? Use the get_time tool."


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    found: str
    fix: str = ""


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)

    def add(self, name: str, status: Status, found: str, fix: str = "") -> Check:
        """A check, its texts redacted: what was found may quote a URL with its credentials or
        an MCP server's error (gateway/config/redaction.py)."""
        check = Check(name, status, redact_text(found), redact_text(fix))
        self.checks.append(check)
        return check


async def diagnose(config: LLMConfig, *, on_check: Callable[[Check], None] | None = None) -> Report:
    report = Report()
    emit = on_check or (lambda check: None)

    def add(name: str, status: Status, found: str, fix: str = "") -> bool:
        emit(report.add(name, status, found, fix))
        return status != "fail"

    async with LLMClient(config) as client:
        if not await _models(client, config, add):
            return report
        window = await client.context_window()
        if window.discovered:
            add("context window", "ok", f"{window.tokens:,} tokens ({window.source})")
        elif config.context_window == "auto":
            add(
                "context window", "warn", f"the server did not say; assuming {window.tokens:,} tokens",
                "set llm.context_window to the model's real window",
            )
        if config.context_window not in ("auto", 0) and window.discovered and config.context_window != window.tokens:
            add(
                "configured window", "warn",
                f"llm.context_window is {config.context_window:,} but the server says {window.tokens:,}",
                "use llm.context_window: auto",
            )
        if not await _completion(client, add):
            return report
        await _tool_round_trip(client, add)
    return report


async def _models(client: LLMClient, config: LLMConfig, add: Callable[..., bool]) -> bool:
    url = client.server.base + "/models"
    try:
        response = await client.server.http.get(url)  # the client's own connection and credentials
    except httpx.HTTPError as exc:
        return add(
            "reachable", "fail", f"cannot reach {url}: {exc or type(exc).__name__}",
            "check llm.base_url (it usually ends in /v1) and that the server is running",
        )
    if response.status_code == 404:
        return add("reachable", "fail", f"{url} answered HTTP 404: no OpenAI-compatible API there",
                   await _base_url_fix(client))
    add("reachable", "ok", f"{url} answered HTTP {response.status_code}")
    if response.status_code in (401, 403):
        return add("auth", "fail", *refused_key(response.status_code, config))
    add("auth", "ok", "accepted" if config.api_key else "no key configured and none asked for")
    ids = model_ids(response)
    if ids is None:
        add("model listed", "warn", f"/models gave no model list (HTTP {response.status_code})")
    elif config.model in ids:
        add("model listed", "ok", f"{config.model!r} is served")
    elif len(ids) == 1:
        add(
            "model listed", "warn", f"{config.model!r} is not listed; the server serves {ids[0]!r}",
            f"set llm.model: {ids[0]} (single-model servers often answer any name)",
        )
    else:
        add(
            "model listed", "fail", f"{config.model!r} is not among {', '.join(ids[:10]) or 'no models'}",
            "set llm.model to one of the listed ids",
        )
        return False
    return True


async def _base_url_fix(client: LLMClient) -> str:
    """What to put in llm.base_url when it answered 404: most servers' API is under /v1."""
    base = client.server.base
    if re.search(r"/v\d+$", base):
        return "check llm.base_url (LLM_BASE_URL): the path after the host is the one the server's docs give"
    try:
        answered = (await client.server.http.get(f"{base}/v1/models")).status_code != 404
    except httpx.HTTPError:
        answered = False
    said = f"{base}/v1 answers: " if answered else ""
    return f"{said}append /v1 to llm.base_url (LLM_BASE_URL): {base}/v1"


def refused_key(status: int, config: LLMConfig) -> tuple[str, str]:
    """(what happened, the fix) when the server wants a key it did not get, or refused the one sent."""
    if not config.api_key:
        return f"HTTP {status}: the server asks for a key and none is set", "set LLM_API_KEY (llm.api_key)"
    return f"HTTP {status}: the server refused the key", "check LLM_API_KEY (llm.api_key)"


async def _completion(client: LLMClient, add: Callable[..., bool]) -> bool:
    messages = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Say hi."}]
    try:
        done = await client.complete(messages, max_tokens=1)
    except AuthError as exc:
        return add("completion", "fail", exc.message, refused_key(401, client.config)[1])
    except Refused as exc:
        return add(
            "completion", "fail", exc.message,
            "read the server's log; a template error there means the model's chat template needs another order",
        )
    except LLMError as exc:
        return add("completion", "fail", exc.message, "check llm.model and the server's log")
    usage = "with usage" if done.usage is not None else "without usage chunks (tokens will be estimated)"
    add("completion", "ok", f"a one-token answer streamed ({done.finish_reason or 'no finish reason'}, {usage})")
    return True


async def _tool_round_trip(client: LLMClient, add: Callable[..., bool]) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": TOOL_PROMPT}]
    try:
        first = await client.complete(messages, tools=[PROBE_TOOL], max_tokens=200)
    except LLMError as exc:
        add(
            "tools", "fail", f"the server refused a request with tools: {exc.message}",
            "use a server and model with tool calling (vLLM: --enable-auto-tool-choice; llama.cpp: --jinja)",
        )
        return
    if not first.tool_calls:
        add(
            "tools", "warn", "the server accepted tools but the model returned text",
            "the agent's tools will not be used with this model: pick a model trained for tool calls",
        )
        return
    call = first.tool_calls[0]
    try:
        json.loads(call.arguments or "{}")
    except ValueError:
        add("tools", "warn", f"the model called {call.name} with arguments that are not JSON: {call.arguments[:80]!r}")
        return
    calls = [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]
    messages += [
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": call.id, "content": "12:00"},
    ]
    try:
        await client.complete(messages, tools=[PROBE_TOOL], max_tokens=50)
    except LLMError as exc:
        add("tools", "fail", f"the model called {call.name}, but its result was refused: {exc.message}")
        return
    add("tools", "ok", f"the model called {call.name} and the server accepted its result")


def model_ids(response: httpx.Response) -> list[str] | None:
    try:
        data = response.json().get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    return [str(entry.get("id")) for entry in data if isinstance(entry, dict) and entry.get("id")]


async def diagnose_mcp(
    config: McpConfig, *, on_check: Callable[[Check], None] | None = None, store: Any = None
) -> Report:
    """One check per configured MCP server, after starting each once (gateway/mcp); `store`
    holds the tokens of servers behind OAuth."""
    from gateway.mcp.oauth import TokenVault

    report = Report()
    vaults = (lambda name: TokenVault.from_env(store, name)) if store is not None else None
    for name, status, found, fix in await doctor_checks(config, vaults=vaults):
        check = report.add(name, status, found, fix)  # type: ignore[arg-type]  # ok | warn | fail
        if on_check is not None:
            on_check(check)
    return report


def print_check(check: Check) -> None:
    """One line a check: what was found and, when something should change, `-> the fix`."""
    print(f"{MARKS[check.status]} {check.name}: {check.found}" + (f" -> {check.fix}" if check.fix else ""), flush=True)
