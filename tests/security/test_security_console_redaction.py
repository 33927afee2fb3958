"""Item 13: the console's configuration view shows only what is known to be harmless.

The attack: someone who sees the console (a screen share, a shoulder, a stolen cookie for an
hour) reads the configuration view or the admin API and takes the database password, the MCP
servers' credentials, the bot tokens, the LLM key, or a secret under a key this version does
not know. None of them may appear in any page or any API answer."""

from __future__ import annotations

import sys
import typing

import aiohttp
from admin_support import TOKEN, admin_config, base_url, logged_in, serving
from mcp_support import mcp_section
from pydantic import BaseModel

from gateway.config import Config
from gateway.config.redaction import (
    MASKED,
    NAMES_ONLY,
    PROGRAMS,
    SHOWN,
    URLS,
    redact_command,
    redact_text,
    redact_url,
    scrub,
    secret_values,
)

SECRETS = {
    "database password": "Db-Pass-7f3a9c",
    "database query token": "Db-Query-2b8e1d",
    "LLM key": "sk-llm-Key-5c1e0a9b",
    "Telegram token": "123456:Tg-Bot-Token-8a0f",
    "Telegram webhook secret": "Tg-Webhook-Secret-1d2c",
    "Slack bot token": "xoxb-Slack-Bot-6e4d",
    "Slack signing secret": "Slack-Signing-9b7a",
    "Slack app token": "xapp-Slack-App-3f2e",
    "MCP env": "Mcp-Env-Value-4c3b",
    "MCP argument": "Mcp-Arg-Value-0e9d",
    "MCP header": "Mcp-Header-Value-7a6f",
    "MCP url password": "Mcp-Url-Pass-2d1c",
    "MCP url query": "Mcp-Url-Query-5b4a",
    "rule's unknown key": "Rule-Extra-8c7b",
    "unknown section": "Plugin-Secret-1f0e",
}


class PluginSection(BaseModel):
    """A section this version of the console has never heard of (a newer key, a plugin's)."""

    endpoint: str = ""
    password: str = ""


class ExtendedConfig(Config):
    plugin: PluginSection = PluginSection()


def hostile_config(llm_url: str, workspace: str) -> Config:
    s = SECRETS
    base = admin_config(
        llm_url,
        workspace,
        database={"url": f"postgresql+asyncpg://gw:{s['database password']}@db.internal:5432/gw"
                         f"?sslmode=require&password={s['database query token']}"},
        telegram={"webhook_secret": s["Telegram webhook secret"]},
        slack={"signing_secret": s["Slack signing secret"], "app_token": s["Slack app token"]},
        approvals={"rules": [{"tool": "shell", "action": "require", "note_key": s["rule's unknown key"]}]},
        mcp=mcp_section(
            local={
                "command": [sys.executable, "-c", "import sys; sys.exit(3)", f"--token={s['MCP argument']}"],
                "env": {"SERVICE_API_KEY": s["MCP env"]},
                "connect_timeout_s": 5,
            },
            remote={
                "url": f"http://mcp-user:{s['MCP url password']}@127.0.0.1:9/mcp?key={s['MCP url query']}",
                "headers": {"Authorization": f"Bearer {s['MCP header']}"},
                "connect_timeout_s": 5,
            },
        ),
    )
    data = base.model_dump(mode="python")
    data["llm"]["api_key"] = s["LLM key"]
    # Set after the channels are chosen: the test's gateway runs the fake channel only.
    data["telegram"]["token"] = s["Telegram token"]
    data["slack"]["bot_token"] = s["Slack bot token"]
    data["plugin"] = {"endpoint": "https://vault.example/", "password": s["unknown section"]}
    return ExtendedConfig.model_validate(data)


PAGES = ("/", "/approvals", "/sessions", "/jobs", "/access", "/audit")
API = ("/api/overview", "/api/config", "/api/approvals", "/api/sessions", "/api/jobs", "/api/access", "/api/audit")


def leaked(text: str) -> list[str]:
    return [what for what, secret in SECRETS.items() if secret in text]


