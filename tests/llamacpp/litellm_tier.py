"""The LiteLLM tier: LiteLLM's proxy from PyPI, pinned, in a venv outside the clone, run in front of
llama.cpp's llama-server (tests/llamacpp/server_tier.py) so that the OpenAI Responses API and
the Anthropic Messages API are served by a translator written by others.

Built once and reused while the pin stays the same: `$GATEWAY_TEST_LITELLM`, default
`~/.cache/gateway-tests/litellm-<LITELLM>/`, holding `bin/litellm`. `.ci/run` builds it
(`python3 tests/llamacpp/litellm_tier.py build`, standard library only). Tests call
`unavailable_reason()` and skip with it when the tier is missing.

The pin: 1.106.12, whose `proxy` extra installs from the package index (1.108.14 pins
a `litellm-proxy-extras` post-release the index does not have, and from 1.110 the extra needs a
`litellm-proxy` package it does not have either); the 1.107 releases were withdrawn after they
were found compromised.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

LITELLM = "1.106.12"
MARKER = ".built"  # written last: a tier without it is a build that did not finish


def tier_path() -> Path:
    default = Path.home() / ".cache" / "gateway-tests" / f"litellm-{LITELLM}"
    return Path(os.environ.get("GATEWAY_TEST_LITELLM") or default)


def litellm_binary() -> Path:
    return tier_path() / "bin" / "litellm"


def unavailable_reason() -> str | None:
    """Why the tier cannot run here, or None when it can."""
    where = tier_path()
    if not (where / MARKER).exists():
        return (
            f"LiteLLM's proxy {LITELLM} is not installed at {where} "
            "(.ci/run builds it: python3 tests/llamacpp/litellm_tier.py build; or set GATEWAY_TEST_LITELLM)"
        )
    if not litellm_binary().exists():
        return f"the LiteLLM tier at {where} lacks {litellm_binary()} (remove it and build again)"
    return None


def build() -> Path:
    """Install the tier unless it is there. One builder at a time (a lock beside it); the marker is
    written last, so an install cut short is removed and made again."""
    where = tier_path()
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.with_name(where.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if unavailable_reason() is None:
            return where
        shutil.rmtree(where, ignore_errors=True)
        run = lambda *cmd: subprocess.run(cmd, check=True)  # noqa: E731
        run(sys.executable, "-m", "venv", str(where))
        pip = str(where / "bin" / "pip")
        run(pip, "install", "--quiet", "--upgrade", "pip")
        run("nice", "-n", "10", pip, "install", "--quiet", f"litellm[proxy]=={LITELLM}")
        (where / MARKER).write_text(f"litellm[proxy]=={LITELLM}\n")
    return where


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "build"
    if command == "path":
        print(tier_path())
    elif command == "build":
        print(build())
    else:
        sys.exit(f"usage: {sys.argv[0]} [build|path]")
