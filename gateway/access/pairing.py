"""Who may talk to the agent: the check on every inbound message, pairing, and its decisions.

A direct message from someone not yet allowed gets a short code and nothing else: the message
is held in the inbox (never sent to the model) and the channel's admins get a prompt in their
own DM with Approve / Deny buttons naming the person; `gateway pairing approve CODE` does the
same. On approval the held messages go back to the queue and are answered (a held `/start` too). A
group or Slack channel not listed nor approved stays silent while its admins are asked the same
way. Before all this, a direct message may be the owner claiming a channel with no admin
(gateway/access/claim.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gateway.access.claim import Claims, claim_hint, is_start, refresh_admins
from gateway.access.policy import TRUSTED_CHANNELS, AccessPolicy
from gateway.config import Config
from gateway.delivery.outbox import Outbox
from gateway.events import Button, ButtonPress, Prompt, SubmitResult, ThreadKey
from gateway.running.clock import SYSTEM_CLOCK, Clock
from gateway.serving.display import escape_markdown, name_shown
from gateway.store import AccessRequestRecord, Action, Store
from gateway.store.access import TOKEN_PREFIX, DecideOutcome, Kind
from gateway.store.delegations import TASK_CHANNEL
from gateway.store.items import Said, button_item

log = logging.getLogger(__name__)

APPROVE, DENY = Action.APPROVE, Action.DENY
PAIRING_CODE = (
    "🔐 This assistant only talks to people its admins approved. Your pairing code is {code}: "
    "an admin will approve it (it expires in {ttl}). Your message will be answered then."
)
START_PAIRING = (
    "👋 Hello! This assistant only talks to people its admins approved. Your pairing code is {code}: an admin "
    "will approve it (it expires in {ttl}), and I'll answer your /start then."
)
PAIRING_FULL = (
    "🔐 This assistant only talks to people its admins approved, and too many requests are waiting right now. "
    "Please try again later."
)
PRIVATE = "Sorry, this assistant is private."
NOT_AN_ADMIN = "Only an admin can decide access requests."
NOT_PENDING = "This access request is no longer pending."
EXPIRED = "This access request has expired."
UNKNOWN = "This button is no longer valid."


@dataclass(frozen=True)
class Admission:
    allowed: bool
    hold: bool = False  # keep the item in the inbox, to answer once access is granted
    reply: str = ""  # what to tell the thread ("" = stay silent)
    request_id: int | None = None  # the access request a held item waits for


ALLOWED = Admission(True)


def describe(request: AccessRequestRecord, *, markdown: bool = True) -> str:
    """The person or chat, for an admin's prompt (`markdown`) or the terminal: the display name
    is theirs to choose, so it is shown escaped (no links or formatting of its own)."""
    escape = escape_markdown if markdown else str
    shown = name_shown(request.name, markdown=markdown)
    if request.kind == "chat":
        who = f" by {shown}" if shown else ""
        return f"the chat {escape(request.subject)} on {request.channel} (addressed{who})"
    name = f"{shown} " if shown else ""
    return f"{name}({request.channel}:{escape(request.subject)})"


def outcome_text(request: AccessRequestRecord, by: str) -> str:
    by = name_shown(by, markdown=False)  # an outcome line is plain text
    if request.status == "approved":
        return f"✅ Access approved by {by}"
    if request.status == "denied":
        return f"❌ Access denied by {by}"
    return "⌛ Expired"


def ttl_text(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    if seconds >= 60:
        return f"{int(seconds // 60)} min"
    return f"{int(seconds)} s"


class Gatekeeper:
    def __init__(
        self, store: Store, outbox: Outbox, config: Config, policy: AccessPolicy, *, clock: Clock = SYSTEM_CLOCK
    ):
        self.store = store
        self.outbox = outbox
        self.config = config
        self.policy = policy
        self.clock = clock  # pairing requests expire by it (access.pairing_ttl)
        self.claims = Claims(store, config, policy, clock=clock)

    # ---- every message ---------------------------------------------------------------------
    async def admit(self, thread: ThreadKey, said: Said, *, command: bool) -> Admission:
        channel = thread.channel
        await refresh_admins(self.store, self.policy)  # a claim, or a removal, counts from the next message
        if channel in TRUSTED_CHANNELS or channel == TASK_CHANNEL or said.rerun_of is not None:
            # the terminal, scheduled sessions, a job run again by a button, and a background
            # task's own thread (only the gateway writes there: its start, a /stop handed to it)
            return ALLOWED
        claim = await self.claims.attempt(thread, said)
        if claim is not None:  # answered, never kept for the model (the code is not theirs to see again)
            return Admission(False, reply=claim.text)
        user_id, username = said.sender.id, said.sender.username
        if self.policy.admitted_by_name(channel, user_id, username, private=said.private):
            return ALLOWED
        access = self.config.access
        if said.private:
            if access.dm_policy == "open" or await self.store.access.grant_for("user", channel, user_id):
                return ALLOWED
            if access.dm_policy == "allowlist":
                return Admission(False, reply=self._with_claim_hint(channel, PRIVATE))
            greet = is_start(said.text)  # a /start is held like a message and answered once paired
            return await self._pair(
                thread, "user", user_id, said.sender.name or username, hold=not command or greet, asked_by=user_id,
                greet=greet,
            )
        if access.group_policy == "open" or self.policy.listed_chat(channel, thread.chat):
            return ALLOWED
        if await self.store.access.grant_for("chat", channel, thread.chat):
            return ALLOWED
        admission = await self._pair(
            thread, "chat", thread.chat, said.sender.name or username, hold=not command, asked_by=user_id
        )
        return Admission(False, hold=admission.hold, request_id=admission.request_id)  # a group not approved: silent

    def _with_claim_hint(self, channel: str, text: str) -> str:
        """A stranger's notice, with how to claim the channel while it has no admin (they may be its owner)."""
        return f"{text}\n{claim_hint(channel)}" if self.claims.claimable(channel) else text

    async def _pair(
        self, thread: ThreadKey, kind: Kind, subject: str, name: str, *, hold: bool, asked_by: str, greet: bool = False
    ) -> Admission:
        """A stranger is answered once per code (its lifetime), not once per message: a flood
        of messages neither renews the code nor makes the bot send a flood of replies. `greet`:
        the message is a `/start`, held and answered once approved like any message."""
        access = self.config.access
        outcome = await self.store.access.request(
            kind=kind,
            channel=thread.channel,
            subject=subject,
            name=name,
            thread_key=str(thread),
            ttl_s=access.pairing_ttl,
            max_pending=access.max_pending_per_channel,
            now=self.clock.now(),
            asked_by=asked_by,
        )
        if outcome.request is None:
            return Admission(False, reply=PAIRING_FULL if await self._first_full(thread, asked_by) else "")
        if outcome.kind != "created":  # told already: held (or dropped) without a word
            return Admission(False, hold=hold, request_id=outcome.request.id)
        await self._ask_admins(outcome.request)
        notice = (START_PAIRING if greet else PAIRING_CODE).format(
            code=outcome.request.code, ttl=ttl_text(access.pairing_ttl)
        )
        return Admission(
            False, hold=hold, reply=self._with_claim_hint(thread.channel, notice), request_id=outcome.request.id
        )

    async def _first_full(self, thread: ThreadKey, asked_by: str) -> bool:
        """"Try again later" once per person per `pairing_ttl` window, not once per message."""
        window = int(self.clock.now().timestamp() // max(self.config.access.pairing_ttl, 1))
        name = f"access:full:{thread.channel}:{asked_by or thread.chat}:{window}"
        return await self.store.inbox.bump_counter(name) == 1

    async def _ask_admins(self, request: AccessRequestRecord) -> None:
        admins = self.policy.admins(request.channel)
        if not admins:
            log.warning(
                "access request %s (%s) waits for `gateway pairing approve %s`: %s has no admin (approvals.admins, "
                "or the claim line of the start log)",
                request.id,
                describe(request),
                request.code,
                request.channel,
            )
            return
        text = f"🔐 Access request from {describe(request)}. Code {request.code}. Let them talk to the assistant?"
        if request.kind == "chat":
            text = f"🔐 The bot was added to {describe(request)}. Code {request.code}. Answer in this chat?"
        buttons = ((
            Button("✅ Approve", f"{request.token}.{APPROVE}", tone="positive"),
            Button("❌ Deny", f"{request.token}.{DENY}", tone="negative"),
        ),)
        sent = []
        for admin in admins:
            dm = ThreadKey(request.channel, admin, "")
            try:
                delivered = await self.outbox.send_prompt(
                    Prompt("notice", dm, f"pairing:{request.id}:{admin}", text, buttons)
                )
            except Exception:  # noqa: BLE001 - one unreachable admin must not stop the others
                log.exception("could not ask admin %s about access request %s", admin, request.id)
                continue
            sent.append([str(dm), list(delivered.message_ids)])
        await self.store.access.set_prompts(request.id, sent)

    # ---- decisions -------------------------------------------------------------------------
    @staticmethod
    def handles(press: ButtonPress) -> bool:
        return press.token.startswith(TOKEN_PREFIX)

    async def press(self, press: ButtonPress) -> tuple[SubmitResult, str | None]:
        """An admin's tap on a pairing prompt; returns the answer and the thread whose held
        messages were queued again (to wake it)."""
        token, _, action = press.token.rpartition(".")
        await refresh_admins(self.store, self.policy)
        request = await self.store.access.find(token=token)
        if request is None or action not in (APPROVE, DENY):
            return SubmitResult(press.event_id, answer=UNKNOWN, alert=True), None
        if not press.operator and not self.policy.is_admin(request.channel, press.sender.id):
            return SubmitResult(press.event_id, answer=NOT_AN_ADMIN, alert=True), None
        event = button_item(press.event_id, str(press.thread), press.token, press.sender.id)
        by = press.sender.name or press.sender.username or press.sender.id
        decider = press.sender.id if press.operator else f"{request.channel}:{press.sender.id}"
        result = await self.store.access.decide(
            request.id, approve=action == APPROVE, decided_by=decider, event=event, now=self.clock.now()
        )
        return await self._answer(press.event_id, result, by)

    async def _answer(self, event_id: str, result: DecideOutcome, by: str) -> tuple[SubmitResult, str | None]:
        if result.kind == "duplicate":
            return SubmitResult(event_id, duplicate=True), None
        if result.kind == "expired":
            if result.request is not None:
                await self.close(result.request, by)
            return SubmitResult(event_id, answer=EXPIRED, alert=True), None
        if result.kind != "decided" or result.request is None:
            return SubmitResult(event_id, answer=NOT_PENDING, alert=True), None
        await self.close(result.request, by)
        woken = result.request.thread_key if result.request.status == "approved" else None
        return SubmitResult(event_id, answer=outcome_text(result.request, by)), woken

    async def close(self, request: AccessRequestRecord, by: str) -> None:
        """Show the outcome on every admin's prompt and remove the buttons."""
        current = await self.store.access.get(request.id) or request
        for thread_key, message_ids in current.prompts:
            try:
                await self.outbox.close_prompt(
                    f"close:pairing:{request.id}:{thread_key}",
                    ThreadKey.parse(thread_key),
                    list(message_ids),
                    outcome_text(current, by),
                )
            except Exception as exc:  # noqa: BLE001 - a stale prompt must not fail the decision
                log.warning("could not update the prompt of access request %s: %s", request.id, exc)

    async def expire_due(self) -> int:
        expired = await self.store.access.expire_due(self.clock.now())
        for request in expired:
            await self.close(request, "")
        return len(expired)