async def test_no_secret_reaches_a_console_page_or_the_admin_api(store, llm, tmp_path):
    config = hostile_config(llm.base_url, str(tmp_path / "ws"))
    async with serving(store, config) as h:
        await h.gateway.mcp.wait_for(lambda m: all(s.status == "failed" for s in m.states.values()), 20)
        base = base_url(h)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            await logged_in(http, base)
            for path in PAGES:
                async with http.get(base + path) as response:
                    page = await response.text()
                assert response.status == 200, path
                assert leaked(page) == [], f"{path} shows {leaked(page)}"
                if path == "/":
                    overview = page
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            for path in API:
                async with http.get(base + path) as response:
                    body = await response.text()
                assert response.status == 200, path
                assert leaked(body) == [], f"{path} shows {leaked(body)}"
                if path == "/api/config":
                    shown = await response.json()
    # What is harmless is still shown, so the view stays useful.
    assert shown["database"]["url"] == "postgresql+asyncpg://••••@db.internal:5432/gw?sslmode=••••&password=••••"
    assert shown["mcp"]["servers"]["remote"]["url"] == "http://••••@127.0.0.1:9/mcp?key=••••"
    assert shown["mcp"]["servers"]["remote"]["headers"] == {"Authorization": "•••• (set, 28 characters)"}
    assert list(shown["mcp"]["servers"]["local"]["env"]) == ["SERVICE_API_KEY"]
    assert shown["mcp"]["servers"]["local"]["command"][1:] == ["-c", "import sys; sys.exit(3)", "--token=••••"]
    assert shown["llm"]["model"] == "test-model" and shown["telegram"]["token"] == "•••• (set, 24 characters)"
    assert shown["slack"]["signing_secret"].startswith("•••• (set") and shown["admin"]["token"].startswith("••••")
    assert shown["approvals"]["rules"][0]["tool"] == "shell" and shown["approvals"]["rules"][0]["note_key"] != ""
    assert shown["plugin"] == "•••• (2 entries)"
    assert "SERVICE_API_KEY" in overview and "db.internal:5432" in overview


def test_a_url_keeps_where_it_points_and_loses_its_credentials():
    assert redact_url("sqlite+aiosqlite:///data/gateway.db") == "sqlite+aiosqlite:///data/gateway.db"
    assert redact_url("https://u:p@h.example:8443/v1?api-key=k#frag") == "https://••••@h.example:8443/v1?api-key=••••"
    assert redact_url("https://api.example/v1") == "https://api.example/v1"
    assert redact_url("not a url with a secret") == "•••• (set, 23 characters)"
    assert redact_url("") == ""


def test_every_shown_key_is_a_key_of_the_configuration():
    """A typo in the allowlist would show nothing (safe), but would hide a key from the view."""
    data = Config.model_validate(
        {
            "mcp": {"servers": {"s": {"url": "http://x/mcp"}}},
            "llm": {"prices": {"m": {"input": 1, "output": 2}}},
            "access": {"roles": {"r": {}}},
            "approvals": {"rules": [{"tool": "t", "action": "allow", "args": {}, "source": "x", "priority": 1}]},
            "scheduler": {"jobs": [{"name": "j", "cron": "* * * * *"}]},
            "budgets": {"caps": [{"scope": "user", "period": "day", "usd": 1}]},
        }
    ).model_dump(mode="json")

    def exists(path: tuple[str, ...]) -> bool:
        node = data
        for part in path:
            if isinstance(node, list):
                node = node[0] if node else None
            elif isinstance(node, dict):
                node = next(iter(node.values()), None) if part == "*" else node.get(part, KeyError)
            if node is KeyError:
                return False
        return True

    missing = [".".join(p) for p in (*SHOWN, *URLS) if not exists(p)]
    assert missing == []


def test_every_key_of_the_configuration_is_classified():
    """A new setting is masked until it is added to the allowlist (gateway/config/redaction.py):
    this lists the settings nobody has classified as shown, a URL, names only, or masked."""
    classes = (*SHOWN, *URLS, *NAMES_ONLY, *PROGRAMS, *MASKED)
    unclassified = [
        ".".join(path) for path in model_keys(Config)
        if not any(len(c) >= len(path) and all(a in ("*", b) for a, b in zip(c, path, strict=False)) for c in classes)
    ]
    assert unclassified == []


