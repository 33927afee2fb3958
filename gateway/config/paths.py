"""Relative paths in the configuration are relative to the directory of the file that holds it,
whatever the current directory: `gateway access list` run from elsewhere with
`GATEWAY_CONFIG=run/config.yml` opens run/data/gateway.db, not a new empty database where it
was started. Without a configuration file they are relative to the current directory.

Anchored: the SQLite file of `database.url`, `agent.workspace`, `agent.shared_dir`,
`agent.shell_ro_paths`, `skills.dirs` and each MCP server's `cwd` (`mcp.import` files already are).
`~` is the home directory everywhere."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.config.core import DatabaseConfig

if TYPE_CHECKING:
    from gateway.config.root import Config

DEFAULT_DATABASE_URL: str = DatabaseConfig.model_fields["url"].default
_SQLITE_FILE = re.compile(r"^(sqlite(?:\+\w+)?):///(.*)$")  # sqlite:///relative, sqlite:////absolute


def config_dir(source: str) -> Path:
    """The directory relative paths start from: the configuration file's, else the current one."""
    return Path(os.path.abspath(source)).parent if source != "<defaults>" else Path.cwd()


def anchored(path: str, base: Path) -> str:
    return str(base / Path(path).expanduser()) if path else path


def anchored_database_url(url: str, base: Path) -> str:
    """A SQLite URL's relative file made absolute under `base`; any other URL as it was."""
    match = _SQLITE_FILE.match(url)
    if not match:
        return url
    file, mark, query = match.group(2).partition("?")
    if not file or file == ":memory:" or file.startswith("file:"):
        return url
    return f"{match.group(1)}:///{(base / Path(file).expanduser()).as_posix()}{mark}{query}"  # absolute: as it was


def anchor_paths(config: Config) -> None:
    """Make the configuration's relative paths absolute, from the directory of its file."""
    base = config_dir(config.source)
    config.database.url = anchored_database_url(config.database.url, base)
    agent = config.agent
    agent.workspace = anchored(agent.workspace, base)
    agent.shared_dir = anchored(agent.shared_dir, base)
    agent.shell_ro_paths = [anchored(path, base) for path in agent.shell_ro_paths]
    for server in config.mcp.servers.values():
        server.cwd = anchored(server.cwd, base)
    config.skills.dirs = [anchored(path, base) for path in config.skills.dirs]


def is_default_database(config: Config) -> bool:
    """The database is the default one: data/gateway.db beside the configuration file."""
    return config.database.url == anchored_database_url(DEFAULT_DATABASE_URL, config_dir(config.source))
