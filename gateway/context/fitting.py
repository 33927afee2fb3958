"""The fixed part of a request fitted to the model's window: the system prompt, the memory
section and the tools' schemas.

That part goes with every request, before a word of the conversation: on a small window it
can leave no room at all (the default tools alone are ~3,000 tokens; llama.cpp's 2,048-token
window refused every message). So it may take at most `FIXED_SHARE` of the budget, the
conversation and the answer keep the rest, and what does not fit is cut in this order:
1. the system prompt beyond `PROMPT_SHARE` (cut at a sentence), the memory beyond `MEMORY_SHARE`;
2. every tool's description to its first sentence (200 characters at most), the parameters'
   descriptions dropped;
3. tools, least important first (`agent.tool_priority`, then `FIRST` .. `LAST`), until the rest
   fits; the model is told that some were left out.
The same inputs give the same fit, so the request's prefix stays byte-identical round to round.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.context.budget import CHARS_PER_TOKEN, Budget
from gateway.context.render import DEFAULT_SYSTEM_PROMPT
from gateway.tools.registry import matches_any

FIXED_SHARE = 0.5  # of the budget: the system prompt, memory, tools and the context line together
PROMPT_SHARE = 0.25  # the system prompt alone
MEMORY_SHARE = 0.2  # the memory section alone (memory.budget_tokens when that is smaller)
CONTEXT_LINE_CHARS = 240  # the per-round line (date, working directory) the builder adds at the end
TOOL_OVERHEAD_CHARS = 12  # what a template adds around each tool's JSON
SHORT_DESCRIPTION_CHARS = 200  # a first sentence longer than this is cut at a word
# The built-ins in the order they are kept; tools named nowhere (an MCP server's) come between.
FIRST = (
    "ask_user", "shell", "read_file", "write_file", "list_dir", "web_search", "web_fetch",
    "memory_search", "memory_save", "clock", "send_file", "schedule",
)
LAST = ("history_search", "memory_forget", "scratchpad_get", "scratchpad_set", "delegate")
LEFT_OUT_NOTE = "(Some tools are left out: the model's context window is too small for them.)"
_ANNOTATIONS = ("description", "title", "examples")
_FIRST_SENTENCE = re.compile(r"^(.+?[.!?])(?=\s|$)", re.S)
Tool = dict[str, Any]


@dataclass(frozen=True)
class Fit:
    """A request's fixed part as sent to `model`, and what had to be cut for its window."""

    model: str
    window: int
    prompt: str  # the system prompt as sent, with the memory after it
    tools: tuple[Tool, ...]
    tools_chars: int  # what the tools' schemas cost, counted with the messages
    fixed_tokens: int  # the estimate of the whole fixed part ...
    limit_tokens: int  # ... and the most it may take (0: unbudgeted)
    shortened: bool = False  # descriptions cut to their first sentence
    dropped: tuple[str, ...] = ()  # tools left out, most important first
    prompt_cut: bool = False  # the system prompt was cut to its share
    offered: int = 0  # tools before fitting

    @property
    def cut(self) -> bool:
        return self.shortened or bool(self.dropped) or self.prompt_cut

    def describe(self) -> str:
        """One line: what was cut for which model, or what the fixed part takes."""
        if not self.window:
            tools = len(self.tools)
            return f"the system prompt and {tools} tools go whole: {self.model} is unbudgeted (llm.context_window: 0)"
        if not self.cut:
            return (
                f"the system prompt and {len(self.tools)} tools take {self.fixed_tokens:,} of the "
                f"{self.limit_tokens:,} tokens the {self.window:,}-token window of {self.model} leaves them"
            )
        cuts = []
        if self.prompt_cut:
            cuts.append("the system prompt cut to a quarter of the window")
        if self.shortened:
            cuts.append("tool descriptions cut to their first sentence and their parameters' dropped")
        if self.dropped:
            cuts.append(f"{len(self.dropped)} of {self.offered} tools left out ({', '.join(self.dropped)})")
        return f"the request is fitted to the {self.window:,}-token window of {self.model}: {'; '.join(cuts)}"


def fit_request(
    budget: Budget, prompt: str, memory: str, tools: Sequence[Tool], *, priority: Sequence[str], model: str
) -> Fit:
    """The system prompt (then `memory`) and the tools that fit `budget` (see the module's doc)."""
    if budget.unbudgeted:
        return Fit(model, 0, _joined(prompt, memory), tuple(tools), _tools_chars(tools), 0, 0, offered=len(tools))
    limit = math.floor(budget.budget * FIXED_SHARE)
    cut_prompt = _cut(prompt, _chars_for(budget, budget.budget * PROMPT_SHARE))
    system = _joined(cut_prompt, memory)
    room = limit - budget.tokens(len(system) + CONTEXT_LINE_CHARS)
    shortened = budget.tokens(_tools_chars(tools)) > room
    chosen = [_short(tool) for tool in tools] if shortened else list(tools)
    kept = _by_priority(chosen, priority, room, budget)
    dropped = tuple(_name(t) for t in _ordered(chosen, priority) if _name(t) not in kept)
    sent = tuple(t for t in chosen if _name(t) in kept)
    if dropped:
        system = f"{system}\n\n{LEFT_OUT_NOTE}"
    tools_chars = _tools_chars(sent)
    fixed = budget.tokens(len(system) + CONTEXT_LINE_CHARS + tools_chars)
    return Fit(
        model, budget.window, system, sent, tools_chars, fixed, limit, shortened, dropped,
        cut_prompt != prompt.strip(), len(tools),
    )


