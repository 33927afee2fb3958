"""The MCP conformance tier: MCP servers written by others, from PyPI and npm, pinned by version.

Built once outside the clone and reused while the pins stay the same, like the llama.cpp tier:
`$GATEWAY_TEST_MCP_TIER`, default `~/.cache/gateway-tests/mcp-tier-<pinhash>/`, holding

    py/bin/<server>                     a venv with the Python reference servers
    node/node_modules/.bin/<bin>        an npm prefix with the Node reference servers

`.ci/run` builds it (`python3 tests/mcp_tier.py build`, standard library only, so the system
Python runs it before the project is installed). Tests call `unavailable_reason()` and skip with
it when the tier is missing.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

PYTHON_SERVERS = {  # PyPI package -> version; each installs a console script of the same name
    "mcp-server-time": "2026.10.19",
    "mcp-server-git": "2026.10.19",
    "mcp-server-fetch": "2026.10.24",
}
NODE_SERVERS = {  # npm package -> (version, the bin it installs)
    "@modelcontextprotocol/server-everything": ("2026.8.31", "mcp-server-everything"),
    "@modelcontextprotocol/server-filesystem": ("2026.8.31", "mcp-server-filesystem"),
}
# mcp-server-fetch extracts pages with readabilipy, which, when node is on PATH, runs Readability.js
# and on its first use runs `npm install` of unpinned packages into its own directory: the newest
# jsdom needs Node 22, so on Node 20 every fetch failed. Installed here, pinned, at build time.
READABILIPY_JS = {"jsdom": "26.1.0", "@mozilla/readability": "0.6.0", "minimist": "1.2.8"}
MARKER = ".built"  # written last: a tier without it is a build that did not finish


def pins() -> list[str]:
    return (
        [f"{name}=={version}" for name, version in PYTHON_SERVERS.items()]
        + [f"{name}@{version}" for name, (version, _bin) in NODE_SERVERS.items()]
        + [f"readabilipy-js:{name}@{version}" for name, version in READABILIPY_JS.items()]
    )


def pin_hash() -> str:
    return hashlib.sha256("\n".join(sorted(pins())).encode()).hexdigest()[:12]


def tier_path() -> Path:
    default = Path.home() / ".cache" / "gateway-tests" / f"mcp-tier-{pin_hash()}"
    return Path(os.environ.get("GATEWAY_TEST_MCP_TIER") or default)


def python_server(name: str) -> Path:
    """The console script of a Python server, e.g. `python_server("mcp-server-time")`."""
    return tier_path() / "py" / "bin" / name


def node_server(name: str) -> Path:
    """The bin of a Node server, e.g. `node_server("mcp-server-everything")`."""
    return tier_path() / "node" / "node_modules" / ".bin" / name


def unavailable_reason() -> str | None:
    """Why the tier cannot run here, or None when it can."""
    where = tier_path()
    if not (where / MARKER).exists():
        return (
            f"the MCP conformance tier is not built at {where} "
            "(.ci/run builds it: python3 tests/mcp_tier.py build; or set GATEWAY_TEST_MCP_TIER)"
        )
    missing = [str(p) for p in _executables() if not p.exists()]
    if missing:
        return f"the MCP conformance tier at {where} lacks {', '.join(missing)} (remove it and build again)"
    if shutil.which("node") is None:
        return "node is not on PATH (the Node MCP servers need it)"
    return None


def _executables() -> list[Path]:
    return [python_server(name) for name in PYTHON_SERVERS] + [node_server(b) for _v, b in NODE_SERVERS.values()]


def build() -> Path:
    """Build the tier unless it is there. One builder at a time (a lock beside it); the marker
    is written last, so a build cut short is removed and made again."""
    where = tier_path()
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.with_name(where.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if unavailable_reason() is None:
            return where
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir()
        run = lambda *cmd: subprocess.run(cmd, check=True)  # noqa: E731
        run(sys.executable, "-m", "venv", str(where / "py"))
        pip = str(where / "py" / "bin" / "pip")
        run(pip, "install", "--quiet", "--upgrade", "pip")
        run(pip, "install", "--quiet", *[f"{n}=={v}" for n, v in PYTHON_SERVERS.items()])
        (readabilipy,) = (where / "py" / "lib").glob("python*/site-packages/readabilipy/javascript")
        npm = ("npm", "install", "--no-audit", "--no-fund", "--loglevel=error")
        run(*npm, "--prefix", str(readabilipy), *[f"{n}@{v}" for n, v in READABILIPY_JS.items()])
        node = where / "node"
        node.mkdir()
        packages = [f"{name}@{version}" for name, (version, _bin) in NODE_SERVERS.items()]
        run(*npm, "--prefix", str(node), *packages)
        (where / MARKER).write_text("\n".join(pins()) + "\n")
    return where


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "build"
    if command == "path":
        print(tier_path())
    elif command == "build":
        print(build())
    else:
        sys.exit(f"usage: {sys.argv[0]} [build|path]")
