"""The tool registry: specs with JSON-schema parameters, the per-call context, and `run_tool`.

Argument validation against the schema happens before `run_tool` (gateway/agent/arguments.py); the
registry only produces the schema. `run_tool` turns every failure into a failed outcome the
model can read, except cancellation, which propagates so the turn can stop a running tool.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from gateway.config import AgentConfig
from gateway.events import ThreadKey
from gateway.tools.schema import ArgumentError, derive

log = logging.getLogger(__name__)

Lod = Literal["head", "tail", "both"]
SOURCES: frozenset[str] = frozenset({"telegram", "slack", "console", "cron", "tick"})
ToolFunc = Callable[["ToolContext", dict[str, Any]], Awaitable[Any]]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI-compatible APIs accept

# Built-ins that were renamed, by their former name. The former name still reaches the tool (a
# call recorded before the rename, a model that learned it) and still matches the patterns
# written for it (`agent.tools`, roles' tools and deny_tools, approval rules): a rule that
# denied `http_fetch` keeps denying the same tool.
RENAMED: dict[str, str] = {"http_fetch": "web_fetch"}
_FORMER: dict[str, tuple[str, ...]] = {}
for _old, _new in RENAMED.items():
    _FORMER[_new] = (*_FORMER.get(_new, ()), _old)


class ToolError(Exception):
    """A tool's clear, expected failure; its message is the result the model sees."""


class NeedsAnswer(Exception):
    """A tool that cannot finish without asking the user (an MCP server's elicitation).

    The turn parks on a question prompt; when it is answered (or expires) the tool is called
    again with `ToolContext.resume` = {"state": state, "status": prompt status, "answer": text}.
    """

    def __init__(self, question: str, *, choices: list[str], allow_free_text: bool, state: dict[str, Any]):
        super().__init__(question)
        self.question, self.choices, self.allow_free_text, self.state = question, choices, allow_free_text, state


class Notes(Protocol):
    """Per-session notes (the scratchpad); the store implements it."""

    async def get_notes(self, session_id: int) -> dict[str, str]: ...

    async def set_note(self, session_id: int, key: str, value: str | None) -> None:
        """Set a note, or remove it when `value` is None."""


class InMemoryNotes:
    """Notes kept in a dict: for tests and throwaway sessions."""

    def __init__(self) -> None:
        self._notes: dict[int, dict[str, str]] = {}

    async def get_notes(self, session_id: int) -> dict[str, str]:
        return dict(self._notes.get(session_id, {}))

    async def set_note(self, session_id: int, key: str, value: str | None) -> None:
        notes = self._notes.setdefault(session_id, {})
        if value is None:
            notes.pop(key, None)
        else:
            notes[key] = value


@dataclass(frozen=True)
class MemoryScope:
    """Whose memory a turn reads and writes (gateway/memory/scope.py decides it from who asked,
    where and for which job; the model never names an owner). `owner` is written by
    `memory_save` and `memory_forget`; `reads` (the owner first) is shown and searched."""

    owner: str
    reads: tuple[str, ...]


@dataclass
class ToolContext:
    """What every tool call is given. `services` carries what other features' tools need."""

    session_id: int
    thread: ThreadKey
    source: str  # telegram | slack | console | cron | tick
    interactive: bool
    workspace: Path
    agent: AgentConfig
    notes: Notes
    services: dict[str, Any] = field(default_factory=dict)
    call_id: str = ""  # the model's tool call id, for tools that park on it (ask_user)
    run_id: int = 0  # the run the call belongs to, for tools that add to its trace (MCP)
    resume: dict[str, Any] | None = None  # the answer a parked call continues with (see NeedsAnswer)
    person: str = ""  # "<channel>:<user id>" the turn acts for (whose role it has); "" for nobody
    # For a tool that asks the chat while it runs (an MCP server's mid-call question): whose
    # turn it is (who may answer), the call's row (its prompt names it) and the turn's lease.
    requested_by: str = ""
    tool_call_id: int = 0
    fence: Any = None
    memory: MemoryScope | None = None  # None: no memory in this session (memory.enabled false, a sub-agent)
    private: bool = False  # asked in a direct message: history_search may read its person's earlier sessions
    requester_name: str = ""  # the display name of who asked (a memory entry names its author)
    # who let this call run when it needed a person: "<channel>:<id>" of the approver, "bypass"
    # for a standing approval; "" when no one was asked
    approved_by: str = ""


