"""`gateway doctor`: check the configured model server the way a user would before connecting a chat
(the database, the channels and the jobs are checked first: gateway/cli/doctor_parts.py).

The model is checked in the API it is configured with (`llm.api`): which APIs its server speaks
(gateway/llm/api_probe.py: the configured one must be among them; a Claude model on a server
that speaks Anthropic's, or a model on OpenAI's own API, is told when Chat Completions loses what
its own API keeps), a streamed answer, a tool round trip (what the answer asks to be sent back,
Anthropic's thinking blocks or Responses' reasoning items, goes back with the tool's result), and
for `api: anthropic` the same round trip with thinking on, when the model thinks.

Each check prints one line (ok / warn / fail) with what was found and, when something is wrong,
`-> ` what to change. The checks run in order and stop at the first failure that makes the rest
meaningless (an unreachable server, refused credentials). The exit status is 0 when nothing
failed, 1 otherwise.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from gateway.config import LLMConfig, McpConfig
from gateway.config.redaction import redact_text
from gateway.llm import AuthError, Completion, LLMClient, LLMError, Refused, Replay, collect
from gateway.llm.api_probe import judge, probe_apis
from gateway.llm.formats import REPLAY_KEY
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
THINKING_PROBE = "low"  # the level a thinking round trip asks for when llm.reasoning asks for none


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
        if not await _api(config, add):
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
    if config.api == "anthropic":
        await _thinking_round_trip(config, add)
    await _named_apis(config, add)
    return report


async def _named_apis(config: LLMConfig, add: Callable[..., bool]) -> None:
    """Each of llm.models in its own API: whether its server speaks it (asked once a server)."""
    asked: dict[tuple[str, str], Any] = {}
    for name, named in config.models.items():
        base_url = named.base_url or config.base_url
        same_server = base_url.rstrip("/") == config.base_url.rstrip("/")
        key = named.api_key or (config.api_key if same_server else "")
        if (base_url, key) not in asked:
            asked[base_url, key] = await probe_apis(base_url, key)
        finding = judge(config.api_of(name), named.model, base_url, asked[base_url, key], f"llm.models.{name}.api")
        if finding.status != "unknown":
            add(f"api ({name})", finding.status, finding.found, finding.fix)


async def _api(config: LLMConfig, add: Callable[..., bool]) -> bool:
    """The configured API among those the server speaks (an empty request to each)."""
    answers = await probe_apis(config.base_url, config.api_key)
    finding = judge(config.api, config.model, config.base_url, answers, "llm.api")
    if finding.status == "unknown":
        return True  # a refused key or no answer: the auth and completion checks say what
    return add("api", finding.status, finding.found, finding.fix)


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


async def _answer(
    client: LLMClient, messages: list[dict[str, Any]], **options: Any
) -> tuple[Completion, Replay | None]:
    """One streamed answer, and what the API asks to have sent back with it in the next round."""
    replays: list[Replay] = []

    async def tapped() -> Any:
        async with contextlib.aclosing(client.stream(messages, **options)) as events:  # type: ignore[type-var]
            async for event in events:
                if isinstance(event, Replay):
                    replays.append(event)
                yield event

    completion = await collect(tapped())
    return completion, (replays[-1] if replays else None)


async def _tool_round_trip(client: LLMClient, add: Callable[..., bool]) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": TOOL_PROMPT}]
    try:
        first, replay = await _answer(client, messages, tools=[PROBE_TOOL], max_tokens=200)
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
    try:
        await client.complete(_with_result(messages, first, replay), tools=[PROBE_TOOL], max_tokens=50)
    except LLMError as exc:
        add("tools", "fail", f"the model called {call.name}, but its result was refused: {exc.message}")
        return
    add("tools", "ok", f"the model called {call.name} and the server accepted its result")


def _with_result(messages: list[dict[str, Any]], answer: Completion, replay: Replay | None) -> list[dict[str, Any]]:
    """The next round: the answer's tool calls (and its replay, as the turn loop carries it) and
    a result for each."""
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in answer.tool_calls
    ]
    assistant: dict[str, Any] = {"role": "assistant", "content": answer.text, "tool_calls": calls}
    if replay is not None:
        assistant[REPLAY_KEY] = {"api": replay.api, "data": replay.data}
    results = [{"role": "tool", "tool_call_id": c.id, "content": "12:00"} for c in answer.tool_calls]
    return [*messages, assistant, *results]


async def _thinking_round_trip(config: LLMConfig, add: Callable[..., bool]) -> None:
    """Anthropic: a tool round trip with thinking on, its thinking blocks sent back unchanged
    with the result, as the API requires. A model that does not think is said, not failed,
    unless llm.reasoning asks it to."""
    asked = config.reasoning in ("low", "medium", "high")
    level = config.reasoning if asked else THINKING_PROBE
    probe = config.model_copy(update={"reasoning": level, "max_retries": min(config.max_retries, 1)})
    messages: list[dict[str, Any]] = [{"role": "user", "content": TOOL_PROMPT}]
    async with LLMClient(probe) as client:
        try:
            first, replay = await _answer(client, messages, tools=[PROBE_TOOL], max_tokens=2048)
        except LLMError as exc:
            if asked:
                add("thinking", "fail", f"a request with thinking ({level}) was refused: {exc.message}",
                    "set llm.reasoning: off, or use a model that thinks")
            else:
                add("thinking", "ok", f"{config.model} does not take thinking (refused: {exc.message})")
            return
        blocks = replay.data if replay is not None and isinstance(replay.data, list) else []
        if not blocks:
            said = f"{config.model} answered without thinking blocks"
            if asked:
                add("thinking", "warn", said, f"llm.reasoning is {level}: use a model that thinks, or set it to off")
            else:
                add("thinking", "ok", said)
            return
        if not first.tool_calls:
            add("thinking", "ok", f"{config.model} thinks ({len(blocks)} block(s)); it called no tool to send them to")
            return
        try:
            await client.complete(_with_result(messages, first, replay), tools=[PROBE_TOOL], max_tokens=2048)
        except LLMError as exc:
            add("thinking", "fail", f"the thinking blocks sent back with the tool's result were refused: {exc.message}",
                "read the server's log; the gateway sends them back unchanged")
            return
    signed = sum(1 for b in blocks if isinstance(b, dict) and (b.get("signature") or b.get("data")))
    add("thinking", "ok", f"{len(blocks)} thinking block(s), {signed} signed, went back unchanged with the tool's "
        "result and were accepted")


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