def memory_allowance(budget: Budget, configured_tokens: int) -> int:
    """Tokens (as `memory.budget_tokens` counts them: uncorrected) the memory section may take."""
    if budget.unbudgeted:
        return configured_tokens
    share = math.floor(budget.budget * MEMORY_SHARE / budget.factor)
    return max(0, min(configured_tokens, share))


def sample_text(prompt: str, tools: Sequence[Tool]) -> str:
    """The fixed part as text, for the server's tokenizer to count (calibrating the estimate)."""
    return "\n".join([prompt, *(json_text(tool) for tool in tools)])


# ---- the pieces --------------------------------------------------------------------------------
def _chars_for(budget: Budget, tokens: float) -> int:
    return max(0, math.floor(tokens / budget.factor) * CHARS_PER_TOKEN)


def _joined(prompt: str, memory: str) -> str:
    head = prompt.strip() or DEFAULT_SYSTEM_PROMPT
    return f"{head}\n\n{memory}" if memory else head


def _cut(text: str, chars: int) -> str:
    """`text` within `chars`, ending at a sentence (or a word) when it had to be cut."""
    text = text.strip()
    if len(text) <= chars:
        return text
    head = text[: max(chars - 1, 0)]
    end = max(head.rfind(". "), head.rfind(".\n"))
    head = head[: end + 1] if end > 0 else head.rsplit(" ", 1)[0]
    return head.rstrip() + "…"


def _tools_chars(tools: Sequence[Tool]) -> int:
    return sum(_tool_chars(tool) for tool in tools)


def _tool_chars(tool: Tool) -> int:
    return json_chars(tool) + TOOL_OVERHEAD_CHARS


# Each tool object as JSON, kept with the object (so its id is not reused while kept): a turn
# offers the registry's own objects again (`ToolSpec.openai`), and with hundreds of MCP tools
# encoding them every round was a tenth of a message's CPU.
_ENCODED: dict[int, tuple[Tool, str]] = {}
_ENCODED_MAX = 4096


def json_text(tool: Tool) -> str:
    """`tool` as JSON (tools are never changed once offered)."""
    known = _ENCODED.get(id(tool))
    if known is not None and known[0] is tool:
        return known[1]
    text = json.dumps(tool, ensure_ascii=False)
    if len(_ENCODED) >= _ENCODED_MAX:
        _ENCODED.clear()
    _ENCODED[id(tool)] = (tool, text)
    return text


def json_chars(tool: Tool) -> int:
    return len(json_text(tool))


def _name(tool: Tool) -> str:
    return str(tool["function"]["name"])


def _short(tool: Tool) -> Tool:
    function = tool["function"]
    description = " ".join(str(function.get("description") or "").split())
    match = _FIRST_SENTENCE.match(description)
    short = {**function, "description": _cut(match.group(1) if match else description, SHORT_DESCRIPTION_CHARS)}
    short["parameters"] = _plain(function.get("parameters") or {"type": "object"})
    return {**tool, "function": short}


def _plain(schema: Any) -> Any:
    """A parameters schema without its prose: descriptions, titles and examples, at any depth
    (a property *named* description stays)."""
    if isinstance(schema, list):
        return [_plain(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    plain: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _ANNOTATIONS:
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            plain[key] = {name: _plain(sub) for name, sub in value.items()}
        else:
            plain[key] = _plain(value)
    return plain


def _rank(name: str, priority: Sequence[str]) -> tuple[int, int]:
    for index, pattern in enumerate(priority):
        if matches_any(name, [pattern]):
            return (0, index)
    if name in FIRST:
        return (1, FIRST.index(name))
    if name in LAST:
        return (3, LAST.index(name))
    return (2, 0)


def _ordered(tools: Sequence[Tool], priority: Sequence[str]) -> list[Tool]:
    return sorted(tools, key=lambda tool: _rank(_name(tool), priority))  # stable: registry order within a rank


def _by_priority(tools: Sequence[Tool], priority: Sequence[str], room: int, budget: Budget) -> set[str]:
    """Names kept, most important first; one that does not fit is left out and smaller ones
    after it may still fit. The note about those left out is paid for before any is kept."""
    if budget.tokens(_tools_chars(tools)) <= room:
        return {_name(tool) for tool in tools}
    used = len(LEFT_OUT_NOTE) + 2
    kept: set[str] = set()
    for tool in _ordered(tools, priority):
        chars = _tool_chars(tool)
        if budget.tokens(used + chars) <= room:
            kept.add(_name(tool))
            used += chars
    return kept
