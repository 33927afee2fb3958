"""The no-restart-loop check of the MCP conformance tier: the reference servers (tests/mcp_tier.py)
supervised by the gateway's McpManager for a while, counting restarts and health checks.

    python3 tests/mcp_tier.py build      # once
    .venv/bin/python bench/mcp_restart_loop.py --minutes 10

Prints, per server, its protocol version, restarts, health checks passed on its last
connection and final state, as JSON; exits 1 when any server restarted or is not running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from mcp_tier import node_server, python_server, unavailable_reason  # noqa: E402

from gateway.config import McpConfig  # noqa: E402
from gateway.mcp import McpManager  # noqa: E402
from gateway.tools import ToolRegistry  # noqa: E402


def servers(repo: Path, files: Path, which: list[str]) -> dict[str, dict]:
    every = {
        "time": {"command": [str(python_server("mcp-server-time")), "--local-timezone", "UTC"]},
        "git": {"command": [str(python_server("mcp-server-git")), "--repository", str(repo)]},
        "fetch": {"command": [str(python_server("mcp-server-fetch")), "--ignore-robots-txt"]},
        "everything": {"command": [str(node_server("mcp-server-everything")), "stdio"]},
        "files": {"command": [str(node_server("mcp-server-filesystem")), str(files)]},
    }
    return {name: every[name] for name in which}


async def run(minutes: float, health_s: float, which: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        repo, files = Path(tmp) / "repo", Path(tmp) / "files"
        files.mkdir()
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        config = McpConfig.model_validate({"servers": servers(repo, files, which), "health_interval_s": health_s})
        manager = McpManager(config, ToolRegistry())
        started = time.monotonic()
        await manager.start()
        try:
            await asyncio.sleep(minutes * 60)
            report = manager.summary()
        finally:
            await manager.stop()
    shown = {
        name: {k: state[k] for k in ("status", "protocol", "server", "tools", "restarts", "checks", "error")}
        for name, state in report.items()
    }
    print(json.dumps({"seconds": round(time.monotonic() - started), "health_interval_s": health_s, **shown}, indent=1))
    broken = [n for n, s in report.items() if s["restarts"] or s["status"] != "running"]
    print("verdict:", f"restarted or down: {', '.join(broken)}" if broken else "no restart")
    return 1 if broken else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--health-interval", type=float, default=5.0, help="seconds between health checks")
    parser.add_argument("--servers", default="time,git", help="of time,git,fetch,everything,files")
    args = parser.parse_args()
    if (reason := unavailable_reason()) is not None:
        sys.exit(reason)
    return asyncio.run(run(args.minutes, args.health_interval, args.servers.split(",")))


if __name__ == "__main__":
    sys.exit(main())
