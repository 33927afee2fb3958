"""Command line: `gateway serve | chat | doctor | migrate | backup | restore | jobs | runs | sessions | approvals`, and
`gateway pairing | access | budgets | audit | memory | skills`."""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
from typing import TYPE_CHECKING, Any

from gateway.files.private_files import private_by_default

if TYPE_CHECKING:  # imported in the functions: the collector is paused before they load
    from gateway.config import Config
    from gateway.store import Store


def main(argv: list[str] | None = None) -> int:
    # A start imports and builds a great many long-lived objects; the collector's passes over
    # them cost ~15% of a cold start. Paused until the command has started: `serve` and `chat`
    # resume it (with their thresholds) once up, the rest when they end. So this module imports
    # nothing heavy at its top: loading it (the console script does) would run those passes.
    gc.disable()
    private_by_default()  # the database, workspace and everything else it creates: 0600 / 0700
    try:
        return _run(argv)
    finally:
        gc.enable()


def _run(argv: list[str] | None) -> int:
    """Every failure the operator caused ends here, once: one line and its kind's exit code
    (gateway/cli/toplevel.py); the traceback only when debugging."""
    from gateway.cli.toplevel import INTERRUPTED, USAGE, reader_gone, report
    from gateway.config import ConfigError, load_config
    from gateway.events import OperatorError
    from gateway.running.lifecycle import run_main
    from gateway.serving.logs import configure as configure_logging

    args = argparse.Namespace(debug=False, log_level=None)
    config: Config | None = None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            parser.print_help()
            return USAGE
        if getattr(args, "without_config", False):  # `setup` writes the config: it need not load yet
            return run_main(args.handler(args, None)) or 0
        config = load_config(args.config)
        # Other libraries' chatter (and URLs that can carry a bot token) only when debugging.
        configure_logging(args.log_level or config.logging.level)
        code = run_main(args.handler(args, config)) or 0
        sys.stdout.flush()  # a reader that left is found here, not by the interpreter at exit
        return code
    except ConfigError as exc:
        return report(exc, "config", debug=_debugging(args, config))
    except OperatorError as exc:
        return report(exc, exc.kind, debug=_debugging(args, config))
    except BrokenPipeError:
        return reader_gone()
    except KeyboardInterrupt:
        return INTERRUPTED


def _debugging(args: argparse.Namespace, config: Config | None) -> bool:
    level = args.log_level or (config.logging.level if config is not None else None)
    return bool(args.debug) or level == "debug"


