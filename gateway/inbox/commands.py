"""Chat commands, handled before the model and never sent to it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from gateway.access import TRUSTED_CHANNELS
from gateway.access.claim import claimable, start_text
from gateway.agent import spans
from gateway.agent.audit_trail import Decided, tool_call_entry
from gateway.agent.messages import TurnOutcome, TurnRequest, placeholder_text
from gateway.agent.services import TurnServices
from gateway.budgets import Payer, cost_lines, current_payer
from gateway.budgets.jobs import chat_jobs_lines
from gateway.context import CompactionError
from gateway.events import ThreadKey, utcnow
from gateway.inbox.models import ModelCommand, model_line
from gateway.inbox.rich_command import rich_command
from gateway.mcp.prompts import PromptCall, PromptCommand, help_lines, parse_arguments
from gateway.mcp.prompts import commands as prompt_commands
from gateway.memory import memory_command
from gateway.store import Fence, InboxItem, OutboxRecord, Store
from gateway.store.items import Said
from gateway.traces.runs import RunTrace, Spending, current_spending, format_nano_usd
from gateway.voice.command import voice_command

COMMANDS = {
    "stop": "cancel the running turn and drop queued messages",
    "new": "start a new session in this chat",
    "status": "what the agent is doing, queued messages, pending requests, tokens and cost",
    "cost": "tokens and cost of this session, and of the jobs that report here",
    "compact": "summarise older history now to free context",
    "memory": "what I remember here; /memory forget N, /memory clear, /memory share on|off",
    "model": "the models you may use; /model NAME switches this session, /model default goes back",
    "voice": "whether answers here also come as a voice note: /voice on, /voice off",
    "rich": "Telegram: long answers, tables and headings as one rich message: /rich on, /rich off",
    "start": "what I am, and what you may do here",
    "help": "this list",
}
# Answered at once even while a turn runs (they don't touch the conversation).
IMMEDIATE = frozenset({"status", "cost", "help", "memory", "voice", "rich"})
# Cancel the running turn first.
INTERRUPTING = frozenset({"stop", "new"})
# Commands that switch something for the chat they are sent in, all answered the same way.
CHAT_CHOICES = {"voice": voice_command, "rich": rich_command}
NEW_TOPIC = "A new conversation: what shall we talk about?"
STOP_NOT_YOURS = "This turn was started by someone else; only they or an admin can stop it."
Ended = Callable[[TurnRequest, TurnOutcome], Awaitable[None]]


@dataclass(frozen=True)
class Command:
    name: str  # without the slash or @bot suffix; "" for an unknown command
    word: str  # as typed
    args: str


def is_stop(item: InboxItem) -> bool:
    command = parse_command(Said.of(item).text) if item.kind == "command" else None
    return command is not None and command.name == "stop"


def parse_command(text: str) -> Command | None:
    """`/cmd`, `/cmd@botname args`; None when the text is not a command."""
    stripped = text.strip()
    if not stripped.startswith("/") or len(stripped) < 2 or stripped[1].isspace():
        return None
    word, _, args = stripped.partition(" ")
    name = word[1:].split("@", 1)[0].lower()
    if "/" in name:  # a path such as /usr/bin is not a command
        return None
    return Command(name if name in COMMANDS else "", word, args.strip())


def help_text(unknown: str = "", prompts: Sequence[str] = ()) -> str:
    """The commands, then the connected MCP servers' prompts (gateway/mcp/prompts.py)."""
    lines = [f"Unknown command {unknown}." if unknown else "Commands:"]
    if unknown:
        lines.append("Commands:")
    lines += [f"/{name} — {what}" for name, what in COMMANDS.items()]
    if prompts:
        lines += ["MCP prompts (their text is the server's):", *prompts]
    return "\n".join(lines)


def status_text(
    *,
    running: bool,
    model: str = "",
    queued: int,
    prompts: int,
    totals: dict,
    mcp: dict[str, dict] | None = None,
    undelivered: Sequence[OutboxRecord] = (),
) -> str:
    state = "🟢 working on a turn" if running else "⚪ idle"
    lines = [f"Status: {state}", f"Queued messages: {queued}", f"Pending requests: {prompts}"]
    if undelivered:
        lines.append(f"Messages not delivered yet: {len(undelivered)}")
        now = utcnow()
        waits = [r.retry_at for r in undelivered if r.retry_at is not None and r.retry_at > now]
        if waits:
            lines.append(f"  waiting: next attempt at {max(waits):%H:%M:%S} UTC")
    if model:
        lines.append(model)
    lines.append(cost_text(totals))
    lines += [mcp_state_line(name, server) for name, server in (mcp or {}).items()]
    return "\n".join(lines)


