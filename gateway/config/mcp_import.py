"""`mcp.import`: MCP servers read from the JSON file people already have (Claude Desktop's
`claude_desktop_config.json`, Cursor's `mcp.json`: `{"mcpServers": {name: {...}}}`), merged
under `mcp.servers` before validation.

Each entry's `command`/`args`/`env`/`cwd` (a stdio server) or `url`/`headers` (an HTTP one,
`type: sse` for the older SSE transport) becomes a server of the same name. On a name clash the
explicit `mcp.servers` entry wins: one that names its own `command` or `url` replaces the
imported entry; one without adds its settings to it (e.g. `trusted: true`, `tools: [...]`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.config.base import ConfigError

_READ = ("command", "args", "env", "cwd", "url", "headers", "type", "transport", "disabled")
_TYPES = {"stdio": None, "http": "streamable_http", "streamable-http": "streamable_http"}
_TYPES |= {"streamableHttp": "streamable_http", "streamable_http": "streamable_http", "sse": "sse"}
Interpolate = Callable[[Any, tuple[str, ...]], Any]


def merge_imported_servers(data: dict[str, Any], base: Path, interpolate: Interpolate) -> None:
    """Read the files named by `mcp.import` (relative to the config's directory) into
    `data["mcp"]["servers"]`, in place; `${VAR}` in them is interpolated like the config's."""
    mcp = data.get("mcp")
    if not isinstance(mcp, dict) or not mcp.get("import"):
        return
    files = mcp["import"] if isinstance(mcp["import"], list) else [mcp["import"]]
    explicit = mcp.get("servers") or {}
    if not isinstance(explicit, dict):
        return  # validation says what is wrong with it
    imported: dict[str, dict[str, Any]] = {}
    for name in files:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"mcp.import: expected a path to a JSON file (or a list of them), got {name!r}")
        imported |= _read(base / Path(name).expanduser(), name, interpolate)
    merged = dict(imported)
    for name, entry in explicit.items():
        replaces = not isinstance(entry, dict) or "command" in entry or "url" in entry
        merged[name] = entry if replaces or name not in imported else {**imported[name], **entry}
    mcp["servers"] = merged


def _read(file: Path, shown: str, interpolate: Interpolate) -> dict[str, dict[str, Any]]:
    where = f"mcp.import: {shown}"
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file ({file})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON: {exc}") from None
    servers = document.get("mcpServers") if isinstance(document, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError(f'{where}: expected {{"mcpServers": {{"name": {{"command": ..., "args": [...]}}}}}}')
    return {
        str(name): _server(entry, f"{where}: mcpServers.{name}", interpolate, ("mcpServers", str(name)))
        for name, entry in servers.items()
    }


def _server(entry: Any, where: str, interpolate: Interpolate, path: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping with command (and args) or url")
    unknown = sorted(set(entry) - set(_READ))
    if unknown:
        raise ConfigError(
            f"{where}: {', '.join(unknown)}: not read from an imported file (it reads {', '.join(_READ)}); "
            "set other settings under mcp.servers"
        )
    try:
        entry = interpolate(entry, path)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    server = {key: entry[key] for key in ("command", "args", "env", "cwd", "url", "headers") if key in entry}
    kind = entry.get("type", entry.get("transport"))
    if kind is not None:
        if kind not in _TYPES:
            raise ConfigError(f"{where}: type {kind!r}: expected one of {', '.join(_TYPES)}")
        if _TYPES[kind] is not None:
            server["transport"] = _TYPES[kind]
    if entry.get("disabled") is True:
        server["enabled"] = False
    for key in ("env", "headers"):  # JSON numbers and booleans become the strings a process sees
        if isinstance(server.get(key), dict):
            server[key] = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in server[key].items()}
    return server
