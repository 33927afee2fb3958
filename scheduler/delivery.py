"""What a finished job run sends to its `deliver_to` chat, worded for the person reading it."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.events import Button, Outbound, Prompt, ThreadKey, TurnEnded
from gateway.store.schedules import JobRunRecord, ScheduleRecord

RERUN_LABEL = "🔁 Run again with approval"
MAX_DENIED_LISTED = 10
MAX_ERROR_CHARS = 300
BUDGET_PREFIX = "budget: "  # the error of a run skipped (or stopped) at a spend cap


@dataclass(frozen=True)
class Plan:
    """What to send for one outcome: nothing, a plain message, or a notice with a rerun button."""

    kind: str  # "none" | "message" | "notice"
    text: str = ""


def header(schedule: ScheduleRecord) -> str:
    icon = "🔔" if schedule.kind == "tick" else "⏰"
    return f"{icon} **{schedule.name}**"


def is_quiet(schedule: ScheduleRecord, reply: str) -> bool:
    """A tick that had nothing to say answers exactly with its sentinel."""
    return schedule.kind == "tick" and bool(schedule.quiet_sentinel) and reply.strip() == schedule.quiet_sentinel


def job_text(schedule: ScheduleRecord) -> str:
    """The synthetic user message a run starts with."""
    if schedule.kind == "tick" and schedule.quiet_sentinel:
        return (
            f"{schedule.prompt}\n\nIf there is nothing worth reporting, reply with exactly "
            f"{schedule.quiet_sentinel} and nothing else."
        )
    return schedule.prompt


def short(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def failure_text(schedule: ScheduleRecord, error: str) -> str:
    return f"⚠️ Job **{schedule.name}** failed: {short(error) or 'unknown error'}"


def skipped_text(schedule: ScheduleRecord, error: str) -> str:
    return f"⏸ Job **{schedule.name}** skipped: {short(error.removeprefix(BUDGET_PREFIX))}"


def denied_text(denied: tuple[str, ...]) -> str:
    listed = [f"• `{short(item, 120)}`" for item in denied[:MAX_DENIED_LISTED]]
    if len(denied) > MAX_DENIED_LISTED:
        listed.append(f"• … and {len(denied) - MAX_DENIED_LISTED} more")
    return "🚫 Needed approval, denied because nobody could approve during the scheduled run:\n" + "\n".join(listed)


def plan_outcome(schedule: ScheduleRecord, run: JobRunRecord, event: TurnEnded) -> Plan:
    """Decide what to send for a closed run (its status is already recorded)."""
    denied = event.auto_denied
    if run.status == "success":
        reply = event.reply.strip()
        if is_quiet(schedule, reply) and not denied:
            return Plan("none")
        body = reply or "_(the run ended without a reply)_"
        if event.end_reason and event.end_reason != "reply":
            body += f"\n\n_(stopped: {event.end_reason})_"
        text = f"{header(schedule)}\n\n{body}"
    elif run.status == "failed" and (schedule.notify_on_failure or denied):
        text = failure_text(schedule, run.error or event.error or event.end_reason)
    elif run.status == "skipped" and schedule.notify_on_failure:
        text = skipped_text(schedule, run.error or "")
    else:
        return Plan("none")
    if denied:
        return Plan("notice", f"{text}\n\n{denied_text(denied)}")
    return Plan("message", text)


def result_message(target: ThreadKey, job_run_id: int, text: str) -> Outbound:
    return Outbound(thread=target, text=text, key=f"job:{job_run_id}:result")


def failure_message(target: ThreadKey, job_run_id: int, text: str) -> Outbound:
    return Outbound(thread=target, text=text, key=f"job:{job_run_id}:failure")


def rerun_notice(target: ThreadKey, job_run_id: int, text: str, prompt_token: str) -> Prompt:
    return Prompt(
        kind="notice",
        thread=target,
        key=f"job:{job_run_id}:result",
        text=text,
        buttons=((Button(RERUN_LABEL, f"{prompt_token}.r"),),),
    )
