"""The gateway's HTTP server on aiohttp: the status pages (gateway/serving/status.py), the channels'
webhooks and the console. Used when webhooks or the console are configured; otherwise the small
status server (gateway/serving/status_server.py) serves the status pages and aiohttp is never imported."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from gateway.serving.proxies import Headers, Origin
from gateway.serving.status import Page, StatusPages

log = logging.getLogger(__name__)
Route = tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]  # method, path, handler
ORIGIN: web.RequestKey[Origin] = web.RequestKey("origin", Origin)


class HttpServer:
    def __init__(self, pages: StatusPages, routes: Iterable[Route] = ()):
        self.pages = pages
        self.config = pages.config
        self.guesses = self.pages.guesses  # shared with the console: one budget of guesses per client
        self.loop_lag = self.pages.loop_lag
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

    @property
    def accepting(self) -> bool:
        return self.pages.accepting

    @web.middleware
    async def _origin(self, request: web.Request, handler):  # noqa: ANN001, ANN201
        """The client and scheme as the trusted proxies tell them (gateway/serving/proxies.py): every
        handler below, the console's login limit and cookies included, sees `request.remote`
        and `request.secure` of the client, not of the proxy."""
        origin = self.pages.proxies.origin(request.remote or "", Headers(request.headers.items()), request.secure)
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
        self.pages.log_exposure()

    async def stop_intake(self) -> None:
        self.pages.accepting = False

    async def stop(self) -> None:
        await self.loop_lag.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    async def healthz(self, request: web.Request) -> web.Response:
        return _response(self.pages.healthz())

    async def readyz(self, request: web.Request) -> web.Response:
        return _response(await self.pages.readyz(request[ORIGIN], request.headers.get("Authorization", "")))

    async def metrics(self, request: web.Request) -> web.Response:
        return _response(await self.pages.metrics(request[ORIGIN], request.headers.get("Authorization", "")))


def _response(page: Page) -> web.Response:
    return web.Response(body=page.body, status=page.status, content_type=page.content_type, headers=page.headers)
