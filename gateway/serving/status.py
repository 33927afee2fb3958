"""/healthz, /readyz and /metrics as answers, apart from any HTTP library: the aiohttp server
(gateway/serving/http.py, when webhooks or the console need it) and the small status server
(gateway/serving/status_server.py, otherwise) serve the same pages with the same access rules.

/healthz is for anyone. /readyz is ready when the database (its disk taking writes), its schema,
the channels and the model server are (gateway/llm/checkup.py asks the server again when its answer
is old); it shows its details (channels, the model server, MCP servers and their states) and
/metrics answers only to a local client or one with the admin token (Authorization: Bearer),
unless `http.public_status`; anyone else gets the status code and `{"ready": ...}`, which is all
a load balancer needs. "Local" is the client as the trusted proxies tell it (gateway/serving/proxies.py)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from gateway.config import HttpConfig
from gateway.serving import metrics
from gateway.serving.guesses import LoginLimiter, bearer, token_matches
from gateway.serving.loop_lag import LoopLag
from gateway.serving.proxies import Origin, TrustedProxies
from gateway.store import Store, migrations_current

log = logging.getLogger(__name__)


class Readiness(Protocol):
    """What the pages ask of the running gateway (`gateway.app.Gateway` is one); they know
    nothing else of it."""

    @property
    def store(self) -> Store: ...

    def channels_started(self) -> dict[str, bool]:
        """Every configured channel: whether it has started."""
        ...

    def mcp_summary(self) -> dict[str, dict[str, Any]]:
        """Each MCP server's state, shown by /readyz."""
        ...


class ModelServer(Protocol):
    """The model server's readiness (`gateway.llm.checkup.ModelServerCheck` is one)."""

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Whether it is ready, and what /readyz shows of it."""
        ...


@dataclass(frozen=True)
class Page:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, value: dict[str, Any], status: int = 200) -> Page:
        return cls(status, json.dumps(value).encode(), "application/json")

    @classmethod
    def text(cls, text: str, status: int = 200, headers: dict[str, str] | None = None) -> Page:
        return cls(status, text.encode(), "text/plain", headers or {})


class StatusPages:
    def __init__(
        self,
        gateway: Readiness,
        config: HttpConfig,
        *,
        stuck_after: timedelta = timedelta(seconds=60),
        admin_token: str = "",
        guesses: LoginLimiter | None = None,
        model_server: ModelServer | None = None,
    ):
        self.gateway = gateway
        self.model_server = model_server  # None: not part of readiness (a test's gateway without one)
        self.config = config
        self.admin_token = admin_token  # opens /readyz details and /metrics to a client that is not local
        self.guesses = guesses or LoginLimiter()  # wrong tokens per client, shared with the console
        self.stuck_after = stuck_after  # an outbox row unsent for longer counts as stuck
        self.accepting = True  # false while stopping: /readyz says not ready
        self.loop_lag = LoopLag()
        self.proxies = TrustedProxies(config.trusted_proxies)  # who the client is (gateway/serving/proxies.py)

    def log_exposure(self) -> None:
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

    def may_see(self, origin: Origin, authorization: str) -> bool | None:
        """Whether this client may read the details: True, False, or None when it has guessed
        the token wrong too often (the same limit as the console's logins)."""
        if self.config.public_status or origin.local:
            return True
        given = bearer(authorization)
        if not given or not self.admin_token:
            return False
        if self.guesses.blocked(origin.client):
            return None
        if token_matches(given, self.admin_token):
            self.guesses.succeeded(origin.client)
            return True
        self.guesses.failed(origin.client)
        return False

    @staticmethod
    def healthz() -> Page:
        return Page.json({"status": "ok"})

    async def readyz(self, origin: Origin, authorization: str) -> Page:
        db = self.gateway.store.db
        reachable = await db.ping()
        current = reachable and await migrations_current(db)
        channels = self.gateway.channels_started()
        model_ready, model = await self.model_server.readiness() if self.model_server else (True, None)
        # Ready means events can be taken and kept: a model server that is down (shared by every
        # instance, so no balancer can route around it) makes the gateway degraded, not unready;
        # a 503 would have webhooks held back and Slack's retries run out, losing messages that
        # the inbox would keep and answer once the server is back. MCP servers likewise: shown.
        # A disk that refuses writes (full, read-only) keeps events from being kept: not ready,
        # with the reason, until a write succeeds again (the gateway's own loops keep trying).
        unwritable = db.unwritable
        ready = reachable and current and unwritable is None and all(channels.values()) and self.accepting
        status = 200 if ready else 503
        if not self.may_see(origin, authorization):
            return Page.json({"ready": ready}, status)
        body = {
            "database": reachable, "migrations_current": current,
            "database_writable": unwritable is None, **({"database_fault": unwritable} if unwritable else {}),
            "channels": channels, "accepting": self.accepting,
            "degraded": not model_ready,
            **({"model_server": model} if model is not None else {}), "mcp": self.gateway.mcp_summary(),
        }
        return Page.json({"ready": ready, **body}, status)

    async def metrics(self, origin: Origin, authorization: str) -> Page:
        """Counters live in memory; the inbox and outbox gauges cost one aggregate query per
        scrape, whatever the tables hold."""
        allowed = self.may_see(origin, authorization)
        if allowed is None:
            return Page.text("too many wrong tokens: try again later\n", 429)
        if not allowed:
            return Page.text(
                "/metrics answers local clients and the admin token (Authorization: Bearer); see http.public_status\n",
                401, {"WWW-Authenticate": "Bearer"},
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
        return Page.text(metrics.render().decode() + "\n".join(lines) + "\n")
