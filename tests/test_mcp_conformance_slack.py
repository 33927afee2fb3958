"""The conformance tier through Slack: the protocol's reference server (server-everything) over
Streamable HTTP on loopback, and the Python reference servers over stdio (tests/mcp_tier.py)
<- the gateway's MCP client -> turns and approvals clicked in FakeSlack through the real bolt
app and slack_sdk, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from mcp_conformance_support import everything_http, git_repo, git_server, time_server, until_a_call_runs
from mcp_support import mcp_section, offered
from mcp_tier import unavailable_reason
from test_slack_e2e import has_prompt, prompt_message, running, slack_config, texts, tool_results

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")
ALLOW_MCP = {"rules": [{"tool": "mcp__*", "action": "allow"}]}


@pytest.fixture
async def everything():
    async with everything_http() as server:
        yield server


async def test_over_http_tools_are_offered_from_the_first_turn_and_a_click_approves(
    store, llm, slack, tmp_path, everything
) -> None:
    repo = git_repo(tmp_path / "repo")
    servers = mcp_section(everything={"url": everything.url}, git=git_server(repo), time=time_server())
    llm.tool_call("mcp__everything__echo", {"message": "hi"}, id="e1")
    llm.reply("Echoed.")
    async with running(store, slack_config(llm, slack, tmp_path, mcp=servers), slack) as s:
        await s.mention("echo hi")  # at once after the start
        await s.settle(lambda: has_prompt(slack))
        names = set(offered(llm.requests[0]))
        assert {"mcp__everything__echo", "mcp__git__git_log", "mcp__time__get_current_time"} <= names
        prompt = prompt_message(slack)
        assert "mcp__everything__echo" in str(prompt["blocks"])  # untrusted: every call is asked
        await s.click(prompt, "Approve")
        await s.settle(lambda: "Echoed." in texts(slack))
        assert tool_results(llm.requests[1]) == ["Echo: hi"]
        assert s.gateway.mcp.summary()["everything"]["protocol"] == "2025-11-25"


async def test_over_http_a_call_of_each_result_kind(store, llm, slack, tmp_path, everything) -> None:
    cfg = slack_config(llm, slack, tmp_path, approvals=ALLOW_MCP, mcp=mcp_section(everything={"url": everything.url}))
    llm.tool_calls(
        ("mcp__everything__get-sum", {"a": 2, "b": 3}, "n1"),
        ("mcp__everything__get-tiny-image", {}, "i1"),
        ("mcp__everything__get-structured-content", {"location": "Chicago"}, "s1"),
        ("mcp__everything__get-resource-links", {"count": 3}, "r1"),
        ("mcp__everything__trigger-long-running-operation", {"duration": 1, "steps": 2}, "p1"),
    )
    llm.reply("All kinds.")
    async with running(store, cfg, slack) as s:
        await s.mention("every kind please")
        await s.settle(lambda: "All kinds." in texts(slack))
        total, image, structured, links, progress = tool_results(llm.requests[1])
        assert total == "The sum of 2 and 3 is 5."
        assert "[image/png saved to the workspace: mcp/everything/" in image
        assert "temperature" in structured
        assert links.count("demo://resource/") >= 3
        assert "Long running operation completed" in progress


async def test_a_parked_call_whose_server_went_down_names_the_server_and_its_state(
    store, llm, slack, tmp_path, everything
) -> None:
    cfg = slack_config(llm, slack, tmp_path, mcp=mcp_section(everything={"url": everything.url}))
    llm.tool_call("mcp__everything__echo", {"message": "later"}, id="e1")
    llm.reply("Could not.")
    async with running(store, cfg, slack) as s:
        await s.mention("echo later")
        await s.settle(lambda: has_prompt(slack))
        everything.kill()  # while the approval waits, the server goes away
        await s.gateway.mcp.wait_for(lambda m: m.states["everything"].status == "failed", 60)
        await s.click(prompt_message(slack), "Approve")
        await s.settle(lambda: "Could not." in texts(slack))
        (result,) = tool_results(llm.requests[1])
        assert "Unknown tool" not in result
        assert "The MCP server 'everything' is not running (it is down; restart " in result
        assert "connection attempts" not in result  # the error's text is the operator's, not the model's
        await everything.start()
        await s.gateway.mcp.wait_for(lambda m: m.states["everything"].status == "running", 60)


async def test_over_http_a_server_killed_mid_call_is_a_clear_tool_error_and_comes_back(
    store, llm, slack, tmp_path, everything
) -> None:
    cfg = slack_config(llm, slack, tmp_path, approvals=ALLOW_MCP, mcp=mcp_section(everything={"url": everything.url}))
    llm.tool_call("mcp__everything__trigger-long-running-operation", {"duration": 60, "steps": 60}, id="p1")
    llm.reply("It stopped.")
    async with running(store, cfg, slack) as s:
        await s.mention("run the long operation")
        await until_a_call_runs(store)
        everything.kill()
        await s.settle(lambda: "It stopped." in texts(slack))
        (result,) = tool_results(llm.requests[1])
        assert result.startswith("Error: The MCP server 'everything' stopped during the call")
        await everything.start()
        await s.gateway.mcp.wait_for(
            lambda m: m.states["everything"].restarts >= 1 and m.states["everything"].status == "running", 60
        )
        llm.tool_call("mcp__everything__echo", {"message": "back"}, id="e1")
        llm.reply("Back.")
        await s.mention("back?")
        await s.settle(lambda: "Back." in texts(slack))
        assert tool_results(llm.requests[-1])[-1] == "Echo: back"


async def test_over_http_health_checks_run_on_one_connection(store, llm, slack, tmp_path, everything) -> None:
    servers = mcp_section(everything={"url": everything.url}, time=time_server())
    async with running(store, slack_config(llm, slack, tmp_path, mcp=servers), slack) as s:
        await s.gateway.mcp.wait_for(lambda m: all(st.checks >= 3 or st.restarts for st in m.states.values()), 90)
        assert {n: (st["status"], st["restarts"]) for n, st in s.gateway.mcp.summary().items()} == {
            "everything": ("running", 0),
            "time": ("running", 0),
        }


async def test_a_server_that_exits_at_start_shows_its_backoff_and_why_in_readyz(store, llm, slack, tmp_path) -> None:
    import aiohttp

    (tmp_path / "plain").mkdir()
    servers = mcp_section(git=git_server(tmp_path / "plain"))  # not a repository: the server exits at start
    async with running(store, slack_config(llm, slack, tmp_path, mcp=servers), slack) as s:
        delays: dict[int, float] = {}

        def seen(m) -> bool:  # noqa: ANN001
            if m.states["git"].status == "failed" and m.states["git"].retry_in_s:
                delays.setdefault(m.states["git"].restarts, m.states["git"].retry_in_s)
            return len(delays) >= 4

        await s.gateway.mcp.wait_for(seen, 60)
        assert [delays[n] for n in sorted(delays)][:4] == [0.1, 0.2, 0.4, 0.5]  # grown from 0.1 s, capped
        assert s.gateway.http is not None
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{s.gateway.http.port}/readyz") as response:
                body = await response.json()
        assert response.status == 200 and body["ready"] is True  # a server that is down is shown, not fatal
        git = body["mcp"]["git"]
        assert git["status"] == "failed" and "not a valid Git repository" in git["error"]
