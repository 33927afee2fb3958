"""Child processes under the gateway's loop runner (gateway/running/lifecycle.py `run_main`): a command
started in the loop is awaited to its exit code and its output read, on Python 3.11 through a
pidfd instead of a thread per child; after the run a new loop in this process still runs
commands with asyncio's own watcher."""

from __future__ import annotations

import asyncio
import sys
import threading

from gateway.running.lifecycle import run_main


async def run(*argv: str) -> tuple[int, bytes, int]:
    """A command's exit code and output, and the threads alive while it ran."""
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    threads = threading.active_count()
    out, _ = await proc.communicate()
    return proc.returncode or 0, out, threads


async def at_once(*commands: tuple[str, ...]) -> list[tuple[int, bytes, int]]:
    return await asyncio.gather(*(run(*argv) for argv in commands))


def test_run_main_awaits_children_without_a_thread_each_and_gives_the_watcher_back() -> None:
    before = threading.active_count()
    code, out, threads = run_main(run(sys.executable, "-c", "print('hi'); raise SystemExit(3)"))
    assert (code, out.strip()) == (3, b"hi")
    if sys.version_info < (3, 12):
        assert threads == before  # 3.11's default would have started a watcher thread for this child
    many = run_main(at_once(*(("sh", "-c", f"exit {n}") for n in range(5))))
    assert [code for code, _, _ in many] == [0, 1, 2, 3, 4]
    assert asyncio.run(run("sh", "-c", "echo again"))[:2] == (0, b"again\n")  # a later loop, the default watcher
