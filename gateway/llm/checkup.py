"""The model server checked the way readiness needs it: once at start (one log line that says
what was found, or what is wrong and the fix) and again when /readyz finds the answer old.

A check asks `GET {base_url}/models` (reachable, the key taken, the model served) and the
model's context window, and records its outcome in the server's `ServerHealth`
(gateway/llm/health.py), the account the turns' requests keep too: /readyz and the console
read one story. The gateway is ready for the model server when the last check found nothing
wrong and no request has failed to reach it since.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from gateway.config.redaction import redact_text, redact_url
from gateway.llm.client import LLMClient
from gateway.llm.discovery import Window
from gateway.llm.errors import LLMError
from gateway.llm.health import model_server_state

log = logging.getLogger(__name__)

FRESH_S = 30.0  # a finding of a ready server is trusted this long
FRESH_DOWN_S = 5.0  # ... of one that is not: it is asked again sooner, so a recovery shows
READYZ_WAIT_S = 2.0  # /readyz waits this long for a check under way, then answers what it knew
BASE_URL = "llm.base_url (LLM_BASE_URL)"


@dataclass(frozen=True)
class Finding:
    """What a check found: whether the server answered, and what is wrong with the fix ("" when
    nothing is)."""

    reachable: bool
    problem: str = ""
    window: Window | None = None
    checked_at: float = 0.0  # on the check's monotonic clock

    @property
    def ready(self) -> bool:
        return self.reachable and not self.problem


class ModelServerCheck:
    """Checks of the default model's server, one at a time, remembered until they are old."""

    def __init__(self, client: LLMClient, *, clock: Callable[[], float] = time.monotonic):
        self.client = client
        self.config = client.config
        self.clock = clock
        self.finding: Finding | None = None
        self._running: asyncio.Task[Finding] | None = None
        self._starting: asyncio.Task[None] | None = None  # the start's check and what follows it
        self._since: datetime | None = None  # the health's last event when the finding was made

    async def check(self) -> Finding:
        """Ask the server now (a check already under way is joined, not repeated)."""
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._check())
        return await asyncio.shield(self._running)

    def start(self, then: Callable[[Finding], Awaitable[None]] | None = None) -> None:
        """The start's check, in the background: said in one line, then `then` (what the server
        found decides, e.g. what its window leaves out of a request). /readyz waits for both."""
        self._starting = asyncio.create_task(self._at_start(then), name="model-server-check")

    async def stop(self) -> None:
        for task in (self._starting, self._running):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _at_start(self, then: Callable[[Finding], Awaitable[None]] | None) -> None:
        try:
            finding = await self.check()
            if finding.ready:
                log.info("%s", self.line(finding))
            else:
                log.warning("%s", self.line(finding))
            if then is not None:
                await then(finding)
        except Exception:  # a check that failed must not stop the gateway; /readyz asks again
            log.exception("checking the model server failed")

    async def current(self, wait_s: float = READYZ_WAIT_S) -> Finding | None:
        """The finding, asked again when it is old or a request has failed to reach the server
        since; waits at most `wait_s` for that, else gives what was known (None: nothing yet)."""
        if self._starting is not None and not self._starting.done():
            await asyncio.wait([self._starting], timeout=wait_s)
        if self._stale():
            try:
                return await asyncio.wait_for(self.check(), wait_s)
            except TimeoutError:
                pass
        return self.finding

    def line(self, finding: Finding) -> str:
        where = f"model server {redact_url(self.config.base_url)}"
        until = "messages are kept but not answered (/readyz says degraded) until"
        if not finding.reachable:
            return f"{where}: not reachable: {finding.problem}; {until} it answers"
        if finding.problem:
            return f"{where}: {finding.problem}; {until} it is fixed"
        window = finding.window
        if window is None or window.tokens <= 0:
            said = "no window (llm.context_window: 0, never shortened)"
        elif window.discovered:
            said = f"window {window.tokens:,} tokens ({window.source})"
        else:
            said = f"window not said, assuming {window.tokens:,} tokens (set llm.context_window)"
        return f"{where}: reachable, model {self.config.model}, {said}"

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """For /readyz: whether the model server is ready, and what is known of it."""
        finding = await self.current()
        shown = model_server_state(self.client)
        shown = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in shown.items()}
        shown["base_url"] = redact_url(str(shown.get("base_url") or ""))
        shown["error"] = redact_text(str(shown.get("error") or ""))
        ready = finding is not None and finding.ready and shown.get("reachable") is not False
        if finding is None:
            problem = "not checked yet"
        else:
            problem = finding.problem or ("" if ready else f"the last request failed: {shown['error']}")
        return ready, {**shown, "ready": ready, "problem": problem}

    # ---- the check ---------------------------------------------------------------------------
    def _stale(self) -> bool:
        finding = self.finding
        if finding is None:
            return True
        failed_at = self.client.health_of().failed_at
        if failed_at is not None and (self._since is None or failed_at > self._since):
            return True  # a request failed after the check
        fresh = FRESH_S if finding.ready else FRESH_DOWN_S
        return self.clock() - finding.checked_at >= fresh

    async def _check(self) -> Finding:
        health = self.client.health_of()
        window = None
        try:
            reachable, problem = await self._listing()
            if reachable and not problem:
                window = await self._window()
        except Exception as exc:  # noqa: BLE001 - a check that broke says so; it never breaks /readyz
            log.debug("the model server check failed", exc_info=exc)
            reachable, problem = False, f"the check failed: {type(exc).__name__}: {redact_text(str(exc))}"
        if problem:
            health.failed(LLMError(problem, kind="bad_request" if reachable else "connection"))
        else:
            health.answered()
        self._since = max((t for t in (health.answered_at, health.failed_at) if t is not None), default=None)
        self.finding = Finding(reachable, problem, window, self.clock())
        return self.finding

    async def _window(self) -> Window:
        """The window as shaping uses it: the configured number, or what the server says."""
        setting = self.config.context_window
        return Window(setting, "llm.context_window") if setting != "auto" else await self.client.context_window()

    async def _listing(self) -> tuple[bool, str]:
        """(answered, problem) from `GET {base_url}/models`."""
        url = self.client.server.base + "/models"
        try:
            response = await self.client.server.http.get(url)
        except httpx.HTTPError as exc:
            detail = redact_text(str(exc)) or type(exc).__name__
            return False, f"{type(exc).__name__}: {detail}: start it, or set {BASE_URL} to where it listens"
        status = response.status_code
        if status in (401, 403):
            return True, f"it refused the key (HTTP {status}): set llm.api_key (LLM_API_KEY) to one it takes"
        if status == 404:
            return True, f"HTTP 404 at /models: {BASE_URL} usually ends in /v1"
        if status >= 500:
            return True, f"it answered HTTP {status} at /models: read the model server's log"
        return True, self._model_problem(response)

    def _model_problem(self, response: httpx.Response) -> str:
        """The model asked for is not among several the server lists (a server of one model
        usually answers any name)."""
        try:
            data = response.json().get("data")
        except (ValueError, AttributeError):
            return ""
        ids = [str(e.get("id")) for e in data if isinstance(e, dict) and e.get("id")] if isinstance(data, list) else []
        model = self.config.model
        if len(ids) < 2 or model in ids:
            return ""
        return f"it does not serve {model!r}: set llm.model (LLM_MODEL) to one of {', '.join(ids[:10])}"
