"""What a start loads: the libraries a configuration does not use stay unimported (they are
most of a cold start's CPU). Each check runs in a fresh interpreter, since this one has
imported everything the other tests use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Built like `gateway serve` builds it (Telegram polling, the HTTP server), then the modules listed.
BUILD_GATEWAY = """
import json, sys
from gateway.app import Gateway
from gateway.config import Config
config = Config.model_validate({
    "database": {"url": "sqlite:///" + sys.argv[1] + "/gateway.db"},
    "agent": {"workspace": sys.argv[1] + "/workspace"},
    "telegram": {"token": "123:abc", "api_base_url": "http://127.0.0.1:9/bot"},
    "http": {"port": 0},
    "telemetry": json.loads(sys.argv[2]),
})
Gateway(config)
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""

# Used only by a feature this configuration leaves off, or first when a message needs them.
NOT_AT_START = {
    "slack_sdk": "Slack is not configured",
    "slack_bolt": "Slack is not configured",
    "mcp": "no MCP server is configured",
    "jinja2": "the console is off",
    "aiohttp": "no webhooks and no console: the small status server serves /healthz, /readyz and /metrics",
    "PIL": "no image was received",
    "pypdf": "no PDF was received",
    "alembic": "the schema is checked with one query; alembic only migrates",
    "markdown_it": "nothing was rendered yet",
    "trafilatura": "no web page was fetched",
    "lxml": "no web page was fetched (trafilatura reads pages with it)",
    "opentelemetry": "telemetry.otlp_endpoint is empty",
    "google": "telemetry.otlp_endpoint is empty (protobuf)",
    "requests": "telemetry.otlp_endpoint is empty (the OTLP exporter's HTTP client)",
}


def loaded_by_a_start(tmp_path: Path, telemetry: dict[str, str] | None = None) -> set[str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "TELEGRAM_", "SLACK_", "LLM_", "OTEL_"))
    }
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", BUILD_GATEWAY, str(tmp_path), json.dumps(telemetry or {})],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_a_gateway_with_telegram_only_does_not_load_what_it_does_not_use(tmp_path):
    loaded = loaded_by_a_start(tmp_path)
    assert "telegram" in loaded  # the check sees what the start does load
    unexpected = {name: why for name, why in NOT_AT_START.items() if name in loaded}
    assert unexpected == {}


def test_opentelemetry_is_loaded_only_when_an_endpoint_is_set(tmp_path):
    assert "opentelemetry" in loaded_by_a_start(tmp_path, {"otlp_endpoint": "http://127.0.0.1:9"})
