"""Composition root: builds the store, LLM client, tools, channels, inbox, scheduler and HTTP
server, and runs them. The only module that imports channels/ and scheduler/."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from channels.headless import HeadlessChannel
from gateway import telemetry
from gateway.access import AccessPolicy, Gatekeeper
from gateway.access.claim import start_claims
from gateway.access.notes import explicit_dm_policy
from gateway.admin import log_if_off as console_on
from gateway.admin import mount as mount_admin
from gateway.agent.delegate_tool import DELEGATE, delegate_spec
from gateway.agent.delegation import Delegation
from gateway.agent.services import TurnServices
from gateway.approvals.ask_user import ask_user_spec
from gateway.approvals.policy import ApprovalPolicy
from gateway.approvals.prompts import PromptService
from gateway.attachments import AttachmentPreparer, Heard, TranscriptionRefused
from gateway.budgets import SpendGate
from gateway.config import Config
from gateway.context import ContextBuilder, history_search_spec
from gateway.context.fitting import Fit
from gateway.delivery.channel_state import StoreChannelState
from gateway.delivery.outbox import Outbox
from gateway.delivery.pacing import ChatPacer, RetryPolicy
from gateway.events import Channel, Delivered, InboundEvent, Outbound, Prompt, SubmitResult, ThreadKey, utcnow
from gateway.files.checklists import ChecklistFiles
from gateway.files.workspace import adopt_legacy_layout, private_workspace, shared_root
from gateway.inbox.inbox import Inbox, default_instance_id
from gateway.jobs.checks import JobChecks
from gateway.llm import LLMClient
from gateway.llm.checkup import Finding, ModelServerCheck
from gateway.llm.gate import BudgetReached
from gateway.llm.health import model_server_state
from gateway.llm.pricing import minutes_cost
from gateway.mcp import McpManager
from gateway.mcp.oauth import TokenVault
from gateway.memory import MemoryBook, memory_specs
from gateway.running.clock import SYSTEM_CLOCK, Clock
from gateway.running.leadership import Leadership, prune_forever
from gateway.running.startup import bind_failure, database_line, log_changed_defaults, workspace_unusable
from gateway.serving import metrics
from gateway.skills import SkillCatalog, skill_specs
from gateway.store import Store, notify
from gateway.store.console import HEARTBEAT_PREFIX
from gateway.store.holds import HOLDS_CHANNEL
from gateway.store.schedules import ScheduleRecord
from gateway.tools import ToolContext, ToolRegistry, default_registry, matches_any
from gateway.tools.builtin_search import search_specs
from gateway.tools.builtin_shell import sandbox_status
from gateway.tools.sandbox import sandbox_state
from gateway.traces.runs import current_spending
from gateway.voice import VoiceReplies
from scheduler import control as job_control
from scheduler.checklist_tool import checklist_tool
from scheduler.jobs import Scheduler
from scheduler.tools import schedule_tool

if TYPE_CHECKING:
    from gateway.serving.http import HttpServer
    from gateway.serving.status_server import StatusServer

log = logging.getLogger(__name__)


def settle_garbage_collector() -> None:
    """What the start built (modules, clients, tables) lives as long as the process: frozen out
    of the collector, whose full passes over it would stall the loop with many turns in flight;
    young collections less often, since a streamed chunk allocates many short-lived objects.
    The command line pauses the collector for the start; it resumes here."""
    gc.freeze()
    gc.set_threshold(10_000, 20, 50)
    gc.enable()


def platform_channels(config: Config, state: StoreChannelState) -> dict[str, Channel]:
    channels: dict[str, Channel] = {}
    pair_unlisted = explicit_dm_policy(config)
    # Imported only when enabled: a gateway without Telegram or Slack never loads their SDKs.
    if config.telegram.enabled:
        from channels.telegram import TelegramChannel

        channels["telegram"] = TelegramChannel(
            config.telegram, state, max_download_bytes=config.attachments.max_bytes, pair_unlisted=pair_unlisted
        )
    if config.slack.enabled:
        from channels.slack.channel import SlackChannel

        channels["slack"] = SlackChannel(config.slack, state, pair_unlisted=pair_unlisted)
    return channels


def _channel_and_user(person: str) -> tuple[str, str]:
    channel, _, user = person.partition(":")
    return channel, user


def build_registry(
    config: Config, store: Store, access: AccessPolicy | None = None, skills: SkillCatalog | None = None
) -> ToolRegistry:
    """The built-ins offered by `agent.tools`, plus the tools of the gateway's own features."""
    registry = default_registry(config.agent)
    extra = [ask_user_spec(), history_search_spec(store)] + ([delegate_spec()] if config.agent.max_depth > 0 else [])
    extra += skill_specs(skills, write=config.skills.write) if skills is not None and config.skills.dirs else []
    extra += search_specs(config.search)  # web_search, when search.provider names one
    admins = access.admin_ids if access is not None else None  # claimed admins count too
    extra += memory_specs(store, config, admins=admins) if config.memory.enabled else []
    for spec in extra:
        if matches_any(spec.name, config.agent.tools):
            registry.register(spec)
    return registry


