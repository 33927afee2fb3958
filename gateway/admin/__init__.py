"""The web console (/admin) and the JSON admin API (/admin/api/); see docs/operations.md."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import web

    from gateway.admin.operations import Operations
    from gateway.config.core import AdminConfig
    from gateway.serving.guesses import LoginLimiter

log = logging.getLogger(__name__)


def mount(root: web.Application, ops: Operations, guesses: LoginLimiter | None = None) -> bool:
    """Mount the console at /admin when `admin.enabled` and a token is set; say why not otherwise.
    The console (its pages, templates, jinja2) is imported only then: a start without it
    does not load them. `guesses`: the HTTP server's limiter of wrong tokens, shared so a
    client has one budget of guesses for the login, the API and /metrics."""
    if not log_if_off(ops.config.admin):
        return False
    from gateway.admin.app import mount_console

    mount_console(root, ops, guesses)
    log.info("admin console on /admin (admin API on /admin/api/)")
    return True


def log_if_off(admin: AdminConfig) -> bool:
    """Whether the console is on; when it is off, the start log says why."""
    if not admin.enabled:
        log.info("admin console off (admin.enabled is false)")
    elif not admin.token:
        log.info("admin console and admin API off: set GATEWAY_ADMIN_TOKEN to enable /admin")
    return admin.active


__all__ = ["log_if_off", "mount"]
