"""The conformance tier through Telegram: MCP servers written by others (tests/mcp_tier.py,
the reference servers from PyPI and npm, pinned) <- the gateway's MCP client -> turns and
approvals shown through real PTB to FakeTelegram, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import signal

import pytest
from helpers import session_file
from mcp_conformance_support import (
    everything_stdio,
    fetch_server,
    filesystem_server,
    git_repo,
    git_server,
    loopback_page,
    time_server,
    until_a_call_runs,
)
from mcp_support import mcp_section, offered
from mcp_tier import node_server, unavailable_reason
from test_telegram_e2e import (
    PRIVATE,
    button,
    has_prompt,
    prompt_message,
    running,
    settle,
    texts,
    tg_config,
    tool_results,
)

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")
ALLOW_MCP = {"rules": [{"tool": "mcp__*", "action": "allow"}]}  # the calls, not their approval, are tested


def all_servers(tmp_path) -> dict:
    (tmp_path / "files").mkdir(exist_ok=True)
    (tmp_path / "files" / "menu.txt").write_text("soup\n")
    return {
        "time": time_server(),
        "git": git_server(git_repo(tmp_path / "repo")),
        "fetch": fetch_server(),
        "everything": everything_stdio(),
        "files": filesystem_server(tmp_path / "files"),
    }


async def test_every_server_is_offered_from_the_first_turn_after_a_start(store, llm, tg, tmp_path) -> None:
    async with loopback_page() as page:
        cfg = tg_config(llm, tg, tmp_path, approvals=ALLOW_MCP, mcp=mcp_section(**all_servers(tmp_path)))
        llm.tool_calls(
            ("mcp__time__get_current_time", {"timezone": "Europe/Paris"}, "t1"),
            ("mcp__git__git_log", {"repo_path": str(tmp_path / "repo")}, "g1"),
            ("mcp__fetch__fetch", {"url": page}, "f1"),
            ("mcp__everything__echo", {"message": "hello"}, "e1"),
            ("mcp__files__list_directory", {"path": str(tmp_path / "files")}, "d1"),
        )
        llm.reply("All answered.")
        async with running(store, cfg) as gateway:
            # at once, as a message right after a deploy would be: no waiting for the servers here
            tg.private_message(PRIVATE, "use every server")
            await settle(gateway, lambda: "All answered." in texts(tg, PRIVATE))
            names = set(offered(llm.requests[0]))
            for server, tool in [
                ("time", "get_current_time"),
                ("git", "git_log"),
                ("fetch", "fetch"),
                ("everything", "echo"),
                ("files", "list_directory"),
            ]:
                assert f"mcp__{server}__{tool}" in names, server
            clock, log, fetched, echoed, listed = tool_results(llm.requests[1])
            assert '"timezone": "Europe/Paris"' in clock
            assert "First words" in log
            assert "We open at nine." in fetched
            assert echoed == "Echo: hello"
            assert "menu.txt" in listed


async def test_health_checks_run_on_one_connection_to_each_server(store, llm, tg, tmp_path) -> None:
    cfg = tg_config(llm, tg, tmp_path, mcp=mcp_section(**all_servers(tmp_path)))
    async with running(store, cfg) as gateway:
        # no "Method not found" restart loop: several checks pass on the first connection of each
        await gateway.mcp.wait_for(
            lambda m: all(s.checks >= 3 or s.restarts for s in m.states.values()), 90
        )
        summary = gateway.mcp.summary()
        assert {name: (s["status"], s["restarts"]) for name, s in summary.items()} == {
            name: ("running", 0) for name in ("time", "git", "fetch", "everything", "files")
        }
        assert summary["time"]["protocol"] == "2026-07-28" and summary["everything"]["protocol"] == "2025-11-25"


async def test_a_call_of_each_result_kind(store, llm, tg, tmp_path) -> None:
    cfg = tg_config(
        llm, tg, tmp_path, approvals=ALLOW_MCP, mcp=mcp_section(everything=everything_stdio(), time=time_server())
    )
    llm.tool_calls(
        ("mcp__everything__get-tiny-image", {}, "i1"),
        ("mcp__everything__get-structured-content", {"location": "New York"}, "s1"),
        ("mcp__everything__get-resource-links", {"count": 2}, "r1"),
        ("mcp__time__get_current_time", {"timezone": "Mars/Olympus_Mons"}, "x1"),
        ("mcp__everything__trigger-long-running-operation", {"duration": 1, "steps": 2}, "p1"),
    )
    llm.reply("Seen them all.")
    async with running(store, cfg) as gateway:
        tg.private_message(PRIVATE, "show me every kind")
        await settle(gateway, lambda: "Seen them all." in texts(tg, PRIVATE))
        image, structured, links, error, progress = tool_results(llm.requests[1])
        assert "[image/png saved to the workspace: mcp/everything/" in image
        saved = image.split("workspace: ")[1].split(" ")[0].rstrip("]")
        assert session_file(tmp_path / "ws", saved).read_bytes().startswith(b"\x89PNG")
        assert "temperature" in structured and "humidity" in structured
        assert links.count("demo://resource/") >= 2
        assert "returned an error" in error and "Mars/Olympus_Mons" in error
        assert "Long running operation completed" in progress and "Steps: 2" in progress
        # Its progress notifications (sent because the call carries a progress token) are traced.
        run = (await store.runs.list())[0]
        progressed = [e.payload for e in await store.runs.events(run.id) if e.kind == "MCP_PROGRESS"]
        assert progressed and progressed[0]["server"] == "everything" and progressed[0]["total"] == 2


async def test_an_untrusted_servers_call_is_approved_by_button(store, llm, tg, tmp_path) -> None:
    repo = git_repo(tmp_path / "repo")
    cfg = tg_config(llm, tg, tmp_path, mcp=mcp_section(git=git_server(repo)))
    llm.tool_call("mcp__git__git_status", {"repo_path": str(repo)}, id="g1")
    llm.reply("Clean.")
    async with running(store, cfg) as gateway:
        tg.private_message(PRIVATE, "is the repo clean?")
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        prompt = prompt_message(tg, PRIVATE)
        assert "mcp__git__git_status" in prompt.text
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
        await settle(gateway, lambda: "Clean." in texts(tg, PRIVATE))
        (status,) = tool_results(llm.requests[1])
        assert "On branch main" in status


async def test_a_server_that_exits_at_start_shows_a_growing_backoff(store, llm, tg, tmp_path) -> None:
    (tmp_path / "plain").mkdir()
    cfg = tg_config(llm, tg, tmp_path, mcp=mcp_section(git=git_server(tmp_path / "plain")))
    async with running(store, cfg) as gateway:
        delays: dict[int, float] = {}

        def seen(m) -> bool:  # noqa: ANN001
            state = m.states["git"]
            if state.status == "failed":
                delays.setdefault(state.restarts, state.retry_in_s)
            return len(delays) >= 3

        await gateway.mcp.wait_for(seen, 60)
        assert [delays[n] for n in sorted(delays)][:3] == [0.1, 0.2, 0.4]
        await gateway.mcp.wait_for(lambda m: m.states["git"].retry_in_s == 0.5, 30)  # capped at restart_max_s
        tg.private_message(PRIVATE, "/status")
        await settle(gateway, lambda: any("MCP git" in t for t in texts(tg, PRIVATE)))
        assert "MCP git: 🔴 down (restarting" in texts(tg, PRIVATE)[-1]  # the chat is not shown the error
        assert "not a valid Git repository" in gateway.mcp.summary()["git"]["error"]  # the operator is


async def test_a_server_killed_mid_call_is_a_clear_tool_error_and_comes_back(store, llm, tg, tmp_path) -> None:
    pid_file = tmp_path / "everything.pid"
    command = ["sh", "-c", f'echo $$ > "{pid_file}"; exec "{node_server("mcp-server-everything")}" stdio']
    cfg = tg_config(llm, tg, tmp_path, approvals=ALLOW_MCP, mcp=mcp_section(everything={"command": command}))
    llm.tool_call("mcp__everything__trigger-long-running-operation", {"duration": 60, "steps": 60}, id="p1")
    llm.reply("It stopped.")
    async with running(store, cfg) as gateway:
        tg.private_message(PRIVATE, "run the long operation")
        await until_a_call_runs(store)
        first_pid = int(pid_file.read_text())
        os.kill(first_pid, signal.SIGKILL)
        await settle(gateway, lambda: "It stopped." in texts(tg, PRIVATE))
        (result,) = tool_results(llm.requests[1])
        assert "The MCP server 'everything' stopped during the call" in result
        await gateway.mcp.wait_for(
            lambda m: m.states["everything"].restarts >= 1 and m.states["everything"].status == "running", 60
        )
        assert int(pid_file.read_text()) != first_pid
        llm.tool_call("mcp__everything__echo", {"message": "back"}, id="e1")
        llm.reply("Back.")
        tg.private_message(PRIVATE, "are you back?")
        await settle(gateway, lambda: "Back." in texts(tg, PRIVATE))
        assert tool_results(llm.requests[3])[-1] == "Echo: back"
