"""Approval and question prompts: sending them, button tokens, and answers by compare-and-set.

A button token is `<prompt token>.<action>`: the prompt token is 128 random bits resolved through
the database, so tokens are unguessable, at most 64 bytes, and keep working after a restart
and on any instance. Actions: a approve, d deny, t allow 15 min, c allow in this chat,
q<N> choice N, r run again (scheduled job). A press is decided in one transaction with its
inbox event (dedupe) and the resume item that continues the parked turn. The action codes are
`Action` (store/records.py), shared with the access requests' buttons and `gateway approvals`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Literal

from gateway.access.claim import claim_hint, claimable, refresh_admins
from gateway.access.policy import AccessPolicy
from gateway.approvals.in_call import EXPIRED_QUESTION, IN_CALL, OPEN, is_in_call
from gateway.approvals.policy import BYPASS_MINUTES, may_decide
from gateway.approvals.routing import (
    NOBODY_DECIDES,
    WAITING_FOR_ADMIN,
    Asker,
    deciders,
    one_line,
    refusal,
    requester_decides,
    shown_arguments,
)
from gateway.config import Config
from gateway.delivery.outbox import Outbox
from gateway.events import Button, ButtonPress, ChannelError, Prompt, SubmitResult, ThreadKey, utcnow
from gateway.running.clock import SYSTEM_CLOCK, Clock
from gateway.serving import metrics
from gateway.serving.display import escape_markdown, plain_name
from gateway.store import Action, NewItem, PromptRecord, SessionRecord, Store, ToolCallRecord, choice_action, chosen
from gateway.store.items import SenderRef, button_item, rerun_message, resume_item

log = logging.getLogger(__name__)

APPROVAL_BUTTONS = (
    ((Action.APPROVE, "✅ Approve"), (Action.DENY, "❌ Deny")),
    ((Action.ALLOW_15M, f"⏱ Allow {BYPASS_MINUTES} min"), (Action.ALLOW_THREAD, "🔁 Allow in this chat")),
)
TONES: dict[str, Literal["positive", "negative"]] = {Action.APPROVE: "positive", Action.DENY: "negative"}
APPROVAL_VERDICTS: dict[str, str] = {  # the approval button pressed -> the prompt's status
    Action.APPROVE: "approved",
    Action.ALLOW_15M: "approved",
    Action.ALLOW_THREAD: "approved",
    Action.DENY: "rejected",
}
FREE_TEXT_HINT = "You can also type your answer."
NOT_PENDING = "This request is no longer pending."
UNKNOWN_BUTTON = "This button is no longer valid."
EXPIRED_ANSWER = "This request has expired."
DECIDED_BY_ADMINS = "_An admin decides this request._"
# Outbox keys of a prompt's copies: "prompt:<id>:<chat>" a decider's DM, "prompt:<id>:in-chat:<person>"
# a decider's own card in the group, "prompt:<id>:shared" the group's card when no decider was reached.
IN_CHAT = "in-chat:"
SHARED_CARD = "shared"


def button_token(prompt_token: str, action: str) -> str:
    return f"{prompt_token}.{action}"


def parse_token(token: str) -> tuple[str, str] | None:
    prompt_token, sep, action = token.rpartition(".")
    if not sep or not prompt_token or not action or len(token.encode()) > 64:
        return None
    return prompt_token, action


def outcome_text(prompt: PromptRecord) -> str:
    who = plain_name(prompt.decided_by_name or prompt.decided_by or "someone")
    if prompt.status == "approved":
        scopes: dict[str, str] = {
            Action.ALLOW_15M: f" (allowed for {BYPASS_MINUTES} min)",
            Action.ALLOW_THREAD: " (allowed in this chat)",
        }
        scope = scopes.get(prompt.decision or "", "")
        return f"✅ Approved by {who}{scope}"
    if prompt.status == "rejected":
        return f"❌ Denied by {who}" + (f": {prompt.answer}" if prompt.answer else "")
    if prompt.status == "answered" and prompt.kind == "rerun":
        return f"🔁 Run again by {who}"
    if prompt.status == "answered":
        return f"💬 Answered by {who}: {prompt.answer}"
    if prompt.status == "expired":
        return "⌛ Expired without an answer" if prompt.kind == "question" else "⌛ Expired: approval expired"
    if prompt.status == "superseded":
        return "↪️ Superseded by a newer question"
    return "🚫 Canceled"


class PromptService:
    def __init__(
        self,
        store: Store,
        outbox: Outbox,
        config: Config,
        *,
        access: AccessPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ):
        self.store = store
        self.outbox = outbox
        self.config = config
        self.access = access  # roles that may approve; approvals.separate_requester
        self.clock = clock  # prompts expire by it (approvals.expire_after, questions.timeout)
        self.waiting_in_call: dict[str, int] = {}  # thread -> calls of this process waiting for an answer

    # ---- asking --------------------------------------------------------------------------
    async def request_approval(
        self,
        session: SessionRecord,
        thread: ThreadKey,
        call: ToolCallRecord,
        *,
        run_id: int,
        requested_by: str,
        reason: str,
        grant: str = "",
        agent: str = "",
        requester_name: str = "",
        private: bool = False,
        voices: str = "",
        owner_decides: bool = False,
    ) -> PromptRecord:
        """`agent`: the sub-agent asking, named in the prompt (its parent's chat shows it).
        `private`: asked in a DM; `requester_name`: shown to the deciders (gateway/approvals/routing.py).
        `voices`: the other people whose words the turn holds (gateway/agent/voices.py), named.
        `owner_decides`: the requester may decide it too (a save into their own memory)."""
        arguments = shown_arguments(call.arguments)
        payload: dict[str, Any] = {"tool": call.name, "arguments": arguments, "reason": reason}
        payload.update(grant=grant or call.name, agent=agent, requester_name=requester_name, private=private)
        if voices:
            payload["voices"] = voices
        if owner_decides:
            payload["owner_decides"] = True
        metrics.APPROVALS.labels("requested").inc()
        prompt, _ = await self.store.prompts.create(
            kind="approval",
            session_id=session.id,
            thread_key=str(thread),
            payload=payload,
            requested_by=requested_by,
            expires_at=self.clock.now() + timedelta(seconds=self.config.approvals.expire_after),
            run_id=run_id,
            tool_call_id=call.id,
        )
        buttons = tuple(
            tuple(Button(label, button_token(prompt.token, a), tone=TONES.get(a, "")) for a, label in row)
            for row in APPROVAL_BUTTONS
        )
        summary = f"Approve `{call.name}`?"
        if agent:  # a sub-agent's call, shown in its parent's chat
            summary = f"🤖 {escape_markdown(agent)} → wants to run `{call.name}`: {one_line(call.arguments)}"
        if voices:  # whose words led to it besides the requester's: the decider sees them
            requester = escape_markdown(requester_name or "the person who asked")
            summary += f"\nAsked by {requester}, with words of {escape_markdown(voices)}."
        shown = Prompt("approval", thread, f"prompt:{prompt.id}", summary, buttons, call.name, arguments)
        people = [] if self.may_decide(prompt, requested_by) else self._deciders_elsewhere(prompt, thread)
        if not people:
            await self._send(prompt, replace(shown, text=f"{summary}{self._nobody_decides(prompt, thread)}"))
            return prompt
        card = replace(shown, text=f"{summary}\n{DECIDED_BY_ADMINS}")
        in_chat = not private and self._shows_privately(thread)
        if private or in_chat:  # told it waits; the buttons go to the deciders only
            delivered = await self.outbox.send_text(
                thread, WAITING_FOR_ADMIN.format(tool=call.name), key=f"prompt:{prompt.id}"
            )
            await self.store.prompts.set_message_ids(prompt.id, list(delivered.message_ids))
        else:
            await self._send(prompt, card)
        copies = await self._send_in_chat(prompt, card, people) if in_chat else []
        asker = Asker(thread.channel, str(requested_by), requester_name, private, thread.chat)
        copies += await self._send_copies(prompt, replace(shown, text=f"{summary}\n{asker.line()}"), people)
        if in_chat and not copies:  # no decider reached: the card in the group, as without the option
            copies = await self._send_to(prompt, [(replace(card, key=f"prompt:{prompt.id}:{SHARED_CARD}"), "")])
        await self.store.prompts.set_copies(prompt.id, copies)
        return prompt

    def _nobody_decides(self, prompt: PromptRecord, thread: ThreadKey) -> str:
        """Below a prompt nobody may decide yet because the channel has no admin: how its owner
        becomes one (the requester may be the owner, as in a one-person set-up)."""
        if self.access is None or self.may_decide(prompt, prompt.requested_by):
            return ""
        channel = thread.channel
        if not claimable(self.config, self.access, channel) or deciders(self.config, self.access, channel):
            return ""
        return f"\n_Nobody may approve this yet: {channel} has no admin. {claim_hint(channel)}_"

    def _deciders_elsewhere(self, prompt: PromptRecord, thread: ThreadKey) -> list[str]:
        """The people who may decide the prompt, each reached in their own DM (not this thread)."""
        people = deciders(self.config, self.access, thread.channel)
        if not people:
            log.warning(NOBODY_DECIDES, prompt.id, prompt.payload.get("tool"), thread.channel,
                        prompt.requested_by, thread.channel)
        return [p for p in people if ThreadKey(thread.channel, p, "") != thread and self.may_decide(prompt, p)]

    def _shows_privately(self, thread: ThreadKey) -> bool:
        """Whether a group's deciders get the card there, each seeing only their own
        (`telegram.group_approvals: private`), the group seeing that it waits."""
        return bool(getattr(self.outbox.channels.get(thread.channel), "private_prompts", False))

    async def _send_in_chat(self, prompt: PromptRecord, card: Prompt, people: list[str]) -> list[list[Any]]:
        """Each decider's own card in the group, which nobody else there sees. Its delivery is
        not guaranteed (an offline person may never get it), so the DM copies go out as well."""
        return await self._send_to(
            prompt, [(replace(card, key=f"prompt:{prompt.id}:{IN_CHAT}{p}", receiver=p), p) for p in people]
        )

    async def _send_copies(self, prompt: PromptRecord, shown: Prompt, people: list[str]) -> list[list[Any]]:
        """The prompt in each decider's DM."""
        dms = [ThreadKey(shown.thread.channel, person, "") for person in people]
        return await self._send_to(prompt, [(replace(shown, thread=dm, key=f"prompt:{prompt.id}:{dm.chat}"), "")
                                            for dm in dms])

    async def _send_to(self, prompt: PromptRecord, sends: list[tuple[Prompt, str]]) -> list[list[Any]]:
        """Copies of the prompt: [[thread key, [message ids], receiver], ...] of those delivered."""
        copies: list[list[Any]] = []
        for shown, receiver in sends:
            whom = f"{shown.thread}" + (f" (for {receiver} only)" if receiver else "")
            try:
                delivered = await self.outbox.send_prompt(shown)
            except ChannelError as exc:  # e.g. a decider who never opened a DM with the bot
                log.warning("could not send approval %s to %s: %s", prompt.id, whom, exc)
                continue
            except Exception:  # noqa: BLE001 - one unreachable decider must not stop the others
                log.exception("could not send approval %s to %s", prompt.id, whom)
                continue
            if delivered.message_ids:
                copies.append([str(shown.thread), list(delivered.message_ids), receiver])
        return copies

    async def ask(
        self,
        session: SessionRecord,
        thread: ThreadKey,
        call: ToolCallRecord,
        *,
        run_id: int,
        requested_by: str,
        question: str,
        choices: list[str],
        allow_free_text: bool,
        resume: dict[str, Any] | None = None,
        agent: str = "",
    ) -> PromptRecord:
        payload: dict[str, Any] = {"question": question, "choices": choices, "allow_free_text": allow_free_text}
        if resume is not None:
            payload["resume"] = resume  # a tool asked (MCP elicitation): it continues with the answer
        prompt, superseded = await self.store.prompts.create(
            kind="question", session_id=session.id, thread_key=str(thread), payload=payload, requested_by=requested_by,
            expires_at=self.clock.now() + timedelta(seconds=self.config.questions.timeout), run_id=run_id,
            tool_call_id=call.id,
            supersede_questions=True,
        )
        for old in superseded:
            await self.close(old)
        buttons = tuple(
            (Button(choice[:60], button_token(prompt.token, choice_action(i))),) for i, choice in enumerate(choices)
        )
        hint = FREE_TEXT_HINT if allow_free_text or not choices else ""
        text = f"🤖 {agent} asks: {question}" if agent else question
        await self._send(prompt, Prompt("question", thread, f"prompt:{prompt.id}", text, buttons, hint=hint))
        return prompt

    async def ask_in_call(
        self,
        *,
        session_id: int,
        thread: ThreadKey,
        tool_call_id: int,
        run_id: int,
        requested_by: str,
        question: str,
        choices: list[str],
        allow_free_text: bool,
        link: tuple[str, str] | None,
        restart_error: str,
        alive_until: datetime,
    ) -> PromptRecord:
        """A question the running call waits for (see in_call.py); `link` is a (label, url)
        button shown first; `restart_error` is the call's result if a restart ends the wait."""
        payload: dict[str, Any] = {"question": question, "choices": choices, "allow_free_text": allow_free_text}
        payload[IN_CALL] = {"restart_error": restart_error}
        prompt, _ = await self.store.prompts.create(
            kind="question", session_id=session_id, thread_key=str(thread), payload=payload,
            requested_by=requested_by, expires_at=alive_until, run_id=run_id, tool_call_id=tool_call_id,
        )
        rows = [(Button(link[0], button_token(prompt.token, OPEN), url=link[1]),)] if link else []
        rows += [(Button(c[:60], button_token(prompt.token, choice_action(i))),) for i, c in enumerate(choices)]
        hint = FREE_TEXT_HINT if allow_free_text else ""
        await self._send(prompt, Prompt("question", thread, f"prompt:{prompt.id}", question, tuple(rows), hint=hint))
        return prompt

    async def end_in_call(self, prompt: PromptRecord, status: str = "expired") -> PromptRecord:
        """The call stopped waiting (out of time, stopped, ended by a restart): the prompt gets
        `status` unless someone decided it first, and its message shows which."""
        result = await self.store.prompts.decide(
            prompt.id, status=status, decision=Action.EXPIRED, decided_by="", enforce_expiry=False
        )
        decided = result.prompt or await self.store.prompts.get(prompt.id) or prompt
        await self.close(decided)
        return decided

    async def _send(self, record: PromptRecord, prompt: Prompt) -> None:
        delivered = await self.outbox.send_prompt(prompt)
        await self.store.prompts.set_message_ids(record.id, list(delivered.message_ids))

    async def close(self, prompt: PromptRecord) -> None:
        """Show the decision on the prompt message (and its copies in the deciders' DMs) and
        remove its buttons (once)."""
        if not prompt.message_ids or prompt.kind == "approval":
            prompt = await self.store.prompts.get(prompt.id) or prompt
        shown = [(prompt.thread_key, list(prompt.message_ids), f"close:{prompt.id}")]
        for thread_key, message_ids, *receiver in prompt.payload.get("copies") or []:
            whose = f":{receiver[0]}" if receiver and receiver[0] else ""
            shown.append((thread_key, list(message_ids), f"close:{prompt.id}:{thread_key}{whose}"))
        for thread_key, message_ids, key in shown:
            try:
                await self.outbox.close_prompt(key, ThreadKey.parse(thread_key), message_ids, outcome_text(prompt))
            except Exception as exc:  # noqa: BLE001 - a stale prompt message must not stop the turn
                log.warning("could not update prompt %s: %s", prompt.id, exc)

    # ---- answering ------------------------------------------------------------------------
    async def press(self, press: ButtonPress) -> SubmitResult:
        """A tap not seen before (the inbox checked); its event is recorded with the decision,
        in one transaction, so a concurrent redelivery still comes out a duplicate."""
        parsed = parse_token(press.token)
        prompt = await self.store.prompts.by_token(parsed[0]) if parsed else None
        if prompt is None or parsed is None:
            return SubmitResult(press.event_id, answer=UNKNOWN_BUTTON, alert=True)
        action = parsed[1]
        if self.access is not None:
            await refresh_admins(self.store, self.access)  # claimed or removed since: this tap counts it
        if prompt.status != "pending" and prompt.kind != "rerun":
            gone = is_in_call(prompt) and prompt.status in ("expired", "canceled")
            return SubmitResult(press.event_id, answer=EXPIRED_QUESTION if gone else NOT_PENDING, alert=True)
        if not press.operator and not self.may_decide(prompt, press.sender.id):
            channel = ThreadKey.parse(prompt.thread_key).channel
            why = refusal(self.config, self.access, prompt.kind, channel, press.sender.id, prompt.requested_by or "")
            return SubmitResult(press.event_id, answer=why, alert=True)
        if prompt.kind == "rerun":
            return await self._rerun(press, prompt)
        decision = self._decision(prompt, action)
        if decision is None:
            return SubmitResult(press.event_id, answer=UNKNOWN_BUTTON, alert=True)
        status, answer = decision
        result = await self.store.prompts.decide(
            prompt.id,
            status=status,
            decision=action,
            decided_by=press.sender.id,
            decided_by_name=press.sender.name or press.sender.username,
            answer=answer,
            event=self._event_item(press),
            resume=_resume_of(prompt),
            now=self.clock.now(),
            reason_from_held=status == "rejected",
        )
        return await self._answer(press, result.outcome, result.prompt)

    async def thread_of(self, token: str) -> str | None:
        """The thread a button's prompt was asked in (a copy is pressed in a decider's DM)."""
        parsed = parse_token(token)
        prompt = await self.store.prompts.by_token(parsed[0]) if parsed else None
        return prompt.thread_key if prompt is not None else None

    def _decision(self, prompt: PromptRecord, action: str) -> tuple[str, str | None] | None:
        if prompt.kind == "approval":
            status = APPROVAL_VERDICTS.get(action)
            return (status, None) if status else None
        choices = prompt.payload.get("choices", [])
        choice = chosen(action)
        if choice is not None and choice < len(choices):
            return "answered", choices[choice]
        return None

    async def _answer(self, press: ButtonPress, outcome: str, prompt: PromptRecord | None) -> SubmitResult:
        if outcome == "duplicate":
            return SubmitResult(press.event_id, duplicate=True)
        if outcome == "expired" and prompt is not None:
            await self.expire(prompt)
            expired = EXPIRED_QUESTION if is_in_call(prompt) else EXPIRED_ANSWER
            return SubmitResult(press.event_id, answer=expired, alert=True)
        if outcome != "decided" or prompt is None:
            return SubmitResult(press.event_id, answer=NOT_PENDING, alert=True)
        if prompt.kind == "approval":
            metrics.APPROVALS.labels("approved" if prompt.status == "approved" else "denied").inc()
        if prompt.decision in (Action.ALLOW_15M, Action.ALLOW_THREAD):
            tool = prompt.payload.get("grant") or prompt.payload.get("tool", "")
            expires = utcnow() + timedelta(minutes=BYPASS_MINUTES) if prompt.decision == Action.ALLOW_15M else None
            await self.store.prompts.add_bypass(
                thread_key=prompt.thread_key,
                tool=tool,
                expires_at=expires,
                granted_by=press.sender.id,
                prompt_id=prompt.id,
                person=prompt.requested_by,  # it covers the requester's later requests, nobody else's
            )
        return SubmitResult(press.event_id, answer=outcome_text(prompt))

    async def _rerun(self, press: ButtonPress, prompt: PromptRecord) -> SubmitResult:
        text = str(prompt.payload.get("text", ""))
        sender = SenderRef(press.sender.id, press.sender.name, press.sender.username)
        schedule_id = prompt.payload.get("schedule_id")
        message = rerun_message(f"rerun:{prompt.id}", prompt.thread_key, text, sender, schedule_id)
        result = await self.store.prompts.decide(
            prompt.id, status="answered", decision=Action.RERUN, decided_by=press.sender.id,
            decided_by_name=press.sender.name, event=self._event_item(press), resume=lambda _decided: message,
            enforce_expiry=False,
        )
        if result.outcome == "duplicate":
            return SubmitResult(press.event_id, duplicate=True)
        if result.outcome != "decided":
            return SubmitResult(press.event_id, answer="This job was already run again.", alert=True)
        await self.close(result.prompt or prompt)  # its button would only say it ran already
        return SubmitResult(press.event_id, answer="Running the job again here; approve its requests when asked.")

    @staticmethod
    def _event_item(press: ButtonPress) -> NewItem:
        return button_item(press.event_id, str(press.thread), press.token, press.sender.id)

    def may_decide(self, prompt: PromptRecord, user_id: str) -> bool:
        """The one who-may-decide rule, for buttons, typed answers, deny reasons and reruns."""
        channel = ThreadKey.parse(prompt.thread_key).channel
        own = prompt.payload.get("owner_decides") and str(user_id) == str(prompt.requested_by)
        if own and not self.config.approvals.separate_requester:
            return True  # what it changes is theirs alone (their own memory)
        by_rules = may_decide(
            channel,
            user_id,
            requested_by=prompt.requested_by,
            approvers_config=self.config.approvals.approvers,
            admins_config=self.access.admin_ids if self.access is not None else self.config.approvals.admins,
            # an approval is not the requester's to decide (unless the set-up says so)
            self_approve=prompt.kind != "approval" or requester_decides(self.config, channel),
        )
        if self.access is None or prompt.kind != "approval":
            return by_rules  # roles and separate_requester are about approvals, not questions
        return self.access.may_decide(
            channel, str(user_id), requested_by=prompt.requested_by, decided_by_rules=by_rules
        )

    async def answer_with_text(
        self, prompt: PromptRecord, text: str, *, sender_id: str, sender_name: str
    ) -> PromptRecord | None:
        """A message typed while a question is pending answers it (not a new turn), when its
        sender may decide it; None otherwise (or when someone answered first)."""
        if not self.may_decide(prompt, sender_id):
            return None
        result = await self.store.prompts.decide(
            prompt.id,
            status="answered",
            decision=Action.TEXT,
            decided_by=sender_id,
            decided_by_name=sender_name,
            answer=text,
            resume=_resume_of(prompt),
            now=self.clock.now(),
        )
        return result.prompt if result.outcome == "decided" else None

    async def expire(self, prompt: PromptRecord) -> None:
        result = await self.store.prompts.decide(
            prompt.id,
            status="expired",
            decision=Action.EXPIRED,
            decided_by="",
            answer=None,
            resume=_resume_of(prompt),
            now=self.clock.now(),
            enforce_expiry=False,
        )
        if result.outcome == "decided" and is_in_call(prompt):
            await self.close(result.prompt or prompt)  # no turn resumes to close it
        if result.outcome == "decided" and prompt.kind == "approval":
            metrics.APPROVALS.labels("expired").inc()

    async def expire_due(self) -> int:
        due = await self.store.prompts.due(self.clock.now())
        for prompt in due:
            await self.expire(prompt)
        return len(due)


def _resume_of(prompt: PromptRecord) -> Callable[[PromptRecord], NewItem] | None:
    """What a decision queues: the item that continues the turn parked on the prompt; none for
    a question a running call waits for (it reads the decision itself)."""
    return None if is_in_call(prompt) else resume_item
