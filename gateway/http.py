"""The gateway's HTTP server (aiohttp): health, readiness, metrics, and channel webhooks.

/healthz is for anyone. /readyz shows its details (channels, MCP servers and their errors) and
/metrics answers only to a local client or one with the admin token (Authorization: Bearer),
unless `http.public_status`; anyone else gets the status code and `{"ready": ...}`, which is all
a load balancer needs. "Local" is the client as the trusted proxies tell it (gateway/proxies.py)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from aiohttp import web

from gateway import metrics
from gateway.config import HttpConfig
from gateway.guesses import LoginLimiter, bearer, token_matches
from gateway.loop_lag import LoopLag
from gateway.proxies import Origin, TrustedProxies
from gateway.store import Store, migrations_current

log = logging.getLogger(__name__)
Route = tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]  # method, path, handler
ORIGIN: web.RequestKey[Origin] = web.RequestKey("origin", Origin)


class Readiness(Protocol):
    """What the server asks of the running gateway (`gateway.app.Gateway` is one); it knows
    nothing else of it."""

    @property
    def store(self) -> Store: ...

    def channels_started(self) -> dict[str, bool]:
        """Every configured channel: whether it has started."""
        ...

    def mcp_summary(self) -> dict[str, dict[str, Any]]:
        """Each MCP server's state, shown by /readyz."""
        ...


def webhook_routes(channels: Iterable[object]) -> list[Route]:
    """The HTTP routes of the channels that receive webhooks (those with `routes()`)."""
    return [route for channel in channels for route in getattr(channel, "routes", list)()]


