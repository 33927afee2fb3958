"""The peer measured beside us: nanobot-ai, pinned, in an environment outside the clone.

    python3 bench/peer.py install      # ~/.cache/gateway-tests/nanobot-<version> (about a minute)
    python3 bench/peer.py path         # where it is (or would be)

`bench/gateway_load.py --only steady` runs the peer's `nanobot gateway` on the same fake Bot
API and fake model, with the same messages, when the environment exists (`--peer off` skips
it), and prints the ratio of the two CPU figures measured in that one run: the peer's absolute
figure moves with the machine, the ratio is the goal.

The peer's configuration: its Telegram channel by long polling, every sender allowed, streaming
off (one sendMessage per reply: the least work it can do, so the ratio is not flattered), the
fake model as a custom OpenAI-compatible provider; its websocket channel off. The one tool call
is its `list_dir` (ours: `clock`), each a cheap read-only tool.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

NANOBOT = "0.3.5"
PTB = "22.8"  # the peer's Telegram plugin asks for python-telegram-bot >=22.6,<23; ours is 22.8
HERE = Path(__file__).resolve().parent
TOOL = ("list_dir", {"path": "."})


def env_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "gateway-tests" / f"nanobot-{NANOBOT}"


def python() -> Path | None:
    """The peer's interpreter when its environment is complete, else None."""
    candidate = env_path() / "bin" / "python"
    if not candidate.exists():
        return None
    done = subprocess.run([candidate, "-c", "import nanobot, telegram"], capture_output=True)
    return candidate if done.returncode == 0 else None


def install() -> Path:
    path = env_path()
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    pip = [str(path / "bin" / "pip"), "install", "--quiet"]
    subprocess.run([*pip, f"nanobot-ai=={NANOBOT}"], check=True)
    subprocess.run([*pip, f"python-telegram-bot[socks,webhooks]=={PTB}", "socksio>=1.0.0,<2.0.0",
                    "python-socks[asyncio]>=2.8.0,<3.0.0"], check=True)
    return path


class NanobotProcess:
    """`nanobot gateway` against the fakes; ready when it first long-polls the fake Bot API.
    CPU read from /proc, as for ours."""

    def __init__(self, directory: Path, telegram: Any, llm_url: str, port: int) -> None:
        self.directory, self.telegram, self.port = directory, telegram, port
        self.config = directory / "nanobot.json"
        self.config.write_text(json.dumps({
            "agents": {"defaults": {"model": "fake-model", "provider": "custom", "timezone": "UTC",
                                    "workspace": str(directory / "nanobot-workspace")}},
            "providers": {"custom": {"apiKey": "bench", "apiBase": llm_url}},
            "gateway": {"port": port},
            "channels": {
                "telegram": {"enabled": True, "token": telegram.token, "allowFrom": ["*"], "streaming": False},
                "websocket": {"enabled": False},
            },
        }))
        self.log = directory / "nanobot.log"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> float:
        interpreter = python()
        assert interpreter is not None, "the peer is not installed: python3 bench/peer.py install"
        home = self.directory / "nanobot-home"
        home.mkdir(exist_ok=True)
        env = {**os.environ, "HOME": str(home), "BENCH_TELEGRAM_URL": self.telegram.url}
        polls = len(self.telegram.calls_to("getUpdates"))
        started = time.perf_counter()
        self.proc = await asyncio.create_subprocess_exec(
            str(interpreter), str(HERE / "nanobot_shim.py"), str(self.config), cwd=str(self.directory), env=env,
            stdout=self.log.open("ab"), stderr=asyncio.subprocess.STDOUT,
        )
        while len(self.telegram.calls_to("getUpdates")) <= polls:
            if self.proc.returncode is not None:
                raise RuntimeError(f"nanobot exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if time.perf_counter() - started > 120:
                raise RuntimeError(f"nanobot not polling after 120 s; see {self.log}")
            await asyncio.sleep(0.01)
        return time.perf_counter() - started

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else "path"
    if command == "install":
        print(install())
    elif command == "path":
        print(env_path())
    else:
        raise SystemExit(f"usage: {sys.argv[0]} install|path")


if __name__ == "__main__":
    main()
