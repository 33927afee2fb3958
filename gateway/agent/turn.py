"""One agent turn: rounds of LLM calls and tool calls, gated, parked and resumed from the database.

The loop is driven by what the database says: open tool calls of the session are processed
first (after a park or a restart), then a new LLM round starts. So resuming a parked turn,
continuing after a crash and running a fresh turn are the same code.

`Turn` owns the loop, the LLM rounds and the end; once its run is open it composes the two
objects that do the rest: `ToolCalls` (tool_calls.py: check, gate, park, run, settle) and
`Refusals` (refusals.py: what a refused request or a broken stream means).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from gateway import telemetry
from gateway.access.models import chosen_model
from gateway.agent import spans
from gateway.agent.ending import ending_of, record_end
from gateway.agent.estimates import estimated_usage
from gateway.agent.guards import LENGTH_NOTICE, REPETITION_NOTICE, LengthGuard, RepetitionStreak, ToolLoopGuard
from gateway.agent.messages import END_MESSAGES, EndTurn, PlaceholderReason, TurnOutcome, TurnRequest
from gateway.agent.refusals import Refusals
from gateway.agent.rounds import Round, RoundBuilder
from gateway.agent.services import TurnServices
from gateway.agent.tool_calls import ToolCalls
from gateway.budgets import Payer, current_payer
from gateway.context.fitting import json_chars
from gateway.delivery.outbox import ORPHANED, RecordedStream
from gateway.events import ThreadKey
from gateway.llm import LLMError, ModelInfo, ReasoningDelta, RetryNotice, TextDelta, ToolCallDelta, Usage
from gateway.memory import turn_scope
from gateway.running.lifecycle import Interrupted, Stopper, interruptible
from gateway.serving import metrics
from gateway.store import LeaseLost, RecordedRound, RunRecord, SessionRecord, ToolCallRecord
from gateway.traces.runs import RunTrace, Spending, current_spending

log = logging.getLogger(__name__)

FIRST_TOKEN = (TextDelta, ReasoningDelta, ToolCallDelta)  # what "time to first token" waits for
PERSIST_TIMEOUT_S = 10.0  # bound on persisting one round; a store write outlives a cancel
REPLY_KEY_PREFIX = "reply:"  # + the message id: the outbox key of a round's shown text


class Turn:
    calls: ToolCalls  # composed when the run is open (they write under its id)
    refusals: Refusals

    def __init__(
        self,
        services: TurnServices,
        request: TurnRequest,
        *,
        drain: Callable[[], Awaitable[int]] | None = None,
        stopping: Callable[[], bool] = lambda: False,
        stopper: Stopper | None = None,
    ):
        self.services = services
        self.req = request
        self.session = request.session
        self.child = request.child
        # A background child's worker holds its own thread; it is shown in its parent's chat.
        self.thread = request.child.chat if request.child is not None else request.thread
        self.drain = drain
        self.stopping = stopping
        self.cfg = services.config
        # The model its requester's role allows, checked each time a turn runs (gateway/access/models.py).
        acting = request.acting(self.thread.channel)
        self.choice = chosen_model(self.cfg.llm, services.access, self.session, request.requested_by, acting)
        self.model = self.choice.ref
        if self.choice.refused:
            log.warning("%s: the role of %s may not use the model %s; this turn uses %s",
                        self.thread, ":".join(acting), self.choice.refused, self.model)
        self.run_id = 0
        self.trace: RunTrace | None = None  # None until the run is open
        self.rounds = 0
        self.max_rounds = self.session.max_rounds or self.cfg.agent.max_rounds
        self.auto_denied: list[str] = []
        self.mcp_schema_chars = 0
        self._mcp_tools: set[str] = set()  # names of the MCP tools offered this round
        self.last_response_seq: int | None = None
        self.reply = ""
        self.repetition = RepetitionStreak()
        self.length = LengthGuard()
        self.loop_guard = ToolLoopGuard()
        # reason: "stop", "new", "interrupt", "shutdown", "lease lost"; a child shares its parent's
        self.stopper = stopper or Stopper()
        self._adopt: tuple[str, ...] = ()  # messages of a reply a restart interrupted
        self._adopt_uncertain = False  # ... and whether one of them timed out (it may be shown)
        self._declared: list[ToolCallRecord] | None = None  # open calls the last round recorded
        self._notes: dict[str, str] | None = dict(self.session.notes)
        self._memory: str | None = None  # the memory section of the system message, read once a round with tools
        self._speaker_memory = ""  # a group speaker's shared memory: said in the tail of their turn
        self._refused: list[str] = []  # tools offered that this turn's people may not use (refused when called)
        self._skills: str | None = None  # the skills' names and descriptions, read once a turn (a stable prefix)
        self._fallbacks: list[dict[str, Any]] = []  # the last LLM call's moves to another model
        self.spans: telemetry.RunSpans | None = None  # with telemetry on: this run's, current while it runs
        self._spans_token: Any = None
        self._llm_started_ns, self._llm_started_s = 0, 0.0
        self._first_token_s: float | None = None  # when the LLM call being read sent its first token

    def request_stop(self, reason: str) -> None:
        """Stop at once if an LLM call or a tool is running, else at the next boundary."""
        self.stopper.stop(reason)

    # ---- entry ---------------------------------------------------------------------------
    async def run(self) -> TurnOutcome:
        paying = current_payer.set(self.payer())  # every LLM call of this turn is spent for them
        spending = current_spending.set(None)  # set once the run is open; a child's ends with it
        started = time.monotonic()
        try:
            outcome = await self._run()
            log.debug("%s: run %s %s (%s)", self.thread, self.run_id, outcome.stage, outcome.end_reason)
            if self.spans is not None and outcome.stage in spans.FINAL_STAGES:
                await self._end_turn_span()
        finally:
            current_spending.reset(spending)
            current_payer.reset(paying)
            if self._spans_token is not None:
                telemetry.leave(self._spans_token)
        metrics.TURNS.labels(outcome.stage, outcome.end_reason).inc()
        metrics.TURN_SECONDS.observe(time.monotonic() - started)
        return outcome

    def payer(self) -> Payer:
        return turn_payer(self.session, self.thread, self.req.requested_by, self.req.on_behalf_of)

    async def _run(self) -> TurnOutcome:
        await self._open_run()
        try:
            await self._loop()
        except Exception as exc:  # noqa: BLE001 - the turn's one catch: a crash ends it like any other end
            ending = ending_of(exc, self.stopper, self.run_id, self.thread)
        if isinstance(ending, TurnOutcome):
            return ending  # nothing more may be written (a lost lease), or the run goes on elsewhere
        return await self._finish(*ending)

    async def _open_run(self) -> None:
        store = self.services.store
        reopened = None
        parked = self.req.parked_run
        if parked is not None and parked.stage in ("AWAITING_INPUT", "RUNNING"):
            self.run_id, self.rounds, reopened = parked.id, parked.rounds, parked.id
        if self.req.started_run is not None:
            self.run_id = self.req.started_run.id
        run = self.req.started_run or (parked if reopened else None)
        if not self.run_id:
            run = await store.runs.start(self.session.id, str(self.thread), model=self.model)
            self.run_id = run.id
        self.req.memory = await turn_scope(store, self.cfg.memory, self.session, self.req)
        await self._trace_spans(run)
        self.trace = trace = RunTrace(
            store, self.run_id, config=self.cfg.traces, prices=self.cfg.llm.price_of, fence=self.req.fence
        )
        current_spending.set(Spending(trace, self.model))  # summaries and sampling are counted on it
        if reopened == self.run_id:
            await trace.reopen()
            # Tool calls run after the resume link to the response that asked for them.
            self.last_response_seq = await store.runs.last_event_seq(self.run_id, "LLM_RESPONSE")
        delegation = self.services.delegation
        self.calls = ToolCalls(
            self.services,
            self.req,
            trace,
            thread=self.thread,
            stopper=self.stopper,
            loop_guard=self.loop_guard,
            notice=self._notice,
            tool_ran=self._forget_notes,
            auto_denied=self.auto_denied,
            delegate=partial(delegation.run_calls, self) if delegation is not None else None,
        )
        self.refusals = Refusals(self.services, self.req, trace)
        if self.req.continued_run is not None:
            await self._adopt_partial_reply(self.req.continued_run)

    async def _trace_spans(self, run: RunRecord | None) -> None:
        """With telemetry on: this run's spans become the current ones until the turn ends."""
        if self.services.telemetry is None:
            return
        if run is not None and run.trace_id and run.trace_span_id:
            ids = (run.trace_id, run.trace_span_id)
        else:  # a run from before trace ids were kept
            ids = await self.services.store.runs.trace_ids(self.run_id)
        self.spans = self.services.telemetry.run(*ids)
        self._spans_token = telemetry.enter(self.spans)

    async def _end_turn_span(self) -> None:
        """The turn span, from the run's start (before any park) to its end, with its totals."""
        assert self.spans is not None
        try:
            run = await self.services.store.runs.get(self.run_id)
            if run is not None:
                spans.turn(self.spans, run, self.thread, interactive=self.session.interactive)
        except Exception:  # noqa: BLE001 - like a trace write, a span never fails the turn
            log.exception("run %s: the turn span was not written", self.run_id)

    async def _adopt_partial_reply(self, continued_run: int) -> None:
        """Adopted once, by this run, which records them as its own until it delivers."""
        adopted = await self.services.store.outbox.adopt_partial(
            partial_key(continued_run), partial_key(self.run_id), str(self.thread), fence=self.req.fence,
            orphaned=ORPHANED,
        )
        if adopted is not None:
            self._adopt = tuple(adopted.message_ids)
            self._adopt_uncertain = adopted.uncertain is not None  # its delivery is the one resend

    @property
    def _trace(self) -> RunTrace:
        assert self.trace is not None, "the run is open"
        return self.trace

    # ---- the loop ------------------------------------------------------------------------
    async def _loop(self) -> NoReturn:
        await self._deliver_undelivered_reply()
        await self.services.registry.first_listing()  # MCP servers still starting: their tools too
        # A fresh turn starts from a new user row: nothing is open yet. A resumed or continued
        # one, and every round after the first, may have calls to finish.
        calls_may_be_open = self.req.parked_run is not None or self.req.continuing or self.req.opens_with_calls
        sessions = self.services.store.sessions
        while True:
            open_calls, self._declared = self._declared, None  # the last round's open calls: not read again
            if read_back := open_calls is None:
                open_calls = await sessions.open_tool_calls(self.session.id) if calls_may_be_open else []
            calls_may_be_open = True
            if open_calls:
                await self.calls.process(open_calls, parent_seq=self.last_response_seq, fresh=not read_back)
            if self.stopper.stopped:
                raise Interrupted(self.stopper.reason)
            if self.stopping():
                raise EndTurn("SUSPENDED", "shutdown")
            if self.drain is not None:
                await self.drain()
            if self.rounds >= self.max_rounds:
                raise EndTurn("FAILED", "max_rounds", message=END_MESSAGES["max_rounds"].format(rounds=self.rounds))
            await self._check_budget()
            await self._llm_round()

    async def _deliver_undelivered_reply(self) -> None:
        """After a restart: a final reply persisted but not delivered is delivered once, and the
        turn ends there (never re-generated, never sent twice)."""
        if not self.req.continuing:
            return
        after_seq = max(self.session.next_seq - 2, 0)
        history = await self.services.store.sessions.history(self.session.id, after_seq=after_seq)
        last = history[-1] if history else None
        if last is None or last.role != "assistant" or last.tool_calls or last.status != "ok":
            return
        if last.content.strip() and self.child is None:
            key = f"{REPLY_KEY_PREFIX}{last.id}"
            await self._note_orphaned(key)
            await self._stream().finish(key, last.content)  # a no-op when it was sent
        self.reply = last.content
        raise EndTurn("SUCCESS", "reply")

    async def _note_orphaned(self, key: str) -> None:
        """The reply's send by the run this one continues left no word of its outcome (the
        process was killed while the platform was slow to answer, say): it may be in the chat.
        Its delivery now is the one resend, listed by `gateway outbox`."""
        outbox = self.services.store.outbox
        row = await outbox.get(key)
        if row is not None and row.status == "pending" and row.uncertain is None:
            await outbox.note_uncertain(key, row.thread_key, row.kind, ORPHANED, ())

    async def _check_budget(self) -> None:
        if not self.session.max_tokens:
            return
        run = await self.services.store.runs.get(self.run_id)
        if run and run.input_tokens + run.output_tokens >= self.session.max_tokens:
            raise EndTurn("FAILED", "budget", message=END_MESSAGES["budget"])

    def _stream(self) -> RecordedStream:
        """The round's reply stream. The messages it opens are recorded as they appear, so the
        turn that continues after a stop of any kind (shutdown, kill -9, a lost lease) edits
        them into the complete reply: one reply, not a stale half beside a whole one."""
        adopt, self._adopt = self._adopt, ()
        uncertain, self._adopt_uncertain = self._adopt_uncertain, False
        return self.services.outbox.stream(
            self.thread,
            self.req.reply_to,
            adopt,
            progress_key=partial_key(self.run_id),
            uncertain=uncertain,
            links=self.req.links,
        )

    # ---- one LLM round -------------------------------------------------------------------
    async def _llm_round(self) -> None:
        """One streamed LLM call, persisted; raises EndTurn when the turn has its final reply."""
        stream = self._stream()
        try:
            round_, info, usage, latency, built = await self._call_llm(stream)
        except Interrupted:
            if self.stopper.reason not in ("shutdown", "lease lost"):
                await stream.abort()  # else its recorded messages are left to the turn that continues
            raise
        self.rounds += 1
        model = info.model
        if usage is None:
            usage = await estimated_usage(
                self.services.llm, self.services.context, model, built.messages, built.estimated_tokens, round_,
                tools=built.tools,
            )
        shows_text = round_.repetition is None and bool(round_.text.strip()) and self.child is None
        traced = self._trace_llm(round_, info, usage, latency, built)
        recorded = await self._persist_round(round_, usage, traced, stream if shows_text else None)
        self._llm_span(round_, model, usage, latency, traced[1].get("cost_nano_usd"))
        self.last_response_seq = recorded.event_seqs[-1] if recorded.event_seqs else None
        # Calls open before this round were settled first (or the turn parked): now open are its own.
        self._declared = [c for c in recorded.message.tool_calls if c.status in ("pending", "running")]
        counted = not usage.estimated or usage.prompt_tokens != built.estimated_tokens  # not our own guess
        if self.services.context is not None and counted:
            self.services.context.observe_usage(model, built.raw_tokens, usage.prompt_tokens)
        await self._settle_round(round_, recorded, stream)

    def _llm_span(self, round_: Round, model: str, usage: Usage, latency_ms: float, cost: int | None) -> None:
        first = self._first_token_s
        spans.llm_call(
            requested=self.cfg.llm.model, model=model, started_ns=self._llm_started_ns, latency_ms=latency_ms,
            first_token_ms=(first - self._llm_started_s) * 1000 if first is not None else None,
            usage=usage, cost_nano_usd=cost, round_no=self.rounds, tool_calls=len(round_.calls),
            finish="tool_calls" if round_.calls else "length" if round_.cut_off else "stop",
        )

    async def _settle_round(self, round_: Round, recorded: RecordedRound, stream: RecordedStream) -> None:
        """What a persisted round means for the turn: retry, go on with its tool calls, or end."""
        if round_.repetition is not None:
            await stream.abort()
            if self.repetition.record(True) == "repetition":
                raise EndTurn("FAILED", "repetition", message=END_MESSAGES["repetition"])
            await self._notice(REPETITION_NOTICE)
            return
        self.repetition.record(False)
        reply = recorded.reply
        if round_.calls:
            if reply is not None:
                await stream.deliver(reply, round_.text)
            else:
                await stream.abort()
            return
        if round_.cut_off:
            if reply is not None:
                await stream.deliver(reply, round_.text)
            if self.length.record("length") == "overflow":
                raise EndTurn("FAILED", "overflow", message=END_MESSAGES["overflow"])
            await self._notice(LENGTH_NOTICE)
            return
        self.reply = round_.text
        if reply is None:
            await stream.abort()
        else:  # the run is finished in the write that marks its reply delivered
            await self._trace.end_with(
                "SUCCESS", "reply", lambda final: stream.deliver(reply, round_.text, final_stage=final)
            )
        raise EndTurn("SUCCESS", "reply")

    async def _call_llm(self, stream: RecordedStream):  # noqa: ANN202
        while True:
            built = await self._build_context(self._offered_tools())  # the tools come back fitted to the window
            builder = RoundBuilder(id_prefix=f"call_{self.run_id}_{self.rounds + 1}")
            started = self._llm_started_s = time.monotonic()
            self._llm_started_ns, self._first_token_s = time.time_ns(), None
            tools = list(built.tools)
            self._count_mcp_schemas(tools)
            try:
                model, usage = await interruptible(self._consume(built.messages, tools, builder, stream), self.stopper)
            except LLMError as exc:  # returns only to send again
                spans.llm_failure(
                    requested=self.cfg.llm.model, started_ns=self._llm_started_ns, round_no=self.rounds + 1,
                    error=f"{type(exc).__name__}: {exc}",
                )
                await self.refusals.after_llm_error(exc, built, builder, stream, round_no=self.rounds + 1)
                continue
            return builder.finish(), model, usage, (time.monotonic() - started) * 1000, built

    async def _consume(self, messages, tools, builder: RoundBuilder, stream: RecordedStream):  # noqa: ANN001, ANN202
        """Read one LLM stream into the builder, showing text as it grows. No database work
        happens here, so a stop may cancel it at any point (which closes the HTTP request);
        a fallback to another model is kept for the round's trace."""
        model, usage = ModelInfo(self.model), None
        thinking_shown = False
        self._fallbacks = []
        async for event in self.services.llm.stream(
            messages,
            tools or None,
            model=self.model,
            on_retry=self._note_fallback,
            fallback=self.choice.fallback,
            cache_key=f"session-{self.session.id}",  # one provider cache per session
        ):
            if isinstance(event, ModelInfo):
                model = event
                builder.feed(event)  # the round knows its model: what it must replay goes to that model only
                continue
            if isinstance(event, Usage):
                usage = event
            elif self._first_token_s is None and isinstance(event, FIRST_TOKEN):
                self._first_token_s = time.monotonic()
            if builder.feed(event) is not None:
                break  # repetition: stop reading (closing the stream cancels generation)
            if self.session.interactive and self.child is None:
                if isinstance(event, TextDelta):
                    await stream.show(builder.text_so_far)
                elif isinstance(event, ReasoningDelta) and not thinking_shown:
                    thinking_shown = True  # once a round: the sign stays until the text replaces it
                    await stream.thinking()
        return model, usage

    def _note_fallback(self, notice: RetryNotice) -> None:
        if notice.next_model != notice.model:
            self._fallbacks.append(
                {"from": notice.model, "to": notice.next_model, "after": notice.attempt, "error": notice.error.message}
            )

    async def _build_context(self, tools: list[dict[str, Any]]):  # noqa: ANN202
        if self._notes is None:  # read again only after a tool ran (the scratchpad tools change them)
            self._notes = await self.services.store.sessions.get_notes(self.session.id)
        context = self.services.context
        if self._memory is None:  # likewise: memory_forget takes an entry out at once
            book = self.services.memory
            room = await context.memory_tokens(self.model, self.cfg.memory.budget_tokens) if book is not None else 0
            sections = await book.sections(self.req.memory, self.session, room) if book is not None else ("", "")
            self._memory, self._speaker_memory = sections
        # The session's memory follows the static prompt and is the same in every turn of the
        # session; what changes (the scratchpad, the speaker's shared memory, the tools this
        # turn's people may not use) is said in the tail, so the provider's cache holds.
        return await context.build(
            self.session,
            system_prompt=await self._system_prompt(tools),
            memory=self._memory,
            tools=tools,
            turn_started_seq=self.req.turn_started_seq,
            notes=self._notes,
            now=datetime.now(UTC),
            timezone=self.cfg.agent.timezone,
            workspace=self._working_directory(await self.calls.files_dir()),
            reminder=self._reminder(),
            model=self.model,
        )

    def _reminder(self) -> str | None:
        parts = []
        if self._refused:
            parts.append(
                "Tools refused in this turn (the role of the person asking, or of someone whose words it "
                f"holds, does not allow them): {', '.join(self._refused)}."
            )
        if self._speaker_memory:
            parts.append(self._speaker_memory)
        return "\n".join(parts) or None

    async def _system_prompt(self, tools: list[dict[str, Any]]) -> str:
        """The configured prompt, then the skills this turn's person is offered (names and
        descriptions, sorted): both part of the prefix that stays the same between rounds."""
        catalog = self.services.tool_services.get("skills")
        if catalog is None or not any(t["function"]["name"] == "skill_read" for t in tools):
            return self.cfg.agent.system_prompt
        if self._skills is None:
            channel, user = self.req.acting(self.thread.channel)
            self._skills = await catalog.prompt_block(
                catalog.allowed(f"{channel}:{user}" if user else "", f"{self.thread.channel}:{self.thread.chat}")
            )
        return "\n\n".join(part for part in (self.cfg.agent.system_prompt, self._skills) if part)

    def _working_directory(self, files: Path) -> str:
        shared = self.cfg.agent.shared_dir.strip()
        if not shared:
            return str(files)
        mode = "read and write" if self.cfg.agent.shared_writable else "read-only"
        return f"{files}; shared directory ({mode}, absolute paths): {Path(shared).expanduser().resolve()}"

    def _forget_notes(self) -> None:
        self._notes = None
        self._memory = None

    def _offered_tools(self) -> list[dict[str, Any]]:
        """The same array in every request of the session, whoever asks (a provider caches it
        with the prompt): the built-ins in their order, then the MCP tools sorted by name."""
        offered = sorted(self.calls.offered(), key=lambda s: ("mcp" in s.classes, s.name if "mcp" in s.classes else ""))
        self._mcp_tools = {s.name for s in offered if "mcp" in s.classes}
        self._refused = self.calls.refused([s.name for s in offered])
        return [s.openai() for s in offered]

    def _count_mcp_schemas(self, tools: list[dict[str, Any]]) -> None:
        """MCP schemas come from servers we do not control: their prompt cost (of those sent)
        is traced on its own."""
        self.mcp_schema_chars = sum(
            json_chars(t) for t in tools if t["function"]["name"] in self._mcp_tools
        )

    async def _persist_round(
        self, round_: Round, usage: Usage | None, trace: tuple[list, dict], shown: RecordedStream | None
    ) -> RecordedRound:
        """The round's message, its trace and (when it shows text) the reply's delivery intent,
        in one write."""
        calls = [self.calls.declare(call, round_.cut_off) for call in round_.calls]
        usage_json = usage.__dict__ if usage is not None else None
        usage_json = {k: v for k, v in (usage_json or {}).items() if k != "kind"} or None
        events, totals = trace
        # A store write runs to completion even if this task is cancelled; waiting for it is bounded.
        async with asyncio.timeout(PERSIST_TIMEOUT_S):
            return await self.services.store.record_round(
                self.session.id,
                round_.text,
                reasoning=round_.reasoning or None,
                usage=usage_json,
                run_id=self.run_id,
                calls=calls,
                fence=self.req.fence,
                events=events,
                totals=totals,
                reply=(REPLY_KEY_PREFIX, str(self.thread), shown.intent(round_.text)) if shown is not None else None,
                replay=round_.replay if round_.calls else None,  # needed only by the turn's next rounds
            )

    def _trace_llm(  # noqa: ANN001
        self, round_: Round, info: ModelInfo, usage: Usage | None, latency_ms: float, built
    ) -> tuple[list, dict]:
        request = {
            "model": info.model,
            "messages": len(built.messages),
            "estimated_tokens": built.estimated_tokens,
            "round": self.rounds,
            "mcp_schema_chars": self.mcp_schema_chars,
        }
        if info.fell_back_from:
            request["fell_back_from"] = list(info.fell_back_from)
        events, totals = self._trace.llm_call(
            request=request, response=round_.traced(), latency_ms=latency_ms, model=info.model, usage=usage or Usage()
        )
        # The fallback is recorded on the run, before the call it led to.
        fallbacks = [("LLM_FALLBACK", fallback, None) for fallback in self._fallbacks if info.fell_back_from]
        return fallbacks + events, totals

    async def _notice(self, text: str) -> None:
        await self.services.store.sessions.append(
            self.session.id, "user", text, synthetic=True, run_id=self.run_id, fence=self.req.fence
        )

    # ---- the end -------------------------------------------------------------------------
    async def _finish(
        self, end: EndTurn, placeholder: PlaceholderReason | None = None, apology: str | None = None
    ) -> TurnOutcome:
        try:
            recorded = record_end(
                self.services, self.req, self._trace, end, thread=self.thread, placeholder=placeholder, apology=apology
            )
            await asyncio.wait_for(recorded, PERSIST_TIMEOUT_S * 2)
        except LeaseLost:
            return TurnOutcome(self.run_id, "LOST", end.reason, error=end.error)
        except Exception:  # noqa: BLE001 - the end is told even when it could not be recorded
            log.exception("%s: could not record the end of run %s", self.thread, self.run_id)
        return TurnOutcome(
            self.run_id, end.stage, end.reason, self.reply, end.error, tuple(self.auto_denied), end.prompt_id
        )


def turn_payer(session: SessionRecord, thread: ThreadKey, requested_by: str, on_behalf_of: str | None) -> Payer:
    """Whom the spend caps count a turn's calls for (its transcriptions too): the person who
    started it, the chat, and the job of a scheduled session."""
    channel = thread.channel
    person = requested_by if session.interactive and requested_by else None
    job = str(session.schedule_id) if session.schedule_id is not None else None
    chat = f"{channel}:{thread.chat}" if session.interactive else None
    user = f"{channel}:{person}" if person else None
    if user is None and on_behalf_of and not on_behalf_of.endswith(":?"):
        user = on_behalf_of  # a member's job spends from their own `scope: user` caps
    return Payer(user=user, chat=chat, job=job)


def partial_key(run_id: int) -> str:
    return f"partial:{run_id}"
