"""What a `gateway setup` run will write: the edits of `config.yml` and `.env`, listed as
changes before anything is written, and the settings as they are now (the questions' defaults).

Secrets go to `.env` (0600) and `config.yml` reads them as `${VAR}`: a setting that already
names its variable keeps it; otherwise it gets the variable the README documents.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from gateway.cli.config_edit import Change, DotEnv, YamlText, env_reference, render, with_env_form, write_file
from gateway.config import Config, ConfigError, load_config

HEADER = """\
# Gateway configuration, written by `gateway setup`. Run it again to change these settings: it
# edits this file in place and keeps what you add. Every other key and its default:
# docs/configuration.md. Secrets are in .env beside this file and read here as ${VAR}.
"""


class Draft:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.env_path = path.parent / ".env"
        self.existed = path.is_file() or self.env_path.is_file()
        self.yaml = YamlText(path.read_text(encoding="utf-8") if path.is_file() else HEADER, path.name)
        self.dotenv = DotEnv(self.env_path.read_text(encoding="utf-8") if self.env_path.is_file() else "")
        self.env = {**self.dotenv.values(), **os.environ}  # what a start sees: the environment wins
        self.current, self.problem = _loaded(path, self.env)
        self.changes: list[Change] = []
        self.notes: list[str] = []

    # ---- changes ---------------------------------------------------------------------------
    def set(self, section: str, key: str, value: Any) -> None:
        """A plain setting (a `${VAR:-default}` one keeps its variable, with the new default)."""
        old = self.yaml.get(section, key)
        if isinstance(value, (str, int)) and (formed := with_env_form(old, str(value))) != str(value):
            value = formed
        if self.yaml.has(section, key) and old == value:
            return
        self._change(section, key, value, render(old) if self.yaml.has(section, key) else None)

    def set_secret(self, section: str, key: str, variable: str, value: str) -> None:
        """The secret into .env under the variable the setting reads (`${VAR}`)."""
        old = self.yaml.get(section, key)
        variable = env_reference(old) or variable
        if env_reference(old) is None:
            self._change(section, key, f"${{{variable}}}", "(secret)" if old else None)
        before = self.dotenv.values().get(variable)
        if before != value:
            self.dotenv.set(variable, value)
            self.changes.append(Change(".env", variable, None if before is None else "(secret)", "(a new secret)"))
        if os.environ.get(variable, value) != value:
            self.notes.append(
                f"{variable} is set in this shell's environment to another value, which wins over .env: "
                f"unset it before starting the gateway"
            )

    def drop_secret(self, section: str, key: str, variable: str) -> None:
        """No value any more (the Slack app token when events come over HTTP): out of .env, and
        the setting tolerates its variable unset."""
        old = self.yaml.get(section, key)
        variable = env_reference(old) or variable
        if env_reference(old) and old != f"${{{variable}:-}}":
            self._change(section, key, f"${{{variable}:-}}", render(old))
        if variable in self.dotenv.values():
            self.dotenv.remove(variable)
            self.changes.append(Change(".env", variable, "(secret)", None))
        if os.environ.get(variable):
            self.notes.append(f"{variable} is set in this shell's environment: unset it before starting the gateway")

    def secret(self, section: str, key: str, variable: str) -> str:
        """The secret a start would use now."""
        return self.env.get(env_reference(self.yaml.get(section, key)) or variable, "")

    def _change(self, section: str, key: str, value: Any, shown_old: str | None) -> None:
        self.yaml.set(section, key, value)
        self.changes.append(Change(self.path.name, f"{section}.{key}", shown_old, render(value)))

    # ---- writing ---------------------------------------------------------------------------
    def texts(self) -> tuple[str, str]:
        """The new config.yml and .env, checked: the config loads with the new .env (else ConfigError)."""
        config_text, env_text = self.yaml.text(), self.dotenv.text()
        env = {**DotEnv(env_text).values(), **os.environ}
        beside = self.path.parent if self.path.parent.is_dir() else None  # where mcp.import paths resolve
        with tempfile.NamedTemporaryFile("w", dir=beside, prefix=".setup-", suffix=".yml") as trial:
            trial.write(config_text)
            trial.flush()
            try:
                load_config(trial.name, env=env)
            except ConfigError as exc:
                raise ConfigError(str(exc).replace(trial.name, self.path.name)) from None
        return config_text, env_text

    def write(self, config_text: str, env_text: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_file(self.env_path, env_text, mode=0o600)  # the secrets first: the config reads them
        write_file(self.path, config_text)


def _loaded(path: Path, env: dict[str, str]) -> tuple[Config, str]:
    """The settings now (defaults and the environment's when there is no file), and why not."""
    try:
        if path.is_file():
            return load_config(path, env=env), ""
        with tempfile.TemporaryDirectory() as directory:
            empty = Path(directory, "config.yml")
            empty.write_text("")
            return load_config(empty, env=env), ""
    except ConfigError as exc:
        return Config(), str(exc)
