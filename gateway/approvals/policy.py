"""Approval rules and the gate decision for each tool call.

Rules come from `approvals.rules`. Each names a tool (glob) or a class (`@side_effects`,
`@fs_write`, `@exec`, `@network`, `@all`, ...), optionally argument matches, optionally
sources, an action (allow | deny | require) and a priority. The first matching rule by
priority (higher first), then by order, wins. Without a match, tools without side effects
are allowed and tools with side effects require a human.

Argument matches: `re:<regex>` searches the argument's text. Otherwise the pattern is a glob:
for path-like arguments (`path`, `*_path`, `file`, `*_file`, `dir`, `*_dir`, `cwd`) it is
matched against the canonical path relative to the workspace (`..` and symlinks resolved;
paths outside the workspace are matched as absolute paths), and `dir/*` also matches `dir`
itself; for other arguments against the plain value. A rule never matches a call that lacks
the argument it names.

A rule that fails to load fails closed: it is logged with its index and, for the tools it
names (all tools if it names none it can be trusted on), an `allow` becomes `require`. It
never loosens anything, so a `deny` stays a deny.

Bypasses are granted by a human with a prompt button (never by the model): "allow this tool
for 15 minutes" or "allow this tool in this thread". They turn `require` into `allow` and
never override `deny`. Non-interactive sessions (cron, tick) turn `require` into `auto_deny`.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from gateway.config import ApprovalRule, ApprovalsConfig
from gateway.events import ThreadKey, utcnow
from gateway.tools.paths import canonical, relative_display
from gateway.tools.registry import SOURCES, ToolError, ToolSpec, matches_any

log = logging.getLogger(__name__)

Action = Literal["allow", "deny", "require"]
Outcome = Literal["allow", "deny", "require", "auto_deny"]

KNOWN_CLASSES: frozenset[str] = frozenset(
    {"all", "side_effects", "fs_read", "fs_write", "exec", "network", "memory", "mcp"}
)
BYPASS_MINUTES = 15

AUTO_DENIED = "Tool call auto-denied: this session cannot ask for approval."
EXPIRED = "approval expired"

_PATHLIKE = re.compile(r"(^|_)(path|file|filename|dir|directory|cwd)$")


def rejection_text(note: str | None = None) -> str:
    """The tool result when a human rejects a call (or the prompt expired, note=EXPIRED)."""
    note = (note or "").strip()
    return f"User rejected this tool call. Reason: {note}" if note else "User rejected this tool call."


def denied_by_rule_text(rule_index: int | None = None) -> str:
    """The tool result when a `deny` rule blocks a call."""
    where = f" (approvals.rules[{rule_index}])" if rule_index is not None else ""
    return f"Tool call denied by approval policy{where}."


@dataclass(frozen=True)
class Bypass:
    """A human's standing approval for one tool: in one thread (`thread_key`), until `expires_at`.

    `thread_key=None` applies in every thread; `expires_at=None` never expires.
    """

    tool: str
    thread_key: ThreadKey | None
    expires_at: datetime | None = None

    @classmethod
    def for_minutes(
        cls, tool: str, thread: ThreadKey | None, minutes: float = BYPASS_MINUTES, now: datetime | None = None
    ) -> Bypass:
        return cls(tool, thread, _aware(now or utcnow()) + timedelta(minutes=minutes))

    @classmethod
    def for_thread(cls, tool: str, thread: ThreadKey) -> Bypass:
        return cls(tool, thread, None)

    def covers(self, tool: str, thread: ThreadKey | None, now: datetime) -> bool:
        if not matches_any(tool, [self.tool]):
            return False
        if self.thread_key is not None and thread is not None and self.thread_key != thread:
            return False
        return self.expires_at is None or _aware(now) < _aware(self.expires_at)


@dataclass(frozen=True)
class PolicyDecision:
    action: Outcome
    reason: str
    rule_index: int | None = None
    bypassed: bool = False


class RuleError(ValueError):
    pass


@dataclass(frozen=True)
class ArgMatch:
    name: str
    pattern: str
    regex: re.Pattern[str] | None  # set for the `re:` form

    def matches(self, args: Mapping[str, Any], root: Path) -> bool:
        if self.name not in args:
            return False
        value = args[self.name]
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if self.regex is not None:
            return self.regex.search(text) is not None
        if _PATHLIKE.search(self.name):
            return _path_matches(self.pattern, text, root)
        return fnmatch.fnmatchcase(text, self.pattern)


@dataclass(frozen=True)
class Rule:
    index: int
    tool: str  # a name glob, or "@class"
    action: Action
    args: tuple[ArgMatch, ...] = ()
    sources: frozenset[str] | None = None
    priority: int = 0

    def names(self, spec: ToolSpec) -> bool:
        return tool_pattern_matches(self.tool, spec)

    def applies(self, spec: ToolSpec, args: Mapping[str, Any], source: str, root: Path) -> bool:
        if self.sources is not None and source not in self.sources:
            return False
        return self.names(spec) and all(match.matches(args, root) for match in self.args)


@dataclass(frozen=True)
class BrokenRule:
    index: int
    tool: str | None  # the tools it names, None when it cannot be trusted to name any
    error: str

    def names(self, spec: ToolSpec) -> bool:
        return self.tool is None or tool_pattern_matches(self.tool, spec)


def tool_pattern_matches(pattern: str, spec: ToolSpec) -> bool:
    if not pattern.startswith("@"):
        return matches_any(spec.name, [pattern])  # a renamed tool also by its former name
    cls = pattern[1:]
    if cls == "all":
        return True
    if cls == "side_effects":
        return spec.side_effects
    return cls in spec.classes


def parse_rule(index: int, raw: Any, known_classes: frozenset[str] = KNOWN_CLASSES) -> Rule:
    """One rule from its config mapping; RuleError says what is wrong with it."""
    if not isinstance(raw, Mapping):
        raise RuleError(f"expected a mapping like {{tool: shell, action: require}}, got {raw!r}")
    try:
        shape = ApprovalRule.model_validate(dict(raw))
    except ValidationError as exc:
        raise RuleError(
            "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'rule'}: {e['msg']}" for e in exc.errors())
        ) from None
    _check_tool_pattern(shape.tool, known_classes)
    return Rule(
        index=index,
        tool=shape.tool,
        action=shape.action,
        args=tuple(_arg_match(name, pattern) for name, pattern in shape.args.items()),
        sources=_sources(shape.source),
        priority=shape.priority,
    )


def _check_tool_pattern(tool: str, known_classes: frozenset[str]) -> None:
    if not tool.strip():
        raise RuleError("tool: must name a tool, a glob or a class like @side_effects")
    if tool.startswith("@") and tool[1:] not in known_classes:
        raise RuleError(f"tool: unknown class {tool!r} (known: {', '.join('@' + c for c in sorted(known_classes))})")


def _arg_match(name: str, pattern: str) -> ArgMatch:
    if not name or not pattern:
        raise RuleError(f"args: argument name and pattern must be non-empty (got {name!r}: {pattern!r})")
    if not pattern.startswith("re:"):
        return ArgMatch(name, pattern, None)
    try:
        return ArgMatch(name, pattern, re.compile(pattern[3:]))
    except re.error as exc:
        raise RuleError(f"args.{name}: bad regular expression {pattern[3:]!r}: {exc}") from None


def _sources(value: list[str] | str | None) -> frozenset[str] | None:
    if value is None:
        return None
    sources = frozenset([value] if isinstance(value, str) else value)
    unknown = sorted(sources - SOURCES)
    if unknown or not sources:
        raise RuleError(f"source: unknown {', '.join(unknown) or '(empty list)'}; use {', '.join(sorted(SOURCES))}")
    return sources


def _broken(index: int, raw: Any, error: str, known_classes: frozenset[str]) -> BrokenRule:
    tool = raw.get("tool") if isinstance(raw, Mapping) else None
    trusted = isinstance(tool, str) and tool.strip() and (not tool.startswith("@") or tool[1:] in known_classes)
    return BrokenRule(index, tool if trusted else None, error)


def load_rules(
    raw_rules: Sequence[Any], known_classes: frozenset[str] = KNOWN_CLASSES
) -> tuple[list[Rule], list[BrokenRule]]:
    """Valid rules in decision order (priority high to low, then order) and the broken ones."""
    rules: list[Rule] = []
    broken: list[BrokenRule] = []
    for index, raw in enumerate(raw_rules):
        try:
            rules.append(parse_rule(index, raw, known_classes))
        except RuleError as exc:
            item = _broken(index, raw, str(exc), known_classes)
            scope = f"tool {item.tool!r}" if item.tool else "every tool"
            log.error("approvals.rules[%d] is invalid and fails closed (approval required for %s): %s",
                      index, scope, exc)
            broken.append(item)
    rules.sort(key=lambda rule: (-rule.priority, rule.index))
    return rules, broken


class ApprovalPolicy:
    """Decides allow / deny / require / auto_deny for each call, and which tools to hide."""

    def __init__(
        self, raw_rules: Sequence[Any], workspace: Path | str, *, known_classes: frozenset[str] = KNOWN_CLASSES
    ) -> None:
        self.rules, self.broken = load_rules(raw_rules, known_classes)
        self.root = Path(workspace).expanduser().resolve()

    @classmethod
    def from_config(cls, config: ApprovalsConfig, workspace: Path | str) -> ApprovalPolicy:
        return cls(config.rules, workspace)

    @property
    def errors(self) -> list[str]:
        return [f"approvals.rules[{item.index}]: {item.error}" for item in self.broken]

    def decide(
        self,
        spec: ToolSpec,
        args: Mapping[str, Any],
        *,
        source: str,
        interactive: bool,
        bypasses: Iterable[Bypass] = (),
        thread: ThreadKey | None = None,
        now: datetime | None = None,
        in_context: str | None = None,
    ) -> PolicyDecision:
        """The gate for one call. Without `thread`, the bypasses are taken as the thread's own.
        `in_context`: why what the conversation holds needs a human for this call
        (`ToolSpec.needs_approval_in`): a rule's allow becomes require, a deny stays a deny."""
        decision = self._by_rules(spec, args, source)
        if in_context and decision.action == "allow":
            decision = PolicyDecision("require", in_context, decision.rule_index)
        if decision.action != "require":
            return decision
        moment = now or utcnow()
        for bypass in bypasses:
            # keyed on `grant_key`: an MCP tool whose server or schema changed is asked about again
            if bypass.covers(spec.grant_key, thread, moment):
                return PolicyDecision("allow", _bypass_reason(bypass), decision.rule_index, bypassed=True)
        if not interactive:
            return PolicyDecision("auto_deny", AUTO_DENIED, decision.rule_index)
        return decision

    def hidden_tools(self, specs: Iterable[ToolSpec], source: str) -> set[str]:
        """Names the model must not be offered: denied for this source whatever the arguments."""
        return {spec.name for spec in specs if self._always_denied(spec, source)}

    def _by_rules(self, spec: ToolSpec, args: Mapping[str, Any], source: str) -> PolicyDecision:
        rule = next((r for r in self.rules if r.applies(spec, args, source, self.root)), None)
        if rule is not None and rule.action == "deny":
            return PolicyDecision("deny", denied_by_rule_text(rule.index), rule.index)
        if rule is not None and rule.action == "require":
            return PolicyDecision("require", f"approvals.rules[{rule.index}] requires approval", rule.index)
        broken = next((b for b in self.broken if b.names(spec)), None)
        if broken is not None:
            return PolicyDecision("require", f"approvals.rules[{broken.index}] could not be loaded; "
                            "approval required (fail closed)", broken.index)
        if rule is not None:
            return PolicyDecision("allow", f"allowed by approvals.rules[{rule.index}]", rule.index)
        if spec.side_effects:
            return PolicyDecision("require", "no rule matched and the tool has side effects")
        reason = spec.needs_approval(args) if spec.needs_approval is not None else None
        if reason:
            return PolicyDecision("require", f"no rule matched and {reason}")
        return PolicyDecision("allow", "no rule matched and the tool has no side effects")

    def _always_denied(self, spec: ToolSpec, source: str) -> bool:
        for rule in self.rules:
            if not rule.names(spec) or (rule.sources is not None and source not in rule.sources):
                continue
            if not rule.args:
                return rule.action == "deny"
            if rule.action != "deny":
                return False  # some arguments reach a rule that is not a deny
        return False