def model_keys(model: type[BaseModel], path: tuple[str, ...] = ()):  # noqa: ANN201
    """Every settings key of `model` (a mapping or list of sections as `*`)."""
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        annotation, key = field.annotation, (*path, name)
        inner = typing.get_args(annotation)[-1] if typing.get_origin(annotation) in (dict, list) else annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            yield from model_keys(inner, key if inner is annotation else (*key, "*"))
        else:
            yield key


def test_an_error_quoting_a_configured_secret_is_scrubbed():
    config = hostile_config("http://127.0.0.1:9/v1", "ws")
    s = SECRETS
    error = (f"Client error '401' for url 'http://mcp-user:{s['MCP url password']}@127.0.0.1:9/mcp?key="
             f"{s['MCP url query']}' sent {s['MCP header']} with env {s['MCP env']}")
    scrubbed = scrub(error, secret_values(config))
    assert leaked(scrubbed) == [] and "127.0.0.1:9/mcp" in scrubbed


def test_a_command_line_keeps_its_program_and_harmless_arguments():
    argv = [
        "npx", "-y", "@modelcontextprotocol/server-github", "--api-key", "K-Secret-1", "--token=T-Secret-2",
        "-token", "G-Secret-3", "-p", "P-Secret-4", "GITHUB_TOKEN=E-Secret-5", "--db", "postgres://u:U-Secret-6@db/x",
        "-H", "Authorization: Bearer H-Secret-7", "tok-7f3a9c1e", "--region", "eu", "/srv/share",
    ]
    assert redact_command(argv) == [
        "npx", "-y", "@modelcontextprotocol/server-github", "--api-key", "••••", "--token=••••",
        "-token", "••••", "-p", "••••", "GITHUB_TOKEN=••••", "--db", "postgres://••••@db/x",
        "-H", "••••", "••••", "--region", "eu", "/srv/share",
    ]


def test_an_error_or_log_line_loses_the_credentials_it_quotes():
    cases = {
        "usage: server --api-key K-1a2b3c --region eu": "usage: server --api-key •••• --region eu",
        "GET https://u:pw@mcp.example/v1?key=k&sig=d": "GET https://••••@mcp.example/v1?key=••••&sig=••••",
        "401 with Authorization: Bearer eyJhbGciOi.x.y": "401 with Authorization: ••••",
        "sent bearer abcdefgh12345678 to it": "sent bearer •••• to it",
        'config {"api_key": "k-123", "max_tokens": 100}': 'config {"api_key": "••••", "max_tokens": 100}',
        "env DB_PASSWORD=hunter2 AWS_SECRET_ACCESS_KEY=abc/def": "env DB_PASSWORD=•••• AWS_SECRET_ACCESS_KEY=••••",
        "X-Api-Key: abc123 rejected": "X-Api-Key: •••• rejected",
        "key sk-proj-abcdefghijklmnop1234 leaked": "key •••• leaked",
        "mysql -p hunter2 -h db.internal": "mysql -p •••• -h db.internal",
        # harmless text stays readable
    }
    harmless = [
        "[Errno 2] No such file or directory: '/srv/mcp-server'",
        "no answer within 30s from https://keycloak.example:8443/mcp",
        "asked for max_tokens: 4000",
    ]
    assert {text: redact_text(text) for text in cases} == cases
    assert [redact_text(text) for text in harmless] == harmless


def test_redaction_takes_linear_time_on_hostile_text():
    """A server's stderr is the server's to write: no pattern may backtrack on it."""
    import time

    started = time.perf_counter()
    for text in ("a." * 20_000, "-a " * 20_000, "key: " * 20_000, "a://" * 20_000, "x" * 100_000):
        redact_text(text)
    assert time.perf_counter() - started < 10.0  # a backtracking pattern takes minutes here


def test_an_unreachable_model_servers_error_does_not_carry_its_password() -> None:
    """The error a turn records and logs when the model server cannot be reached."""
    import httpx

    from gateway.llm.wire import transport_error

    for exc in (httpx.ConnectError("refused"), httpx.ReadTimeout("slow")):
        error = transport_error(exc, "http://ann:hunter2-secret@llm.internal:8000/v1/chat/completions")
        assert "hunter2-secret" not in str(error) and "llm.internal" in str(error)
