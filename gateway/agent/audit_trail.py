"""What the audit trail records of a tool call: who asked, who or which rule decided and how,
the arguments (redacted by the store) and the outcome. The row is written with the call's
final status, in the same transaction (`SessionRepo.set_tool_call(audit=...)`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.agent.voices import Voice
from gateway.approvals.policy import PolicyDecision
from gateway.events import ThreadKey
from gateway.store import AuditEntry, ToolCallRecord
from gateway.store.audit import Via, person, via_of
from gateway.store.items import Verdict


@dataclass(frozen=True)
class Decided:
    """Who or what let a call run or stopped it. `action` names the decision."""

    action: str  # allowed | approved | rejected | denied | auto_denied | expired | answered | ...
    by: str | None = None  # a person ("telegram:42", "cli", "console:ann") or a rule ("approvals.rules[2]")
    via: Via | None = None
    reason: str = ""


def by_policy(decision: PolicyDecision) -> Decided:
    """The approval policy's verdict on a call (a rule, the defaults, a bypass, auto-deny)."""
    rule = f"approvals.rules[{decision.rule_index}]" if decision.rule_index is not None else "approvals defaults"
    if decision.bypassed:
        return Decided("allowed", "bypass", "bypass", decision.reason)
    if decision.action == "auto_deny":
        return Decided("auto_denied", "auto-deny", "auto", decision.reason)
    action = {"allow": "allowed", "deny": "denied"}.get(decision.action, decision.action)
    return Decided(action, rule, "policy", decision.reason)


def by_role(role: str, of: str = "") -> Decided:
    """Refused by a role: the requester's, or (`of`) that of another person whose words the turn holds."""
    whose = f" of {of}, whose words led to it," if of else ""
    return Decided("denied", f"role:{role}", "policy", f"the role {role!r}{whose} may not use this tool")


def by_prompt(verdict: Verdict, channel: str) -> Decided:
    """A person's (or the clock's) answer to the call's approval or question prompt."""
    decided_by = verdict.decided_by or None
    via = via_of(decided_by) if verdict.status != "canceled" else None
    return Decided(verdict.status, person(channel, decided_by), via, verdict.answer or "")


def tool_call_entry(
    call: ToolCallRecord,
    status: str,
    decided: Decided | None,
    *,
    thread: ThreadKey,
    requested_by: str = "",
    run_id: int | None = None,
    agent: str | None = None,
    voices: Sequence[Voice] = (),
) -> AuditEntry:
    detail: dict = {"call_id": call.call_id}
    if voices:  # other people whose words the turn held: the call asked for in their words too
        detail["voices"] = [{"id": person(thread.channel, v.id) or "", "name": v.name, "how": v.how} for v in voices]
    if decided is not None and decided.reason:
        detail["reason"] = decided.reason
    if agent:
        detail["agent"] = agent  # a sub-agent's call
    return AuditEntry(
        kind="tool_call",
        action=decided.action if decided is not None else "settled",
        actor=person(thread.channel, requested_by),
        decided_by=decided.by if decided is not None else None,
        via=decided.via if decided is not None else None,
        tool=call.name,
        thread_key=str(thread),
        run_id=run_id or call.run_id,
        arguments=call.arguments,
        outcome=status,
        detail=detail,
    )