def mcp_state_line(name: str, server: dict) -> str:
    """An MCP server's state as a chat sees it: never the error's text, which may quote a URL,
    a path or a credential (the console and `gateway doctor` show it to the operator)."""
    status = server["status"]
    if status == "running":
        return f"MCP {name}: 🟢 running, {server['tools']} tools"
    if status == "failed":
        wait = server.get("retry_in_s") or 0
        return f"MCP {name}: 🔴 down (restarting{f' in {wait:g}s' if wait else ''})"
    return f"MCP {name}: {status}"


def cost_text(totals: dict) -> str:
    """The session's use: the same figures as its runs' (`gateway runs`), summed."""
    estimated = " (partly estimated: the model server sent no token counts)" if totals.get("estimated_runs") else ""
    cache = f"{totals.get('cached_tokens', 0):,} cached"
    if totals.get("cache_write_tokens"):
        cache += f", {totals['cache_write_tokens']:,} written to the cache"
    reasoning = f" ({totals['reasoning_tokens']:,} reasoning)" if totals.get("reasoning_tokens") else ""
    return (
        f"Session: {totals.get('input_tokens', 0):,} input tokens ({cache}), "
        f"{totals.get('output_tokens', 0):,} output tokens{reasoning}, "
        f"cost {format_nano_usd(totals.get('cost_nano_usd'))}{estimated}"
    )


