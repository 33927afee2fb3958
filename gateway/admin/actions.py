"""What the console changes, through the same paths as the chat and the CLI: an approval or a
pairing decision is a button press submitted to the inbox (decided by compare-and-set with its
resume item, so the parked turn continues in its chat), recorded as the console user."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from gateway.admin.operations import Operations
from gateway.approvals.prompts import button_token
from gateway.events import ButtonPress, Sender, ThreadKey
from gateway.store import Action


@dataclass(frozen=True)
class Outcome:
    ok: bool
    message: str


def operator(user: str) -> Sender:
    """The console user as a decider: `console:<name>`, which no platform id can be."""
    return Sender(f"console:{user}", f"{user} (console)")


async def recorded(ops: Operations, user: str, action: str, target: str, outcome: Outcome) -> Outcome:
    """Every console action goes to the audit trail, with its user and what came of it."""
    await ops.store.audit.record_console_action(
        user=user, action=action, target=target, outcome="ok" if outcome.ok else "refused",
        detail={"message": outcome.message},
    )
    return outcome


async def _press(ops: Operations, thread_key: str, token: str, user: str) -> Outcome:
    press = ButtonPress(
        ThreadKey.parse(thread_key),
        operator(user),
        token,
        f"console:{secrets.token_hex(8)}",
        operator=True,
    )
    result = (await ops.submit([press]))[0]
    return Outcome(not result.alert, result.answer or "done")


async def decide_prompt(ops: Operations, prompt_id: int, approve: bool, user: str) -> Outcome:
    prompt = await ops.store.prompts.get(prompt_id)
    if prompt is None or prompt.kind != "approval":
        outcome = Outcome(False, f"no approval request {prompt_id}")
    else:
        outcome = await _press(ops, prompt.thread_key, button_token(prompt.token, _verdict(approve)), user)
    return await recorded(ops, user, "approve" if approve else "deny", f"prompt:{prompt_id}", outcome)


async def decide_pairing(ops: Operations, request_id: int, approve: bool, user: str) -> Outcome:
    request = await ops.store.access.get(request_id)
    if request is None:
        outcome = Outcome(False, f"no pairing request {request_id}")
    else:
        outcome = await _press(ops, request.thread_key, button_token(request.token, _verdict(approve)), user)
    verb = "approve_pairing" if approve else "deny_pairing"
    return await recorded(ops, user, verb, f"pairing:{request.code if request else request_id}", outcome)


async def revoke_grant(ops: Operations, grant_id: str, user: str) -> Outcome:
    revoked = await ops.store.access.revoke(grant_id)
    outcome = (
        Outcome(True, f"revoked {revoked.kind} {revoked.channel}:{revoked.subject}")
        if revoked is not None
        else Outcome(False, f"no approval {grant_id}")
    )
    return await recorded(ops, user, "revoke_access", f"grant:{grant_id}", outcome)


async def job_action(ops: Operations, name: str, action: str, user: str) -> Outcome:
    return await recorded(ops, user, f"job_{action.replace('-', '_')}", f"job:{name}", await _job(ops, name, action))


async def _job(ops: Operations, name: str, action: str) -> Outcome:
    schedule = await ops.store.schedules.by_name(name)
    if schedule is None:
        return Outcome(False, f"no job named {name!r}")
    if action == "run-now":
        return Outcome(True, await ops.run_job(schedule))
    if action == "kill":
        return Outcome(True, await ops.kill_job(schedule))
    if action in ("enable", "disable"):
        return Outcome(True, await ops.set_job_enabled(schedule, action == "enable"))
    return Outcome(False, f"unknown action {action!r}")


def _verdict(approve: bool) -> Action:
    return Action.APPROVE if approve else Action.DENY
