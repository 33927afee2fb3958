"""Reading `config.yml`: `.env`, `${VAR}` interpolation, secrets from the environment only,
validation errors that name the file and the key path."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from gateway.config.base import ConfigError
from gateway.config.mcp_import import merge_imported_servers
from gateway.config.paths import anchor_paths
from gateway.config.root import ENV_DEFAULTS, ENV_OVERRIDES, SECRETS, Config
from gateway.config.suggest import closest_key
from gateway.config.yaml_file import read_yaml

DEFAULT_CONFIG_PATH = "config.yml"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def read_dotenv(path: Path) -> None:
    """Load KEY=VALUE lines into os.environ without overriding what is already set."""
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        os.environ.setdefault(key.strip(), value)


def _interpolate(node: Any, path: tuple[str, ...], env: dict[str, str]) -> Any:
    if isinstance(node, dict):
        return {k: _interpolate(v, path + (str(k),), env) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, path + (str(i),), env) for i, v in enumerate(node)]
    if not isinstance(node, str):
        return node

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"{'.'.join(path)}: environment variable {name} is not set")

    # Pydantic's lax mode turns "8080" or "true" into the declared type afterwards.
    return _ENV_REF.sub(substitute, node)


def _check_secrets_are_references(raw: dict[str, Any]) -> None:
    for path, env_name in [*SECRETS.items(), *_named_model_keys(raw)]:
        node: Any = raw
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str) and node and "${" not in node:
            raise ConfigError(
                f"{'.'.join(path)}: secrets are read from the environment only; "
                f"write ${{{env_name}}} here and set {env_name}"
            )


def _named_model_keys(raw: dict[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """`llm.models.<name>.api_key`: a secret like llm.api_key (its variable is the operator's choice)."""
    models = (raw.get("llm") or {}).get("models") if isinstance(raw.get("llm"), dict) else None
    if not isinstance(models, dict):
        return []
    return [(("llm", "models", str(name), "api_key"), f"{str(name).upper()}_API_KEY") for name in models]


def _apply_env(data: dict[str, Any], env: dict[str, str]) -> None:
    for table in (SECRETS, ENV_DEFAULTS, ENV_OVERRIDES):
        for path, env_name in table.items():
            section = data.setdefault(path[0], {})
            if not isinstance(section, dict):
                continue
            explicit = table is ENV_OVERRIDES
            if env.get(env_name) and (explicit or not section.get(path[1])):
                section[path[1]] = env[env_name]


def _describe(error: ErrorDetails, loc: list[str | int]) -> str:
    kind = error["type"]
    got = error.get("input")
    shown = json.dumps(got, default=str) if not isinstance(got, dict) else "a mapping"
    messages = {
        "int_parsing": "expected an integer",
        "int_type": "expected an integer",
        "int_from_float": "expected an integer",
        "float_parsing": "expected a number",
        "float_type": "expected a number",
        "bool_parsing": "expected true or false",
        "bool_type": "expected true or false",
        "string_type": "expected a string",
        "list_type": "expected a list",
        "dict_type": "expected a mapping",
        "model_type": "expected a mapping",
        "model_attributes_type": "expected a mapping",
    }
    if kind == "extra_forbidden":
        near = closest_key(Config, loc)
        return f"unknown key; did you mean {near}?" if near else "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return f"{error['msg'].replace('Input should be', 'expected')}, got {shown}"
    if kind in messages:
        return f"{messages[kind]}, got {shown}"
    return f"{error['msg']}, got {shown}"


def _format_errors(source: str, exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        path = [p for p in error["loc"] if p not in ("function-after", "function-before")]
        lines.append(f"{source}: {'.'.join(str(p) for p in path)}: {_describe(error, path)}")
    return "\n".join(lines)


def load_config(path: str | os.PathLike[str] | None = None, *, env: dict[str, str] | None = None) -> Config:
    """Read, interpolate and validate the configuration.

    Without a path: `$GATEWAY_CONFIG`, else `config.yml` if it exists, else the defaults.
    """
    explicit = path is not None or "GATEWAY_CONFIG" in os.environ
    file = Path(path or os.environ.get("GATEWAY_CONFIG", DEFAULT_CONFIG_PATH))
    if env is None:
        read_dotenv(file.parent / ".env")
        env = dict(os.environ)
    raw: Any = {}
    if file.is_file():
        raw = read_yaml(file) or {}  # a YAML error names the file and line; a key written twice is refused
        if not isinstance(raw, dict):
            raise ConfigError(f"{file}: the top level must be a mapping of sections")
    elif explicit:
        raise ConfigError(f"{file}: no such configuration file")
    source = str(file) if file.is_file() else "<defaults>"
    try:
        _check_secrets_are_references(raw)
        data = _interpolate(raw, (), env)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    _apply_env(data, env)
    try:
        merge_imported_servers(data, file.parent, lambda node, where: _interpolate(node, where, env))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(source, exc)) from exc
    config.source = source
    anchor_paths(config)  # relative paths start at the file's directory, whatever the current one
    return config