class HttpServer:
    def __init__(
        self,
        gateway: Readiness,
        config: HttpConfig,
        routes: Iterable[Route] = (),
        *,
        stuck_after: timedelta = timedelta(seconds=60),
        admin_token: str = "",
        guesses: LoginLimiter | None = None,
    ):
        self.gateway = gateway
        self.config = config
        self.admin_token = admin_token  # opens /readyz details and /metrics to a client that is not local
        self.guesses = guesses or LoginLimiter()  # wrong tokens per client, shared with the console
        self.stuck_after = stuck_after  # an outbox row unsent for longer counts as stuck
        self.accepting = True
        self.proxies = TrustedProxies(config.trusted_proxies)
        self.app = web.Application(middlewares=[self._origin, self._intake_guard])
        self.app.router.add_get("/healthz", self.healthz)
        self.app.router.add_get("/readyz", self.readyz)
        self.app.router.add_get("/metrics", self.metrics)
        self._webhook_paths: set[str] = set()
        for method, path, handler in routes:
            self.app.router.add_route(method, path, handler)
            self._webhook_paths.add(path)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self.loop_lag = LoopLag()

    @web.middleware
    async def _origin(self, request: web.Request, handler):  # noqa: ANN001, ANN201
        """The client and scheme as the trusted proxies tell them (gateway/proxies.py): every
        handler below, the console's login limit and cookies included, sees `request.remote`
        and `request.secure` of the client, not of the proxy."""
        origin = self.proxies.origin(request.remote or "", request.headers, request.secure)
        if origin.client != request.remote or origin.https != request.secure:
            request = request.clone(remote=origin.client, scheme="https" if origin.https else "http")
        request[ORIGIN] = origin
        return await handler(request)

    @web.middleware
    async def _intake_guard(self, request: web.Request, handler):  # noqa: ANN001, ANN201
        # While shutting down, platforms are told to retry later instead of losing events.
        if not self.accepting and request.path in self._webhook_paths:
            return web.json_response({"error": "shutting down, retry later"}, status=503)
        return await handler(request)

    async def start(self) -> None:
        self.loop_lag.start()
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []  # noqa: SLF001 - the bound port when 0 was asked
        self.port = sockets[0].getsockname()[1] if sockets else self.config.port
        log.info("HTTP server on http://%s:%s (healthz, readyz, metrics%s)", self.config.host, self.port,
                 ", " + ", ".join(sorted(self._webhook_paths)) if self._webhook_paths else "")
        self._log_exposure()

    def _log_exposure(self) -> None:
        """What a client that is not local reads, said once at start (a remote scrape of
        /metrics needs the admin token or http.public_status: true)."""
        if self.config.trusted_proxies:
            log.info("trusting X-Forwarded-For and X-Forwarded-Proto from %s", ", ".join(self.config.trusted_proxies))
        if self.config.public_status:
            log.info("http.public_status is true: /readyz details and /metrics are open to every client")
            return
        log.info(
            "/metrics and the details of /readyz answer local clients%s; others get {\"ready\": ...} from /readyz "
            "and 401 from /metrics (http.public_status: true publishes them)",
            " and the admin token (Authorization: Bearer)" if self.admin_token else
            " only (set GATEWAY_ADMIN_TOKEN to scrape from elsewhere with it)",
        )

    async def stop_intake(self) -> None:
        self.accepting = False

    async def stop(self) -> None:
        await self.loop_lag.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def _may_see(self, request: web.Request) -> bool | None:
        """Whether this client may read the details: True, False, or None when it has guessed
        the token wrong too often (the same limit as the console's logins)."""
        origin = request.get(ORIGIN)
        if self.config.public_status or (origin is not None and origin.local):
            return True
        given = bearer(request.headers.get("Authorization", ""))
        if not given or not self.admin_token:
            return False
        client = request.remote or ""
        if self.guesses.blocked(client):
            return None
        if token_matches(given, self.admin_token):
            self.guesses.succeeded(client)
            return True
        self.guesses.failed(client)
        return False

    async def readyz(self, request: web.Request) -> web.Response:
        db = self.gateway.store.db
        reachable = await db.ping()
        current = reachable and await migrations_current(db)
        channels = self.gateway.channels_started()
        ready = reachable and current and all(channels.values()) and self.accepting
        # MCP servers are shown, not required: a server that is down only takes its tools away.
        status = 200 if ready else 503
        if not self._may_see(request):
            return web.json_response({"ready": ready}, status=status)
        body = {
            "database": reachable, "migrations_current": current, "channels": channels, "accepting": self.accepting,
            "mcp": self.gateway.mcp_summary(),
        }
        return web.json_response({"ready": ready, **body}, status=status)

    async def metrics(self, request: web.Request) -> web.Response:
        """Counters live in memory; the inbox and outbox gauges cost one aggregate query per
        scrape, whatever the tables hold."""
        allowed = self._may_see(request)
        if allowed is None:
            return web.Response(text="too many wrong tokens: try again later\n", status=429)
        if not allowed:
            return web.Response(
                text="/metrics answers local clients and the admin token (Authorization: Bearer); "
                "see http.public_status\n",
                status=401, headers={"WWW-Authenticate": "Bearer"},
            )
        store = self.gateway.store
        gauges = await store.gauges.read(self.stuck_after)
        oldest = gauges.inbox_oldest
        metrics.INBOX_DEPTH.set(gauges.inbox_pending)
        metrics.INBOX_OLDEST.set((datetime.now(UTC) - oldest).total_seconds() if oldest is not None else 0.0)
        metrics.OUTBOX_RETRYING.set(gauges.outbox_retrying)
        metrics.OUTBOX_STUCK.set(gauges.outbox_stuck)
        count = store.db.count
        lines = [
            "# HELP gateway_db_statements_total Statements sent to the database.",
            "# TYPE gateway_db_statements_total counter",
            f"gateway_db_statements_total {count.statements}",
            "# HELP gateway_db_transactions_total Transactions committed.",
            "# TYPE gateway_db_transactions_total counter",
            f"gateway_db_transactions_total {count.transactions}",
        ]
        lag = self.loop_lag
        lines += [
            "# HELP gateway_event_loop_lag_seconds How late the event loop ran a timer (last 30 s).",
            "# TYPE gateway_event_loop_lag_seconds summary",
            *(f'gateway_event_loop_lag_seconds{{quantile="{q}"}} {lag.quantile(q):.6f}' for q in (0.5, 0.99)),
            f"gateway_event_loop_lag_seconds_max {lag.worst():.6f}",
        ]
        text = metrics.render().decode() + "\n".join(lines) + "\n"
        return web.Response(text=text, content_type="text/plain")