class GatewayOperations:
    """What the web console sees and does in this gateway (gateway/admin/operations.py)."""

    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self.store = gateway.store
        self.config = gateway.config

    @property
    def instance_id(self) -> str:
        return self.gateway.inbox.instance_id

    async def submit(self, events: Sequence[InboundEvent]) -> list[SubmitResult]:
        return await self.gateway.inbox.submit(events)

    def channel_states(self) -> dict[str, str]:
        started = self.gateway.started_channels
        return {name: "running" if name in started else "not started" for name in self.gateway.channels}

    def mcp_summary(self) -> dict[str, dict[str, Any]]:
        return self.gateway.mcp.summary()

    async def model_server(self) -> dict[str, Any]:
        """The model server as /readyz tells it (asked again when its finding is old), with the
        times of its last answer and last error."""
        ready, shown = await self.gateway.model_server.readiness()
        return {**model_server_state(self.gateway.llm), "ready": ready, "problem": shown.get("problem", "")}

    async def sandbox(self) -> dict[str, Any]:
        return await asyncio.to_thread(sandbox_state, self.config.agent)  # bwrap's first check runs it

    def next_firing(self, schedule: ScheduleRecord) -> datetime | None:
        try:
            return job_control.next_firing(schedule, utcnow())
        except job_control.TriggerError:
            return None

    async def run_job(self, schedule: ScheduleRecord) -> str:
        return (await job_control.run_now(self.gateway.scheduler, schedule, utcnow()))[1]

    async def kill_job(self, schedule: ScheduleRecord) -> str:
        return await job_control.kill(self.gateway.scheduler, schedule)

    async def set_job_enabled(self, schedule: ScheduleRecord, enabled: bool) -> str:
        text = await job_control.switch(self.gateway.scheduler, schedule, enabled, utcnow())
        await self.gateway.scheduler.reload()
        return text


