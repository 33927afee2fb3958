"""The fault drill's faults beyond kill -9 (see chaos.py): an instance stopped with SIGSTOP past
the lease's time to live and then continued (the stalled holder), and the database restarted
(PostgreSQL stopped for a while, then started again)."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


async def staller(
    instances: list[Any],
    count: int,
    stall_s: Callable[[], float],
    events: list,
    rng: random.Random,
    done: asyncio.Event,
) -> None:
    """`count` times: SIGSTOP a live instance for `stall_s()` seconds (past the lease TTL, so
    another instance takes its threads over while it sleeps), then SIGCONT it."""
    await asyncio.sleep(15)
    for _ in range(count):
        if done.is_set():
            return
        alive = [i for i in instances if i.alive]
        if not alive:
            await asyncio.sleep(1)
            continue
        target = rng.choice(alive)
        pid = target.proc.pid
        seconds = stall_s()
        os.kill(pid, signal.SIGSTOP)
        events.append((time.monotonic(), f"stop:{seconds:.1f}", target.name))
        await asyncio.sleep(seconds)
        try:
            os.kill(pid, signal.SIGCONT)  # a kill -9 meanwhile ended it: nothing to wake
        except ProcessLookupError:
            pass
        events.append((time.monotonic(), "continue", target.name))
        await asyncio.sleep(rng.uniform(8, 16))


def postgres_cluster() -> tuple[str, str] | None:
    """(version, name) of the local PostgreSQL cluster that pg_ctlcluster manages, if any."""
    if shutil.which("pg_ctlcluster") is None or not Path("/etc/postgresql").is_dir():
        return None
    versions = sorted(os.listdir("/etc/postgresql"))
    return (versions[0], "main") if versions else None


async def database_restarter(count: int, down_s: float, events: list, rng: random.Random, done: asyncio.Event) -> None:
    """`count` times: stop the PostgreSQL server for `down_s` seconds, then start it again."""
    cluster = postgres_cluster()
    if cluster is None:
        raise RuntimeError("--db-restarts needs a local PostgreSQL cluster managed by pg_ctlcluster")
    version, name = cluster
    await asyncio.sleep(20)
    for _ in range(count):
        if done.is_set():
            return
        await _pg_ctl("stop", version, name, "-m", "fast")
        events.append((time.monotonic(), f"db-down:{down_s:g}", "postgres"))
        await asyncio.sleep(down_s)
        await _pg_ctl("start", version, name)
        events.append((time.monotonic(), "db-up", "postgres"))
        await asyncio.sleep(rng.uniform(25, 40))


async def _pg_ctl(action: str, version: str, name: str, *extra: str) -> None:
    command = ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, action, *extra]
    result = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")


async def patient(read: Callable[[], Any], fallback: Any = None) -> Any:
    """The drill's own reads of the database, which may be down on purpose: retried a while."""
    for _ in range(60):
        try:
            return await read()
        except Exception:  # noqa: BLE001 - the restarted database takes a moment
            await asyncio.sleep(0.5)
    return fallback