def may_decide(
    channel: str,
    user_id: str | int,
    *,
    requested_by: str | int | None,
    approvers_config: Mapping[str, Sequence[str | int]],
    admins_config: Mapping[str, Sequence[str | int]],
    self_approve: bool = True,
) -> bool:
    """Whether this person may approve or reject a prompt in this channel.

    Admins of the channel always may. Otherwise the channel's configured approvers decide;
    with none configured, the person who started the turn does when `self_approve` (questions,
    a job's "Run again", approvals with `approvals.self_approve`), else nobody by this rule
    (roles with `approve` may: gateway/access/policy.py).
    """
    user = str(user_id)
    if user in _ids(admins_config, channel):
        return True
    approvers = _ids(approvers_config, channel)
    if approvers:
        return user in approvers
    if not self_approve:
        return False
    return requested_by is not None and str(requested_by) != "" and user == str(requested_by)


def _ids(config: Mapping[str, Sequence[str | int]], channel: str) -> set[str]:
    return {str(item) for item in (config.get(channel) or ())}


def _path_matches(pattern: str, value: str, root: Path) -> bool:
    try:
        path = canonical(root, value)
    except ToolError:
        return False  # the tools refuse such a path anyway
    candidate = path.as_posix() if pattern.startswith("/") else relative_display(root, path)
    pattern = pattern.removeprefix("./") or "."
    if fnmatch.fnmatchcase(candidate, pattern):
        return True
    for suffix in ("/*", "/**"):
        if pattern.endswith(suffix) and candidate == pattern[: -len(suffix)]:
            return True  # `dir/*` covers the directory itself
    return False


def _bypass_reason(bypass: Bypass) -> str:
    if bypass.expires_at is not None:
        return f"approved in advance for {bypass.tool} until {_aware(bypass.expires_at).isoformat(timespec='seconds')}"
    return f"approved in advance for {bypass.tool} in this thread"




def _aware(moment: datetime) -> datetime:
    """Naive datetimes are taken as UTC, so comparisons never raise."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