class Commands:
    """How the inbox answers commands. `ended` reports the end of a parked run that /stop or
    /new canceled (gateway/inbox/running.py `TurnEnds.report`)."""

    def __init__(self, store: Store, services: TurnServices, *, ended: Ended):
        self.store = store
        self.services = services
        self.config = services.config
        self.ended = ended
        self.models = ModelCommand(store, self.config.llm, services.access, services.outbox)

    async def handle(self, thread: ThreadKey, item: InboxItem, fence: Fence) -> None:
        command = parse_command(Said.of(item).text)
        name = command.name if command else ""
        refusal = await self.refusal(thread, item, name)
        if refusal:
            await self._reply(thread, item, refusal)
        elif name == "stop":
            await self._stop_thread(thread, drop_before=item.id)
            session = await self.store.sessions.current(str(thread))
            if session is not None and self.services.delegation is not None:
                await self.services.delegation.control.stop_background(session.id, item.id)
            await self._reply(thread, item, "Stopped.")
        elif name == "new":
            await self._stop_thread(thread)
            said = Said.of(item)
            topic = await self._open_topic(thread, said.private)
            await self.store.sessions.open(
                str(topic or thread), source=thread.channel, started_by=said.sender.id, fresh=True,
                private=said.private,
            )
            if topic is None:
                await self._reply(thread, item, "Started a new session.")
            else:  # the new conversation has its own topic; this one stays as it was, to come back to
                await self.services.outbox.send_text(topic, NEW_TOPIC, key=f"cmd:{item.id}:topic")
                await self._reply(thread, item, "Started a new conversation in a topic of its own.")
        elif name == "start":
            await self._reply(thread, item, self._start(thread, item))
        elif name == "compact":
            await self._reply(thread, item, await self._compact(thread, item))
        elif name == "model":
            said = Said.of(item)
            sender = said.sender.id
            session = await self.store.sessions.current(str(thread)) or await self.store.sessions.open(
                str(thread), source=thread.channel, started_by=sender, private=said.private
            )
            args = command.args if command else ""
            await self._reply(thread, item, await self.models.answer(session, thread.channel, sender, args))
        else:
            await self.answer(
                thread, item, name or "help", running=False, unknown="" if name else (command.word if command else "")
            )
            return
        await self.store.inbox.finish([item.id], fence=fence)

    async def answer(
        self, thread: ThreadKey, item: InboxItem, name: str, *, running: bool, unknown: str = ""
    ) -> None:
        session = await self.store.sessions.current(str(thread))
        totals = await self.store.runs.session_totals(session.id) if session else {}
        # the model of the asker's turns here: in a group each person's own (gateway/access/models.py)
        model = model_line(self.config.llm, self.models.for_person(session, thread.channel, Said.of(item).sender.id))
        if name == "status":
            queued = await self.store.inbox.count_pending(str(thread), kinds=("message",))
            prompts = len(await self.store.prompts.pending(thread_key=str(thread)))
            mcp = self.services.tool_services.get("mcp")
            servers = mcp.summary() if mcp else None
            undelivered = await self.store.outbox.undelivered(str(thread))
            text = status_text(
                running=running,
                model=model,
                queued=queued,
                prompts=prompts,
                totals=totals,
                mcp=servers,
                undelivered=undelivered,
            )
            if session is not None and self.services.delegation is not None:
                text = "\n".join([text, *await self.services.delegation.control.status_lines(session.id)])
        elif name == "cost":
            lines = [model, cost_text(totals), *await self._budget_lines(thread, item)]
            zone = ZoneInfo(self.config.scheduler.timezone)
            text = "\n".join([*lines, *await chat_jobs_lines(self.store, zone, thread, utcnow())])
        elif name == "memory":
            said = Said.of(item)
            command = parse_command(said.text)
            text = await memory_command(
                self.store, self.config.memory, self.services.access, thread, said.sender.id, said.private,
                command.args if command else "",
            )
        elif name in CHAT_CHOICES:  # /voice, /rich: a chat's own switch
            said = Said.of(item)
            command = parse_command(said.text)
            text = await CHAT_CHOICES[name](
                self.store, self.config, self.services.access, thread, said.sender.id, said.private,
                command.args if command else "",
            )
        else:
            text = help_text(unknown, help_lines(self.prompt_commands()))
        await self._reply(thread, item, text)
        await self.store.inbox.finish([item.id])

    async def _open_topic(self, thread: ThreadKey, private: bool) -> ThreadKey | None:
        """A new thread for `/new` where the channel opens one (`telegram.new_topic_per_conversation`)."""
        channel = self.services.outbox.channels.get(thread.channel)
        opener = getattr(channel, "open_topic", None)
        if opener is None or not private or not getattr(channel, "topic_per_conversation", False):
            return None
        now = utcnow().astimezone(ZoneInfo(self.config.agent.timezone))
        return await opener(thread, f"Chat of {now:%b} {now.day}, {now:%H:%M}")

    def prompt_commands(self) -> dict[str, PromptCommand]:
        """The running MCP servers' prompts by command; the built-in commands keep their names."""
        mcp = self.services.tool_services.get("mcp")
        return prompt_commands(mcp.prompts, set(COMMANDS)) if mcp is not None else {}

    def prompt_call(self, item: InboxItem) -> PromptCall | str | None:
        """An MCP prompt's command with its arguments, the one line that says what to write
        instead, or None when the item is no prompt's command."""
        command = parse_command(Said.of(item).text)
        if command is None or command.name:
            return None
        found = self.prompt_commands().get(command.word[1:].split("@", 1)[0].lower())
        if found is None:
            return None
        try:
            return PromptCall(found, parse_arguments(found, command.args))
        except ValueError as exc:
            return str(exc)

    async def refusal(self, thread: ThreadKey, item: InboxItem, name: str, *, running_for: str | None = None) -> str:
        """Why this person's role may not run the command here ("" when it may). `running_for`:
        who asked for the turn running now (a /stop sent while it runs)."""
        access = self.services.access
        sender = Said.of(item).sender.id
        if access is None:
            return ""
        if name == "stop" and not await self._may_stop(thread, sender, running_for):
            return STOP_NOT_YOURS
        if name == "compact" and not access.may_compact(thread.channel, sender):
            return f"Your role ({access.role_name(thread.channel, sender)}) may not run /compact."
        if name == "new":
            session = await self.store.sessions.current(str(thread))
            if session is not None and not access.may_start_over(thread.channel, sender, started_by=session.started_by):
                role = access.role_name(thread.channel, sender)
                return f"This session was started by someone else; your role ({role}) may not run /new for others."
        return ""

    def _start(self, thread: ThreadKey, item: InboxItem) -> str:
        sender = Said.of(item).sender
        access = self.services.access
        admin = access is not None and access.is_admin(thread.channel, sender.id)
        open_to_claim = access is not None and claimable(self.config, access, thread.channel)
        return start_text(thread.channel, sender.name or sender.username, admin=admin, claimable=open_to_claim)

    async def _may_stop(self, thread: ThreadKey, sender: str, running_for: str | None) -> bool:
        """A member stops their own turn (running, or parked on a request); an admin anyone's."""
        access = self.services.access
        if access is None or thread.channel in TRUSTED_CHANNELS or access.is_admin(thread.channel, sender):
            return True
        if not sender:
            return True  # queued by the gateway itself (a /stop handed to a background task's thread)
        if running_for is not None:
            owners = {running_for}
        else:
            owners = {p.requested_by for p in await self.store.prompts.pending(thread_key=str(thread))}
        return not {str(owner) for owner in owners if owner and str(owner) != str(sender)}

    async def refuse_now(self, thread: ThreadKey, item: InboxItem, text: str) -> None:
        """A command refused while a turn runs: answered and done at once (the turn goes on)."""
        await self._reply(thread, item, text)
        await self.store.inbox.finish([item.id])

    async def _budget_lines(self, thread: ThreadKey, item: InboxItem) -> list[str]:
        if not self.config.budgets.caps:
            return []
        sender = Said.of(item).sender.id
        payer = Payer(user=f"{thread.channel}:{sender}" if sender else None, chat=f"{thread.channel}:{thread.chat}")
        return await cost_lines(self.store, self.config, payer)

    async def _reply(self, thread: ThreadKey, item: InboxItem, text: str) -> None:
        if thread.channel not in self.services.outbox.channels:
            return  # a background task's own thread (a /stop sent to it): nobody reads it
        await self.services.outbox.send_text(thread, text, key=f"cmd:{item.id}", reply_to=Said.of(item).message_id)

    async def _stop_thread(self, thread: ThreadKey, *, drop_before: int | None = None) -> None:
        """Cancel pending prompts (and their parked runs); with `drop_before`, drop the
        messages queued before that item (recorded as dropped, with the session)."""
        for prompt in await self.store.prompts.pending(thread_key=str(thread)):
            for canceled in await self.store.prompts.cancel([prompt.id]):
                await self.services.prompts.close(canceled)
                if canceled.run_id is not None:
                    await self._cancel_parked_run(thread, canceled.run_id)
        if drop_before is not None:
            session = await self.store.sessions.current(str(thread))
            await self.store.inbox.drop_pending(  # queued edits of answered messages go with the messages
                str(thread),
                kinds=("message", "edit"),
                before_id=drop_before,
                session_id=session.id if session else None,
            )

    async def _cancel_parked_run(self, thread: ThreadKey, run_id: int) -> None:
        """A parked run is canceled, with the parents waiting on it when it is a sub-agent's."""
        delegation = self.services.delegation
        chain = await delegation.control.chain(run_id) if delegation is not None else [run_id]
        for i, parked in enumerate(chain):
            await self._cancel_one_parked_run(thread, parked, report=i == len(chain) - 1)

    async def _cancel_one_parked_run(self, thread: ThreadKey, run_id: int, *, report: bool) -> None:
        run = await self.store.runs.get(run_id)
        if run is None or run.stage != "AWAITING_INPUT":
            return
        session = await self.store.sessions.get(run.session_id)
        for call in await self.store.sessions.open_tool_calls(run.session_id):
            note = placeholder_text("canceled")
            audit = tool_call_entry(call, "cancelled", Decided("canceled", reason="/stop"), thread=thread)
            await self.store.sessions.set_tool_call(call.id, status="cancelled", result=note, note=note, audit=audit)
        await RunTrace(self.store, run_id, config=self.config.traces, prices=self.config.llm.price_of).cancel()
        await spans.ended_elsewhere(self.services.telemetry, self.store, run_id, thread)
        if session is not None and report:
            delegation = self.services.delegation
            child = await delegation.control.context_of(session) if delegation is not None else None
            request = TurnRequest(session, thread, child=child)  # a background task still reports its end
            await self.ended(request, TurnOutcome(run_id, "CANCELED", "canceled"))

    async def _compact(self, thread: ThreadKey, item: InboxItem) -> str:
        """Its summaries are counted on a run of their own (end reason `compact`) and spent for
        the person who asked."""
        session = await self.store.sessions.current(str(thread))
        if session is None or self.services.context is None:
            return "Nothing to compact yet."
        sender = Said.of(item).sender.id
        model = self.config.llm.ref(self.models.for_person(session, thread.channel, sender))
        run = await self.store.runs.start(session.id, str(thread), model=model)
        trace = RunTrace(self.store, run.id, config=self.config.traces, prices=self.config.llm.price_of)
        payer = Payer(user=f"{thread.channel}:{sender}" if sender else None, chat=f"{thread.channel}:{thread.chat}")
        paying, spending = current_payer.set(payer), current_spending.set(Spending(trace, model))
        try:
            result = await self.services.context.compact_now(
                session, system_prompt=self.config.agent.system_prompt, model=model
            )
        except CompactionError as exc:
            await trace.end("FAILED", end_reason="compact", error=str(exc))
            return f"Could not compact: {exc}"
        finally:
            current_spending.reset(spending)
            current_payer.reset(paying)
        await trace.end("SUCCESS", end_reason="compact")
        if result is None:
            return "Nothing to compact: the history is already short."
        return f"Compacted {result.entries_folded} entries into a summary."