def build_parser() -> argparse.ArgumentParser:
    from gateway.cli.toplevel import VersionAction, describe_subcommands

    parser = argparse.ArgumentParser(
        prog="gateway", description="Chat gateway for an LLM agent (Telegram, Slack, cron)."
    )
    parser.add_argument("--version", action=VersionAction, help="print the installed version and exit")
    common = argparse.ArgumentParser(add_help=False)
    _add_common_options(parser, given_before=True)
    _add_common_options(common, given_before=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sub.add_parser(
        "serve", parents=[common], help="run the gateway: channels, workers, scheduler, HTTP",
        description="Run the gateway: the chat channels, the workers, the scheduler and the HTTP server "
        "(health, metrics, webhooks, console), until SIGTERM or Ctrl-C.",
    ).set_defaults(handler=cmd_serve)
    sub.add_parser(
        "chat", parents=[common], help="talk to the agent in this terminal",
        description="Talk to the agent in this terminal, with the same tools, approvals and database as serve.",
    ).set_defaults(handler=cmd_chat)
    migrate = sub.add_parser(
        "migrate", parents=[common], help="create the database or bring its schema up to date",
        description="Create the database, or apply the migrations it lacks; says which it did. On SQLite a "
        "backup is taken first (beside the database); a migration that fails leaves the database as it was.",
    )
    migrate.add_argument("--no-backup", action="store_true", help="skip the backup taken first on SQLite")
    migrate.set_defaults(handler=cmd_migrate)
    backup = sub.add_parser(
        "backup", parents=[common], help="a consistent copy of the database, taken while serving",
        description="SQLite: copy the database while the gateway serves, named after its schema and this version "
        "(beside the database unless PATH names a file or directory). PostgreSQL: print the pg_dump to run.",
    )
    backup.add_argument("path", nargs="?", default=None, metavar="PATH")
    backup.set_defaults(handler=cmd_backup)
    restore = sub.add_parser(
        "restore", parents=[common], help="put a backup in place of the database (no instance serving)",
        description="Check the backup (integrity, a schema this gateway knows), refuse while an instance serves, "
        "and put it in place of the SQLite database, keeping the file it replaces beside it.",
    )
    restore.add_argument("path", metavar="PATH")
    restore.set_defaults(handler=cmd_restore)
    sub.add_parser(
        "doctor",
        parents=[common],
        help="check every part: database, channels, jobs, model server, MCP servers; say what to fix",
        description="Check what serve needs, one line each with the fix: the database (connects, schema, driver), "
        "each channel's token and settings, the jobs' timings, the model server (reachable, key, model, window, "
        "streaming, tools) and the MCP servers; exits 1 when a check fails.",
    ).set_defaults(handler=cmd_doctor)
    from gateway.cli.setup import add_parser as add_setup_parser

    add_setup_parser(sub, parents=[common], handler=cmd_setup)

    runs = sub.add_parser("runs", parents=[common], help="run records (one per turn)")
    runs_sub = runs.add_subparsers(dest="action", required=True)
    runs_list = runs_sub.add_parser("list", parents=[common], help="the newest runs: status, model, tokens, cost")
    runs_list.add_argument("--limit", type=int, default=20)
    runs_list.add_argument("--session", type=int, default=None)
    runs_show = runs_sub.add_parser("show", parents=[common], help="one run: its events, tool calls and sub-agents")
    runs_show.add_argument("id", type=int)
    runs.set_defaults(handler=cmd_runs)

    sessions = sub.add_parser("sessions", parents=[common], help="sessions and their history")
    sessions_sub = sessions.add_subparsers(dest="action", required=True)
    sessions_list = sessions_sub.add_parser("list", parents=[common], help="the newest sessions and their threads")
    sessions_list.add_argument("--limit", type=int, default=20)
    sessions_show = sessions_sub.add_parser("show", parents=[common], help="one session: its history and totals")
    sessions_show.add_argument("id", type=int)
    sessions.set_defaults(handler=cmd_sessions)

    approvals = sub.add_parser("approvals", parents=[common], help="pending approval requests")
    approvals_sub = approvals.add_subparsers(dest="action", required=True)
    approvals_sub.add_parser("list", parents=[common], help="the requests waiting for a decision")
    for action in ("approve", "deny"):
        decide = approvals_sub.add_parser(action, parents=[common], help=f"{action} a waiting request by its id")
        decide.add_argument("id", type=int)
        decide.add_argument("--reason", default="")
    approvals.set_defaults(handler=cmd_approvals)

    outbox = sub.add_parser("outbox", parents=[common], help="sends not delivered yet, and ambiguous ones")
    outbox.add_argument("--limit", type=int, default=50)
    outbox.set_defaults(handler=cmd_outbox)

    from scheduler.cli import add_parser as add_jobs_parser

    add_jobs_parser(sub, parents=[common], handler=cmd_jobs)
    from gateway.access.cli import add_parsers as add_access_parsers

    add_access_parsers(sub, parents=[common], handler=cmd_access)
    budgets = sub.add_parser("budgets", parents=[common], help="the spend caps and their use this period")
    budgets.set_defaults(handler=cmd_budgets)
    from gateway.cli.audit import add_parser as add_audit_parser

    add_audit_parser(sub, parents=[common], handler=cmd_audit)
    from gateway.cli.mcp_login import add_parser as add_mcp_parser

    add_mcp_parser(sub, parents=[common], handler=cmd_mcp)
    from gateway.cli.memory import add_parser as add_memory_parser

    add_memory_parser(sub, parents=[common], handler=cmd_memory)
    from gateway.cli.skills import add_parser as add_skills_parser

    add_skills_parser(sub, parents=[common], handler=cmd_skills)
    from gateway.cli.status import add_parser as add_status_parser

    add_status_parser(sub, parents=[common], handler=cmd_status)
    describe_subcommands(parser)
    return parser


def _add_common_options(parser: argparse.ArgumentParser, *, given_before: bool) -> None:
    """The options every command takes, before or after its name. After it, they are SUPPRESSed
    when not given: a command's parser then leaves the value given before the name alone."""
    default: Any = None if given_before else argparse.SUPPRESS
    parser.add_argument(
        "--config", default=default, help="path to config.yml (default: $GATEWAY_CONFIG or ./config.yml)"
    )
    parser.add_argument(
        "--log-level", default=default, choices=["debug", "info", "warning", "error"], help="default: logging.level"
    )
    parser.add_argument(
        "--debug", action="store_true", default=False if given_before else default,
        help="on a failure, print its traceback above its one line (as logging.level: debug does)",
    )


async def cmd_mcp(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.mcp_login import run

    if args.action == "key":
        return await run(args, config, None)
    store = await _store(config)
    try:
        return await run(args, config, store)
    finally:
        await store.close()


async def _store(config: Config) -> Store:
    """The database, migrated; stderr says which one when it is not the default, or is new."""
    from gateway.running.startup import database_line
    from gateway.store import Store

    store = Store(config.database.url)
    try:
        found = await store.migrate(auto=config.database.auto_migrate)
    except BaseException:
        await store.close()
        raise
    if line := database_line(config, new=found is None):
        print(line, file=sys.stderr)
    return store


async def cmd_backup(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.backup import run_backup

    print(await run_backup(config.database.url, args.path))
    return 0


async def cmd_restore(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.backup import run_restore

    print(await run_restore(config.database.url, args.path))
    return 0


async def cmd_migrate(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.migrate import migrate
    from gateway.running.startup import database_place
    from gateway.store.db import SCHEMA_REVISION

    where = database_place(config)
    found, lines = await migrate(config.database.url, take_backup=not args.no_backup, where=where)
    for line in lines:
        print(line)
    if found is None:
        print(f"created the database at {where} (schema {SCHEMA_REVISION})")
    elif found != SCHEMA_REVISION:
        print(f"upgraded the database at {where} from schema {found} to {SCHEMA_REVISION}")
    else:
        print(f"the database at {where} is up to date (schema {SCHEMA_REVISION})")
    return 0


async def cmd_doctor(args: argparse.Namespace, config: Config) -> int:
    from gateway.access.notes import doctor_checks
    from gateway.cli.doctor import Check, diagnose, diagnose_mcp, print_check
    from gateway.cli.doctor_parts import parts_checks
    from gateway.cli.window import window_check
    from gateway.config.redaction import redact_url
    from gateway.tools.sandbox import doctor_checks as sandbox_checks
    from scheduler import control

    local = [*doctor_checks(config), *sandbox_checks(config.agent)]
    access = [*await parts_checks(config, control)]  # the database, the channels, the jobs
    access += [Check(name, status, found, fix) for name, status, found, fix in local]  # type: ignore[arg-type]
    for check in access:
        print_check(check)
    print(f"model server {redact_url(config.llm.base_url)}, model {config.llm.model}", flush=True)
    report = await diagnose(config.llm, on_check=print_check)
    await window_check(config, report, on_check=print_check)  # what the model's window leaves out
    report.checks[:0] = access
    if config.mcp.servers:
        print(f"MCP servers: {', '.join(config.mcp.servers)}", flush=True)
        store = await _store(config) if any(s.auth == "oauth" for s in config.mcp.servers.values()) else None
        try:
            report.checks += (await diagnose_mcp(config.mcp, on_check=print_check, store=store)).checks
        finally:
            if store is not None:
                await store.close()
    print("nothing to change" if not report.failed and all(c.status == "ok" for c in report.checks) else
          ("fix the failures above before connecting a chat" if report.failed else "works; see the warnings above"))
    return 1 if report.failed else 0


async def cmd_setup(args: argparse.Namespace, config: None) -> int:
    from gateway.cli.setup import run

    return await run(args)


async def cmd_status(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.status import run
    from scheduler import control

    return await run(args, config, control)


async def cmd_serve(args: argparse.Namespace, config: Config) -> int:
    from gateway.app import Gateway

    gateway = Gateway(config)
    await gateway.run_until_signalled()
    return 0


async def cmd_chat(args: argparse.Namespace, config: Config) -> int:
    from channels.console import THREAD, ConsoleChannel, read_lines
    from gateway.app import Gateway, settle_garbage_collector
    from gateway.cli.chat import show_waiting_prompts

    console = ConsoleChannel()
    gateway = Gateway(config, channels={"console": console}, serve_http=False)
    await gateway.start()
    settle_garbage_collector()
    loop = asyncio.get_running_loop()
    # Ctrl-C cancels the running turn (as /stop); a second one with nothing running leaves.
    loop.add_signal_handler(signal.SIGINT, lambda: asyncio.ensure_future(console.handle_line("/stop")))
    console.write("Talking to the agent. /new starts a new session, /quit leaves, Ctrl-C stops a turn.")
    await show_waiting_prompts(gateway.store, console, THREAD)  # a turn parked before a restart

    async def on_line(line: str) -> bool:
        if line.strip() in ("/quit", "/exit"):
            return False
        if line.strip():
            await console.handle_line(line)
        return True

    try:
        await read_lines(sys.stdin, on_line)
        await gateway.inbox.wait_until_idle(timeout=config.llm.request_timeout_s)
    except TimeoutError:
        pass
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        await gateway.stop()
    return 0


async def cmd_runs(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.reports import print_children, print_run, print_runs

    store = await _store(config)
    try:
        if args.action == "list":
            print_runs(await store.runs.list(limit=args.limit, session_id=args.session))
        else:
            run = await store.runs.get(args.id)
            if run is None:
                print(f"no run {args.id}", file=sys.stderr)
                return 1
            print_run(run, await store.runs.events(run.id))
            tree = await store.delegations.tree(run.id)
            print_children([(level, task, await store.runs.get(task.child_run_id or 0)) for level, task in tree])
    finally:
        await store.close()
    return 0


async def cmd_sessions(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.reports import print_session, print_sessions

    store = await _store(config)
    try:
        if args.action == "list":
            print_sessions(await store.sessions.list(limit=args.limit))
        else:
            session = await store.sessions.get(args.id)
            if session is None:
                print(f"no session {args.id}", file=sys.stderr)
                return 1
            print_session(
                session,
                await store.sessions.history(session.id),
                await store.runs.session_totals(session.id),
                await store.inbox.dropped(session.thread_key, session_id=session.id),
            )
    finally:
        await store.close()
    return 0


async def cmd_outbox(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.outbox import print_outbox

    store = await _store(config)
    try:
        print_outbox(await store.outbox.undelivered(limit=args.limit), await store.outbox.uncertain(limit=args.limit))
    finally:
        await store.close()
    return 0


async def cmd_approvals(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.approvals import run

    store = await _store(config)
    try:
        return await run(args, store)
    finally:
        await store.close()


async def cmd_access(args: argparse.Namespace, config: Config) -> int:
    from gateway.access.cli import run

    store = await _store(config)
    try:
        return await run(args, store, config)
    finally:
        await store.close()


async def cmd_budgets(args: argparse.Namespace, config: Config) -> int:
    from gateway.budgets.jobs import budgets_with_jobs

    store = await _store(config)
    try:
        print("\n".join(await budgets_with_jobs(store, config)))
        return 0
    finally:
        await store.close()


async def cmd_audit(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.audit import run

    store = await _store(config)
    try:
        return await run(args, store)
    finally:
        await store.close()


async def cmd_memory(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.memory import run

    store = await _store(config)
    try:
        return await run(args, store, config)
    finally:
        await store.close()


async def cmd_skills(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.skills import run

    store = await _store(config)
    try:
        return await run(args, store, config)
    finally:
        await store.close()


async def cmd_jobs(args: argparse.Namespace, config: Config) -> int:
    from gateway.budgets.jobs import spend_table
    from gateway.inbox.inbox import event_item
    from gateway.jobs.checks import JobChecks
    from scheduler.cli import run_jobs_command

    store = await _store(config)

    async def submit(events: Any, *, cursor: Any = None) -> list:
        # From the command line, events go straight to the durable inbox; the serving
        # instance picks them up (e.g. /stop for `jobs kill`).
        return await store.inbox.add([event_item(e) for e in events], cursor=cursor)

    # `test` and `run-now` run a job's check here: an mcp check needs the MCP servers, for the while
    mcp = await _mcp_for_checks(config) if args.jobs_command in ("test", "run-now") else None
    checks = JobChecks(config.agent, mcp=mcp, config_source=config.source)
    try:
        return await run_jobs_command(args, store, config, submit, checks=checks, spend=spend_table(store, config))
    finally:
        if mcp is not None:
            await mcp.stop()
        await store.close()


async def _mcp_for_checks(config: Config) -> Any:
    """The MCP servers an mcp check may call, started for one command (None: none configured)."""
    if not any(server.enabled for server in config.mcp.servers.values()):
        return None
    from gateway.mcp import McpManager
    from gateway.tools import ToolRegistry

    manager = McpManager(config.mcp, ToolRegistry())
    await manager.start()
    await manager.first_listing()
    return manager


if __name__ == "__main__":
    sys.exit(main())