@dataclass(frozen=True)
class ToolSpec:
    """A tool offered to the model.

    `func(ctx, args)` runs it; `side_effects` says whether it changes anything outside the
    session (approvals require a human for those by default, and a restart does not re-run
    them); `classes` feed approval rules (`@fs_write`, `@exec`, `@network`); `lod` says which
    end of a long result matters when the context is shortened. `grant` is what a human's
    standing approval is keyed on (the name, unless the tool can change under the same name:
    MCP tools add a hash of their server and schema).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    func: ToolFunc
    side_effects: bool = False
    classes: frozenset[str] = frozenset()
    lod: Lod = "head"
    grant: str = ""

    @property
    def grant_key(self) -> str:
        return self.grant or self.name
    # For tools whose risk depends on the arguments: the reason a call needs a human's approval
    # when no rule decides it (e.g. web_fetch to a host not on the allow list), else None.
    needs_approval: Callable[[Mapping[str, Any]], str | None] | None = None
    # For tools whose risk depends on what the conversation holds (memory_save keeps what the model
    # read): given (session id, who asked), the reason a call needs a human's approval even where
    # a rule allows it, else None. A deny rule still denies.
    needs_approval_in: Callable[[int, str], Awaitable[str | None]] | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"tool name {self.name!r}: use 1-64 letters, digits, _ or -")
        if self.lod not in ("head", "tail", "both"):
            raise ValueError(f"tool {self.name}: lod must be head, tail or both, got {self.lod!r}")
        if self.parameters.get("type") != "object":
            raise ValueError(f"tool {self.name}: parameters must be a JSON schema of type object")

    def openai(self) -> dict[str, Any]:
        """The tool as the model's API lists it, built once: every request of every turn sends
        the same object (read-only), so its size is measured once (gateway/context/fitting.py)."""
        built = self.__dict__.get("_openai")
        if built is None:
            built = {
                "type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
            }
            object.__setattr__(self, "_openai", built)
        return built


@dataclass(frozen=True)
class ToolOutcome:
    text: str
    failed: bool = False
    ask: NeedsAnswer | None = None  # the call waits for the user's answer


def build_spec(
    func: Callable[..., Awaitable[Any]],
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    classes: Iterable[str] = (),
    lod: Lod = "head",
    needs_approval: Callable[[Mapping[str, Any]], str | None] | None = None,
    needs_approval_in: Callable[[int, str], Awaitable[str | None]] | None = None,
) -> ToolSpec:
    """A spec from a typed `async def tool(ctx, ...)`; the schema comes from the signature."""
    tool_name = name or func.__name__
    derived = derive(func, f"tool {tool_name}")
    return ToolSpec(
        name=tool_name,
        description=description if description is not None else derived.description,
        parameters=derived.parameters,
        func=derived.invoke,
        side_effects=side_effects,
        classes=frozenset(classes),
        lod=lod,
        needs_approval=needs_approval,
        needs_approval_in=needs_approval_in,
    )


class ToolSource(Protocol):
    """Something that registers tools while the gateway runs (the MCP servers)."""

    async def first_listing(self) -> None:
        """Until the tools still being listed for the first time are in the registry (bounded)."""

    def absent(self, name: str) -> str | None:
        """Why one of its tools is not in the registry now (its server is down), or None."""


class ToolRegistry:
    """Tools by name, in registration order."""

    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        self._specs: dict[str, ToolSpec] = {}
        self._sources: list[ToolSource] = []
        for spec in specs:
            self.register(spec)

    def add_source(self, source: ToolSource) -> None:
        self._sources.append(source)

    async def first_listing(self) -> None:
        """A turn builds its tool list after this: tools of servers still in their first
        connect are then offered from the first turn after a start."""
        for source in self._sources:
            await source.first_listing()

    def absent(self, name: str) -> str | None:
        """Why the tool `name` is not offered now, when a source knows it (else None)."""
        for source in self._sources:
            if (why := source.absent(name)) is not None:
                return why
        return None

    def register(self, spec: ToolSpec) -> ToolSpec:
        if spec.name in self._specs:
            raise ValueError(f"tool {spec.name!r} is already registered")
        self._specs[spec.name] = spec
        return spec

    def add(self, func: Callable[..., Awaitable[Any]], **meta: Any) -> ToolSpec:
        """Register a typed async function; `meta` as for `build_spec`."""
        return self.register(build_spec(func, **meta))

    def tool(self, **meta: Any) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
        """Decorator form of `add`; the function itself is returned unchanged."""

        def decorate(func: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            self.add(func, **meta)
            return func

        return decorate

    def unregister(self, name: str) -> None:
        self._specs.pop(name, None)

    def get(self, name: str) -> ToolSpec | None:
        return self._specs.get(name) or self._specs.get(RENAMED.get(name, ""))

    def names(self) -> list[str]:
        return list(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __len__(self) -> int:
        return len(self._specs)

    def specs(self, names_or_globs: Iterable[str] | None = None) -> list[ToolSpec]:
        """Specs matching any of the names or globs (all when None), in registration order."""
        if names_or_globs is None:
            return list(self._specs.values())
        patterns = list(names_or_globs)
        return [spec for spec in self._specs.values() if matches_any(spec.name, patterns)]

    def openai_tools(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The `tools` array of a Chat Completions request."""
        return [spec.openai() for spec in self.specs(names)]


def matches_any(name: str, patterns: Iterable[str]) -> bool:
    """Whether a tool's name, or a name it had before (RENAMED), matches one of the globs."""
    return _matches(name, tuple(patterns))


@functools.lru_cache(maxsize=65_536)
def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    # Asked for every tool offered, for every person and role, every turn: with hundreds of MCP
    # tools the globs were a tenth of a message's CPU.
    names = (name, *_FORMER.get(name, ()))
    return any(fnmatch.fnmatchcase(known, pattern) for pattern in patterns for known in names)


async def run_tool(spec: ToolSpec, args: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
    """Run one call. Failures become failed outcomes; cancellation propagates."""
    try:
        result = await spec.func(ctx, args)
    except ToolError as exc:
        return ToolOutcome(_storable(str(exc)) or f"{spec.name} failed", failed=True)
    except NeedsAnswer as ask:
        return ToolOutcome("", ask=ask)
    except ArgumentError as exc:
        return ToolOutcome(f"Invalid arguments for {spec.name}: {exc}. Fix the arguments and call again.", True)
    except Exception as exc:  # a bug in a tool must not end the turn
        log.exception("tool %s raised", spec.name)
        return ToolOutcome(f"{spec.name} failed with an internal error: {type(exc).__name__}: {exc}", True)
    return ToolOutcome(_storable(render_result(result)))


def _storable(text: str) -> str:
    """NUL shown as `\\0`: a command's output (`cat /proc/*/environ`, a binary file) may hold it,
    and PostgreSQL text columns refuse it, which would fail the turn instead of the call."""
    return text.replace("\0", "\\0")


def render_result(result: Any) -> str:
    if isinstance(result, str):
        return result
    if result is None:
        return "(no output)"
    return json.dumps(result, ensure_ascii=False, default=str)