class Gateway:
    def __init__(
        self,
        config: Config,
        *,
        channels: Mapping[str, Channel] | None = None,
        instance_id: str | None = None,
        serve_http: bool = True,
        llm: LLMClient | None = None,
        store: Store | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ):
        """`clock`: what prompts expire by (a test's advances by hand)."""
        self.config = config
        self._owns = {"store": store is None, "llm": llm is None}
        instance_id = instance_id or config.serve.instance_id or default_instance_id()
        self.store = store or Store(
            config.database.url,
            echo=config.database.echo,
            pool_size=config.database.pool_size,
            max_overflow=config.database.max_overflow,
            application_name=f"gateway {instance_id}",  # pg_stat_activity: connections per instance
        )
        self.llm = llm or LLMClient(config.llm)
        self.channel_state = StoreChannelState(self.store)
        self.channels: dict[str, Channel] = (
            dict(channels) if channels is not None else platform_channels(config, self.channel_state)
        )
        for name in ("cron", "tick"):
            self.channels.setdefault(name, HeadlessChannel(name))
        self.outbox = Outbox(
            self.store,
            self.channels,
            pacer=ChatPacer(shared=self.store.holds),
            policy=RetryPolicy.from_config(config.outbox),
        )
        self.access = AccessPolicy(config)
        self.gatekeeper = Gatekeeper(self.store, self.outbox, config, self.access, clock=clock)
        self.spend = SpendGate(self.store, config, alert=self._alert_admins)
        self.llm.gate = self.spend  # every request, retries and summaries included, is checked first
        self.model_server = ModelServerCheck(self.llm)  # checked at start and by /readyz
        self.prompts = PromptService(self.store, self.outbox, config, access=self.access, clock=clock)
        allowed = self.access.skill_allowed_for
        self.skills = SkillCatalog(config.skills, self.store, allowed_for=allowed)  # pinned skills, by role
        self.registry = build_registry(config, self.store, self.access, self.skills)
        self.policy = ApprovalPolicy.from_config(config.approvals, config.agent.workspace)
        for problem in self.policy.errors:
            log.error("%s (calls it names will require approval)", problem)
        self.context = ContextBuilder(
            self.store,
            config.context,
            config.llm,
            config.agent,
            summarise=self._summarise,
            on_event=self._on_context_event,
            tool_lod={s.name: s.lod for s in self.registry.specs()},
            attachments=config.attachments,
            windows=self.llm.window_tokens,
            count=self.llm.count_tokens,
        )
        self.services = TurnServices(
            self.store,
            config,
            self.llm,
            self.registry,
            self.policy,
            self.context,
            self.outbox,
            self.prompts,
            tool_services={
                "store": self.store,
                "config": config,
                "outbox": self.outbox,
                "file_target": self._file_target,
                "llm": self.llm,
                "prompts": self.prompts,  # an MCP server's question asked in the middle of a call
                "skills": self.skills,  # the system prompt's list of skills (gateway/agent/turn.py)
            },
            attachments=self._attachments(),
            access=self.access,
            gatekeeper=self.gatekeeper,
            spend=self.spend,
            memory=MemoryBook(self.store, config.memory) if config.memory.enabled else None,
            voice=VoiceReplies(self.store, config, self.llm, self.outbox) if config.llm.speech_model else None,
        )
        # MCP servers add their tools to the registry while they run (and remove them when down).
        self.mcp = McpManager(config.mcp, self.registry, vaults=lambda name: TokenVault.from_env(self.store, name))
        self.services.tool_services["mcp"] = self.mcp
        if config.mcp.servers:  # the call an MCP prompt's chat command opens its turn with (never offered)
            self.registry.register(self.mcp.prompt_spec())
        self.inbox = Inbox(self.store, self.services, instance_id=instance_id)
        # None while telemetry.otlp_endpoint is empty: OpenTelemetry is then never imported.
        self.telemetry = telemetry.build(config.telemetry, instance_id=self.inbox.instance_id)
        self.services.telemetry = self.telemetry
        if DELEGATE in self.registry:
            self.services.delegation = Delegation(self.services, wake=self.inbox.poke)
        self.checklists = ChecklistFiles(config.agent.workspace)  # ticks' checklists, beside sessions/
        self.scheduler = Scheduler(
            self.store,
            config.scheduler,
            submit=self.inbox.submit,
            deliver=self.deliver,
            open_topic=self.open_topic,
            room_for_job=self.spend.room_for_job,
            checks=JobChecks(config.agent, mcp=self.mcp, config_source=config.source),
            read_checklist=self.checklists.read,
        )
        self.services.tool_services["scheduler"] = self.scheduler
        self.store.schedules.on_status = _count_firings
        if matches_any("schedule", config.agent.tools):
            spec = schedule_tool(
                self.store, config.scheduler, on_change=self.scheduler.reload,
                may_use=lambda person, tool: self.access.tool_allowed(*_channel_and_user(person), tool),
            )
            # A scheduled session must not schedule more runs: never offered there.
            self.registry.register(replace(spec, classes=spec.classes | {"interactive_only"}))
        if any(job.checklist for job in config.scheduler.jobs) and matches_any("checklist", config.agent.tools):
            # offered where a tick of config.yml works through a checklist; never in scheduled sessions
            self.registry.register(checklist_tool(self.store, self.checklists.read, self.checklists.write))
        self.inbox.listeners.append(self.scheduler.on_turn_ended)
        self.http = self._http_server() if serve_http else None
        self.leadership = Leadership(
            self.store,
            self.inbox.instance_id,
            config.inbox.lease_ttl_s,
            start_duties=self._start_duties,
            stop_duties=self._stop_duties,
            on_instances=self._share_rate_limits,
        )
        self._leader_task: asyncio.Task | None = None
        self._holds_stopped = asyncio.Event()
        self._holds_tasks: list[asyncio.Task] = []
        self._recounts: set[asyncio.Task] = set()
        self._clock_running = False
        self.started_channels: set[str] = set()

    @property
    def submit(self):  # noqa: ANN201 - the channels' Submit
        return self.inbox.submit

    def _http_server(self) -> HttpServer | StatusServer:
        """aiohttp when a channel takes webhooks or the console is on; otherwise the small
        status server, and aiohttp is never imported (a tenth of a second of every start)."""
        config = self.config
        from gateway.serving.status import StatusPages

        stuck_after = timedelta(seconds=config.outbox.sweep_after_s)
        pages = StatusPages(
            self, config.http, stuck_after=stuck_after, admin_token=config.admin.token, model_server=self.model_server
        )
        routes = [route for channel in self.channels.values() for route in getattr(channel, "routes", list)()]
        if not routes and not console_on(config.admin):
            from gateway.serving.status_server import StatusServer

            return StatusServer(pages)
        from gateway.serving.http import HttpServer

        server = HttpServer(pages, routes)
        mount_admin(server.app, GatewayOperations(self), server.guesses)
        return server

    def channels_started(self) -> dict[str, bool]:
        return {name: name in self.started_channels for name in self.channels}

    def mcp_summary(self) -> dict[str, dict[str, Any]]:
        return self.mcp.summary()

    async def _summarise(self, messages: list[dict[str, Any]], max_tokens: int) -> str:
        """A compaction's summary, by the session's model, counted on the turn's run (or /compact's)."""
        spending = current_spending.get()
        started = time.monotonic()
        model = spending.model if spending else None
        completion = await self.llm.complete(messages, max_tokens=max_tokens, model=model)
        if spending is not None:
            took = round((time.monotonic() - started) * 1000, 2)
            detail = {"output_chars": len(completion.text), "duration_ms": took}
            await spending.trace.aux_call("SUMMARY_CALL", completion.model, completion.usage, detail)
        return completion.text

    async def _on_context_event(self, kind: str, payload: dict[str, Any]) -> None:
        """Compaction start/end: recorded on the running turn's run, and shown in the chat."""
        turn = self.inbox.running_turn(int(payload.get("session_id", 0)))
        if turn is None or turn.trace is None:
            return
        await turn.trace.event(kind.upper(), payload)
        if kind == "compaction_started" and turn.session.interactive:
            key = f"compacting:{turn.session.id}:{payload.get('first_seq')}-{payload.get('last_seq')}"
            await self.outbox.send_text(turn.thread, "🗜 Compacting older history to make room…", key=key)

    async def _alert_admins(self, key: str, text: str) -> None:
        """A budget alert, in the DM of every admin of every channel that is running."""
        for channel, admins in self.access.admin_ids.items():  # configured and claimed
            if channel not in self.channels:
                continue
            for admin in admins:
                await self.outbox.send_text(ThreadKey(channel, str(admin), ""), text, key=f"{key}:{channel}:{admin}")

    async def deliver(self, item: Outbound | Prompt) -> Delivered:
        if isinstance(item, Prompt):
            return await self.outbox.send_prompt(item)
        return await self.outbox.send(item)

    async def open_topic(self, chat: ThreadKey, title: str) -> ThreadKey | None:
        """A topic of its own for a job (`topic`), where the chat's channel opens one."""
        opener = getattr(self.channels.get(chat.channel), "open_topic", None)
        return await opener(chat, title) if opener is not None else None

    # ---- lifecycle -----------------------------------------------------------------------
    async def _file_target(self, ctx: ToolContext) -> ThreadKey | None:
        """Files go to the chat of the session; a scheduled run's where its outcome goes (its job's
        `deliver_to`, or the job's own topic there)."""
        if ctx.interactive:
            return ctx.thread
        session = await self.store.sessions.get(ctx.session_id)
        schedule = await self.store.schedules.get(session.schedule_id) if session and session.schedule_id else None
        return await self.scheduler.outcomes.target(schedule) if schedule is not None else None

    def _attachments(self) -> AttachmentPreparer:
        fetchers = {
            name: fetch for name, channel in self.channels.items() if (fetch := getattr(channel, "fetch_file", None))
        }

        async def notify(thread: ThreadKey, text: str, key: str, reply_to: str) -> None:
            await self.outbox.send_text(thread, text, key=key, reply_to=reply_to)

        async def transcribe(audio: bytes, name: str, mime: str, seconds: float | None) -> Heard:
            """Through the spend caps (the payer is the turn's: see the inbox worker), priced by the minute."""
            model = self.config.llm.transcription_model
            try:
                heard = await self.llm.transcribe(audio, name, mime, seconds=seconds)
            except BudgetReached as exc:
                raise TranscriptionRefused(exc.message) from None
            price = self.config.llm.price_of(model)
            cost = minutes_cost(price, heard.seconds) if heard.seconds is not None else None
            return Heard(heard.text, model, heard.seconds, cost)

        return AttachmentPreparer(
            self.config.attachments,
            Path(self.config.agent.workspace).resolve(),
            fetchers,
            save_payload=self.store.inbox.set_payload,
            notify=notify,
            transcribe=transcribe if self.config.llm.transcription_model else None,
        )

    async def start(self) -> None:
        found = await self._open_database()  # None: a new database
        agent = self.config.agent
        try:
            private_workspace(agent.workspace)  # 0700: no other account reads the sessions' files
        except OSError as exc:
            raise workspace_unusable(self.config, exc) from exc
        adopt_legacy_layout(agent.workspace, self.config.attachments.dir, shared_root(agent.shared_dir))
        if matches_any("shell", agent.tools):
            sandbox_status(agent.shell_sandbox).log()
        await self.scheduler.sync_config_jobs()
        await start_claims(
            self.store, self.config, self.access, now=self.gatekeeper.clock.now(), upgrading=found is not None
        )
        if found is not None:  # an install from before: the defaults that changed under it
            log_changed_defaults(self.config)
        if legacy := self.config.llm.fallback_models:
            log.warning(
                "llm.fallback_models is deprecated: %s read as llm.models (the same server) and appended to "
                "llm.fallback (now %s); write them there instead (docs/models.md)",
                ", ".join(legacy),
                ", ".join(self.config.llm.fallback),
            )
        if self.telemetry is not None:
            log.info("telemetry: %s", self.telemetry.describe())
        await self._start_channels()
        if not set(self.channels) - {"cron", "tick"}:
            log.warning(
                "no chat channel is configured: `gateway setup` connects one (or set TELEGRAM_BOT_TOKEN to "
                "enable Telegram, SLACK_BOT_TOKEN and SLACK_APP_TOKEN (Socket Mode) or SLACK_SIGNING_SECRET "
                "(HTTP events) to enable Slack); `gateway chat` talks to the agent in this terminal"
            )
        self.model_server.start(then=self._fit_at_start)
        await self.mcp.start()
        await self._follow_holds()
        await self.inbox.start()
        if self.http is not None:
            await self._start_http(self.http)
        self._leader_task = asyncio.create_task(self.leadership.run(), name="leader")

    async def _open_database(self) -> str | None:
        """Connect and migrate (a failure is one line naming database.url); the log says which
        database when it is new or not the default. Returns the revision it was at."""
        found = await self.store.migrate(auto=self.config.database.auto_migrate)
        if line := database_line(self.config, new=found is None):
            log.info("%s", line)
        return found

    async def _start_channels(self) -> None:
        for name, channel in self.channels.items():
            try:
                await channel.start(self.submit)
                self.started_channels.add(name)
            except Exception as exc:  # the gateway does not start; the command line says why, once
                exc.add_note(f"(while starting the {name} channel)")
                await self._close_channels([*self.started_channels, name])
                raise

    async def _start_http(self, http: HttpServer | StatusServer) -> None:
        try:
            await http.start()
        except OSError as exc:  # one line naming http.port (or http.host) and where to set it
            await self._close_channels(list(self.started_channels))
            await self.mcp.stop()
            await self.model_server.stop()  # its line would follow the failure's
            raise bind_failure(exc, self.config.http, self.config.source) from exc

    async def _fit_at_start(self, found: Finding) -> None:
        """With the server's window known: what it leaves out of a request, said once."""
        if found.reachable:
            await self.fit_configured_tools()

    async def fit_configured_tools(self, *, quiet: bool = False) -> Fit:
        """The default model's request with the tools of `agent.tools` (before a person's role
        or the rules narrow them): what `gateway doctor` and the start log report."""
        tools = [spec.openai() for spec in self.registry.specs(self.config.agent.tools)]
        return await self.context.fit(self.config.llm.model, self.config.agent.system_prompt, "", tools, quiet=quiet)

    async def _close_channels(self, names: list[str]) -> None:
        """A start that failed closes the channels it opened (their connections), quietly: the
        failure is what the operator reads, not a second one from the cleanup."""
        for name in names:
            try:
                await self.channels[name].stop()
            except Exception:  # noqa: BLE001 - cleanup after a failure must not replace it
                log.debug("channel %s did not stop cleanly after the failed start", name, exc_info=True)

    def _on_shared_notice(self, payload: str) -> None:
        """The holds channel carries new flood holds ("<channel>:<chat>") and instances that
        arrived or left ("instance:<id>", see Leadership._announce)."""
        if not payload.startswith(HEARTBEAT_PREFIX):
            self.outbox.pacer.changed.set()
        elif payload != f"{HEARTBEAT_PREFIX}{self.inbox.instance_id}":
            recount = asyncio.create_task(self.leadership.count_instances(), name="count-instances")
            self._recounts.add(recount)  # held until done (the loop keeps only weak references)
            recount.add_done_callback(self._recounts.discard)

    def _share_rate_limits(self, instances: int) -> None:
        """A channel whose platform limits a bot as a whole (Telegram: 30 messages a second)
        takes its share of them among the instances sending for it."""
        for channel in self.channels.values():
            share = getattr(channel, "share_rate_limits", None)
            if share is not None:
                share(instances)

    async def _follow_holds(self) -> None:
        """Flood waits written by any instance (or before a restart) are honoured from the first send."""
        pacer = self.outbox.pacer
        await pacer.refresh()
        if self.store.is_sqlite:
            return  # one process: what it holds it knows; a restart read them just now
        listen = notify.listen(self.store.db, self._on_shared_notice, self._holds_stopped, channel=HOLDS_CHANNEL)
        self._holds_tasks = [
            asyncio.create_task(pacer.follow(self._holds_stopped), name="holds"),
            asyncio.create_task(listen, name="holds-listener"),
        ]

    async def stop(self) -> None:
        await self.model_server.stop()
        self._holds_stopped.set()
        self.leadership.stop()
        if self._leader_task is not None:
            await asyncio.gather(self._leader_task, return_exceptions=True)
        if self.http is not None:
            await self.http.stop_intake()
        await self.inbox.stop()
        if self.telemetry is not None:  # the turns are over: their last spans go out (bounded)
            await self.telemetry.shutdown()
        await asyncio.gather(*self._holds_tasks, return_exceptions=True)
        await self.mcp.stop()
        for channel in self.channels.values():
            try:
                await channel.stop()
            except Exception:  # noqa: BLE001 - one channel failing to stop must not keep the others running
                log.exception("channel %s failed to stop", channel.name)
        if self.http is not None:
            await self.http.stop()
        if self._owns["llm"]:
            await self.llm.aclose()
        if self._owns["store"]:
            await self.store.close()

    # ---- the leader's duties: Telegram polling, the scheduler clock, retention --------
    async def _start_duties(self) -> list[asyncio.Task]:
        duties = []
        telegram = self.channels.get("telegram")
        if telegram is not None and self.config.telegram.mode == "polling":
            duties.append(asyncio.create_task(telegram.poll_forever(), name="telegram-polling"))  # type: ignore[attr-defined]
        if self.config.scheduler.enabled:
            await self.scheduler.start()
            self._clock_running = True
        duties.append(asyncio.create_task(prune_forever(self.store, self.config.retention), name="retention"))
        return duties

    async def _stop_duties(self, duties: list[asyncio.Task]) -> None:
        for task in duties:
            task.cancel()
        await asyncio.gather(*duties, return_exceptions=True)
        if self._clock_running:
            self._clock_running = False
            await self.scheduler.stop()

    async def run_until_signalled(self) -> None:
        import signal

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        settle_garbage_collector()
        await stop.wait()
        log.info("stopping: finishing running turns (up to %.0fs)", self.config.serve.shutdown_grace)
        await self.stop()


def _count_firings(status: str, count: int) -> None:
    metrics.SCHEDULER_FIRINGS.labels(status).inc(count)
