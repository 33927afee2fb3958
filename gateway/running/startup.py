"""What a start says and refuses beyond the parts' own lines: which database it opened (when it
is not the default one, or is new), the defaults that changed for an install from before (only
when the database existed before: a new install has nothing to upgrade), and one line naming the
setting when the workspace or the HTTP port cannot be used."""

from __future__ import annotations

import errno
import logging
import socket

from gateway.config import Config, HttpConfig
from gateway.config.paths import is_default_database
from gateway.config.redaction import redact_url
from gateway.events import OperatorError

log = logging.getLogger("gateway.app")


def database_place(config: Config) -> str:
    """The database as a person finds it: a SQLite file's path, else the URL without secrets."""
    url = config.database.url
    scheme, sep, rest = url.partition(":///")
    if sep and scheme.startswith("sqlite") and rest and rest != ":memory:":
        return rest.partition("?")[0]
    return redact_url(url)


def database_line(config: Config, *, new: bool) -> str | None:
    """What a command says about the database it opened: that it created it, or which one it is
    when it is not the default (data/gateway.db beside the configuration file)."""
    if new:
        return f"created a new database at {database_place(config)}"
    if not is_default_database(config):
        return f"using the database at {database_place(config)} (database.url)"
    return None


def log_changed_defaults(config: Config) -> None:
    """Defaults that changed under an install from before, and the setting that brings the old
    behaviour back. A new install hears none of them."""
    if config.telegram.enabled and "link_previews" not in config.telegram.model_fields_set:
        log.info(
            "telegram: link previews show only for links the person sent (telegram.link_previews: own, "
            "new default); set telegram.link_previews: all for Telegram's previews of every link"
        )
    if config.slack.enabled and "link_previews" not in config.slack.model_fields_set:
        log.info(
            "slack: links unfurl only when the person sent them (slack.link_previews: own, new default); "
            "set slack.link_previews: all for Slack's defaults"
        )


def workspace_unusable(config: Config, exc: OSError) -> OperatorError:
    return OperatorError(
        f"agent.workspace: cannot create {config.agent.workspace} ({exc.strerror or exc}): set agent.workspace "
        f"in {_file(config)} to a directory the gateway's user may write (relative to the config file)",
        kind="path",
    )


def bind_failure(exc: OSError, http: HttpConfig, source: str) -> OperatorError:
    """Why the HTTP server could not listen, naming http.port or http.host and where to set it."""
    where, file = f"{http.host}:{http.port}", _file_of(source)
    if exc.errno == errno.EADDRINUSE:
        line = (f"http.port: {where} is already in use by another program: stop it, or set http.port in {file} "
                "to a free port")
    elif exc.errno == errno.EACCES:
        line = (f"http.port: {http.port} is below 1024, which only root may listen on: set http.port in {file} "
                "to 1024 or above (e.g. 8080) and let a reverse proxy take 80/443")
    elif exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        line = (f"http.host: {http.host} is not an address of this machine: set http.host in {file} to "
                "127.0.0.1 (this machine only) or 0.0.0.0 (every interface)")
    else:
        line = f"http.host/http.port: cannot listen on {where} ({exc.strerror or exc}): change them in {file}"
    return OperatorError(line, kind="http_bind")


def _file(config: Config) -> str:
    return _file_of(config.source)


def _file_of(source: str) -> str:
    return source if source != "<defaults>" else "config.yml (there is none yet)"
