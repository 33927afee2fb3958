"""Writes docs/configuration.md from the settings models, so the reference never drifts.

    .venv/bin/python -m gateway.config.reference > docs/configuration.md
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from gateway.config import (
    ENV_DEFAULTS,
    ENV_OVERRIDES,
    SECRETS,
    CheckConfig,
    Config,
    JobConfig,
    McpServerConfig,
    ModelEndpoint,
    ModelPrice,
)

INTRO = """# Configuration reference

Every key of `config.yml` with its default (generated from `gateway/config/` by
`python -m gateway.config.reference`; a test checks it is current). `${VAR}` and `${VAR:-default}`
read the environment, and a `.env` file beside the config is loaded first without overriding
variables already set. Durations accept `90`, `"90s"`, `"15m"`, `"2h"`, `"1d"`. Unknown keys (with
the nearest known one: "did you mean max_rounds?") and wrong types are rejected with the file and key
path, a YAML error with the file and line, and a key written twice in one mapping with both lines.
Secrets (🔒) are read from the environment only: leave them out or write them as `${VAR}`.

Relative paths (the SQLite file of `database.url`, `agent.workspace`, `agent.shared_dir`,
`agent.shell_ro_paths`, `skills.dirs`, an MCP server's `cwd`, `mcp.import`) are relative to the directory of the
configuration file, whatever the current directory; without a file, to the current directory.
"""


def _type_name(annotation: Any) -> str:
    text = (
        str(annotation) if getattr(annotation, "__args__", None) else getattr(annotation, "__name__", str(annotation))
    )
    text = re.sub(r"gateway\.config\.(\w+\.)?", "", text.replace("typing.", ""))
    text = text.replace("<class '", "").replace("'>", "")
    return text.replace(" | ", " or ").replace("|", " or ")


def _default(value: Any) -> str:
    if isinstance(value, BaseModel) or value is PydanticUndefined:
        return "required" if value is PydanticUndefined else ""
    if value == "" or value is None:
        return "—"
    return f"`{json.dumps(value, default=str)}`"


def render() -> str:
    lines = [INTRO]
    env = {path: name for path, name in {**SECRETS, **ENV_DEFAULTS, **ENV_OVERRIDES}.items()}
    for section, field in Config.model_fields.items():
        if section == "source":
            continue
        model = field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel), section
        lines += [f"## `{section}`", "", "| key | type | default | environment |", "|---|---|---|---|"]
        for name, sub in model.model_fields.items():
            key = sub.alias or name
            variable = env.get((section, name), "")
            lock = " 🔒" if (section, name) in SECRETS else ""
            lines.append(
                f"| `{key}`{lock} | {_type_name(sub.annotation)} |"
                f" {_default(sub.default)} | {f'`{variable}`' if variable else ''} |"
            )
        lines.append("")
    for title, fields_of in (("llm.models.<name>", ModelEndpoint), ("llm.prices.<model>", ModelPrice)):
        lines += [f"### `{title}`", "", "| key | type | default |", "|---|---|---|"]
        for name, sub in fields_of.model_fields.items():
            lines.append(f"| `{sub.alias or name}` | {_type_name(sub.annotation)} | {_default(sub.default)} |")
        lines.append("")
    lines += [
        "A named model (`llm.models`) is chosen with `/model` or `scheduler.jobs[].model` and tried by",
        "`llm.fallback`; its `api_key` is a `${VAR}` reference. Prices are USD per million tokens (`per_minute`:",
        "per minute of audio, for `llm.transcription_model`); the provider's own cost is taken over them",
        "([models.md](models.md)).",
        "",
    ]
    lines += ["### `mcp.servers.<name>`", "", "| key | type | default |", "|---|---|---|"]
    for name, sub in McpServerConfig.model_fields.items():
        lines.append(f"| `{sub.alias or name}` | {_type_name(sub.annotation)} | {_default(sub.default)} |")
    lines += ["", "See [mcp.md](mcp.md) for connecting servers and how approvals apply to their tools."]
    lines += [
        "A server's questions (elicitation) wait at most `questions.timeout`, answered by who may answer",
        "`ask_user`; with `sampling: true` its use of the model is priced at `llm.prices` and counted by",
        "`budgets`, each request's `max_tokens` clamped to `sampling_max_tokens` and at most",
        "`sampling_per_call` requests answered in one tool call (one more ends the call with a tool error);",
        "with `llm.vision: true` the images of MCP results reach the model. On protocols before",
        "2026-07-28 the call waits inside the server's request while the question is asked, and calls to",
        "that server run one at a time ([mcp.md](mcp.md#questions-inside-the-call-protocols-before-2026-07-28)).",
        "`auth: oauth` is for a remote server behind OAuth: `gateway mcp login <name>` signs in (the browser",
        "comes back to `oauth_redirect`, a loopback address), the tokens are stored in the database encrypted",
        "with the `GATEWAY_SECRET_KEY` environment variable (`gateway mcp key` makes one) and refreshed by the",
        "gateway; without them the server is shown as `needs_login` ([mcp.md](mcp.md#servers-behind-oauth)).",
        "",
    ]
    jobs: tuple[tuple[str, type[BaseModel]], ...] = (
        ("scheduler.jobs[]", JobConfig),
        ("scheduler.jobs[].check", CheckConfig),
    )
    for title, job_model in jobs:
        lines += [f"### `{title}`", "", "| key | type | default |", "|---|---|---|"]
        for name, sub in job_model.model_fields.items():
            lines.append(f"| `{sub.alias or name}` | {_type_name(sub.annotation)} | {_default(sub.default)} |")
        lines.append("")
    lines += [
        "A job's `check` runs before the model at each firing: exactly one of `command` (in the shell's sandbox,",
        "in `<agent.workspace>/jobs/<name>/`), `url` (web_fetch's address rules, ETag / Last-Modified) or `mcp`",
        "(`{server, tool, arguments}`: a read-only tool of a trusted server); the model wakes when `wake_when`",
        "holds, else the firing is recorded `skipped (no change)` ([scheduler.md](scheduler.md#checks)).",
        "`checklist` names a file of `<agent.workspace>/checklists/` a tick works through: the model is called only",
        "for open items not answered yet ([scheduler.md](scheduler.md#the-checklist-tick)). `idle_backoff` is",
        "`{max_every: 4h}`: each firing skipped for no change doubles the interval, up to `max_every`, until one",
        "wakes ([scheduler.md](scheduler.md#backing-off-when-idle)).",
        "",
    ]
    lines += [
        "Approval rules (`approvals.rules`) are mappings: `tool` (a name, a glob, or a class such as",
        "`@side_effects`, `@fs_write`, `@exec`, `@network`), `action` (`allow` | `deny` | `require`), optional",
        "`args` (argument name -> path glob, or `re:<regex>`), optional `source` (telegram, slack, console, cron,",
        "tick), optional `priority` (higher first). A rule that cannot be loaded makes the tools it names require",
        "approval. Jobs (`scheduler.jobs`) are described in [scheduler.md](scheduler.md).",
        "",
        "Roles (`access.roles`: `tools`, `deny_tools`, `approve`, `compact`, `new_for_others`, `schedule`) are",
        "described in [access.md](access.md); spend caps (`budgets.caps`: `scope` user | chat | job | global,",
        "`period` day | week | month, `usd` and/or `tokens`) in [budgets.md](budgets.md).",
        "`access.dm_policy` and `access.group_policy` written in the file win beside `telegram.allowed_users` /",
        "`slack.allowed_users`: with `group_policy: allowlist` a group is answered only when it is in",
        "`allowed_chats` / `allowed_channels` or an admin approved it, a listed person's mention included; left",
        "out, listed people are answered in any group, as before ([access.md](access.md#who-is-let-in)).",
        "",
        "Each session's directory (`agent.workspace`, `agent.shared_dir`, `agent.shared_writable`) and the",
        "shell's sandbox (`agent.shell_sandbox`, `shell_network`, `shell_env`, `shell_ro_paths`) are described in",
        "[security.md](security.md#files-and-processes). With `shell_sandbox: auto` (the default) the shell runs in",
        "bubblewrap; where bubblewrap is missing or cannot create namespaces the shell is not offered to the model",
        "(the start log and `gateway doctor` say so); only `none` runs commands unconfined. The database file",
        "and the workspace are private to the gateway's user (0600 files, 0700 directories).",
        "",
        "The web tools: `search.provider` (searxng | brave | tavily) turns `web_search` on; `web_fetch` (once",
        "`http_fetch`) keeps its settings under `agent` (`http_fetch_*`, `http_allow_hosts`). Both, and why the",
        "configured `search.url` is reached without the SSRF check, are described in [web.md](web.md).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
