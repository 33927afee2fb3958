"""The MCP client's pieces that need no chat: naming, grant keys, elicitation answers, the
configuration, the doctor check, and the policy's view of MCP tools."""

from __future__ import annotations

import sys

import pytest
from mcp_support import FAST, SERVER

from gateway.approvals.policy import ApprovalPolicy, Bypass
from gateway.config import Config, ConfigError, McpConfig, load_config
from gateway.events import ThreadKey
from gateway.mcp.elicitation import DECLINE, answer, question
from gateway.mcp.manager import check_servers, clean_schema, short_description
from gateway.mcp.naming import MAX_NAME, grant_key, schema_hash, tool_name
from gateway.mcp.sdk import ElicitAnswer, Elicitation
from gateway.tools import ToolSpec


def test_tool_names_fit_the_function_name_limit_and_stay_distinct() -> None:
    assert tool_name("files", "read_file") == "mcp__files__read_file"
    long_a, long_b = tool_name("files", "x" * 80), tool_name("files", "x" * 79 + "y")
    assert len(long_a) == len(long_b) == MAX_NAME and long_a != long_b
    assert long_a == tool_name("files", "x" * 80)  # deterministic
    dotted = tool_name("files", "read.file")
    assert dotted.startswith("mcp__files__read_file_") and all(c.isalnum() or c in "_-" for c in dotted)
    ToolSpec(long_a, "", {"type": "object"}, func=None)  # type: ignore[arg-type]  # accepted by the registry


def test_the_grant_changes_with_the_schema_or_the_server() -> None:
    schema = {"type": "object", "properties": {"size": {"type": "integer"}}}
    base = schema_hash("t|cmd|srv 1.0", "grow", "Grow.", schema, {})
    assert base == schema_hash("t|cmd|srv 1.0", "grow", "Grow.", dict(schema), {})
    wider = {**schema, "properties": {**schema["properties"], "unit": {"type": "string"}}}
    assert base != schema_hash("t|cmd|srv 1.0", "grow", "Grow.", wider, {})
    assert base != schema_hash("t|cmd|srv 2.0", "grow", "Grow.", schema, {})
    assert base != schema_hash("t|cmd|srv 1.0", "grow", "Grow bigger.", schema, {})


def spec(name: str, grant: str, side_effects: bool = True) -> ToolSpec:
    async def run(ctx, args):  # noqa: ANN001, ANN202
        return ""

    return ToolSpec(
        name, "", {"type": "object"}, run, side_effects=side_effects, classes=frozenset({"mcp"}), grant=grant
    )


def test_a_bypass_for_the_old_schema_does_not_cover_the_new_one(tmp_path) -> None:
    policy = ApprovalPolicy([], tmp_path)
    thread = ThreadKey("telegram", "1", "")
    old, new = grant_key("mcp__t__grow", "aaaa"), grant_key("mcp__t__grow", "bbbb")
    bypass = Bypass.for_thread(old, thread)
    kwargs = {"source": "telegram", "interactive": True, "bypasses": [bypass], "thread": thread}
    assert policy.decide(spec("mcp__t__grow", old), {}, **kwargs).action == "allow"
    assert policy.decide(spec("mcp__t__grow", new), {}, **kwargs).action == "require"
    headless = {**kwargs, "bypasses": [], "interactive": False, "source": "cron"}
    assert policy.decide(spec("mcp__t__grow", new), {}, **headless).action == "auto_deny"
    # rules name MCP tools by glob or by the @mcp class
    assert (
        ApprovalPolicy([{"tool": "@mcp", "action": "deny"}], tmp_path)
        .decide(spec("mcp__t__lookup", "x", side_effects=False), {}, source="telegram", interactive=True)
        .action
        == "deny"
    )


def test_an_enum_elicitation_is_buttons_and_the_answer_is_content() -> None:
    request = Elicitation(
        "Which colour?", {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}}, "required": ["colour"]}
    )
    asked = question("t", request)
    assert asked.choices == ["red", "blue", DECLINE] and not asked.allow_free_text
    assert answer(request, "answered", "blue") == ElicitAnswer("accept", {"colour": "blue"})
    assert answer(request, "answered", DECLINE) == ElicitAnswer("decline")
    assert answer(request, "answered", "green") == ElicitAnswer("decline")  # not one of the choices
    assert answer(request, "expired", None) == ElicitAnswer("cancel")


def test_typed_elicitation_answers_are_converted_to_the_schema() -> None:
    number = Elicitation("How many?", {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    assert question("t", number).allow_free_text
    assert answer(number, "answered", " 12 ") == ElicitAnswer("accept", {"n": 12})
    assert answer(number, "answered", "twelve") == ElicitAnswer("decline")
    form = Elicitation(
        "Who?",
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name"],
        },
    )
    assert "name:" in question("t", form).text
    assert answer(form, "answered", "name: Ann\nage: 40") == ElicitAnswer("accept", {"name": "Ann", "age": 40})
    assert answer(form, "answered", '{"name": "Bo"}') == ElicitAnswer("accept", {"name": "Bo"})
    assert answer(form, "answered", "age: 3") == ElicitAnswer("decline")  # the required field is missing


def test_schemas_lose_titles_but_keep_properties_named_title() -> None:
    schema = {"type": "object", "title": "Args", "properties": {"title": {"type": "string", "title": "Title"}}}
    assert clean_schema(schema) == {"type": "object", "properties": {"title": {"type": "string"}}}
    assert clean_schema({"type": "string"}) == {"type": "object", "properties": {}}
    assert short_description("x" * 400, 50, "t").endswith("…") and len(short_description("x" * 400, 50, "t")) < 60


def test_configuration_errors_name_the_server(tmp_path) -> None:
    file = tmp_path / "config.yml"
    file.write_text("mcp:\n  servers:\n    files:\n      command: [x]\n      url: http://h/mcp\n")
    with pytest.raises(ConfigError, match=r"mcp\.servers\.files.*either command .* or url"):
        load_config(file, env={})
    file.write_text("mcp:\n  servers:\n    my_files:\n      command: [x]\n")
    with pytest.raises(ConfigError, match="my_files"):
        load_config(file, env={})
    file.write_text(
        "mcp:\n  servers:\n    t:\n      url: http://h/mcp\n      headers: {Authorization: 'Bearer ${TOK}'}\n"
    )
    assert load_config(file, env={"TOK": "s3"}).mcp.servers["t"].headers == {"Authorization": "Bearer s3"}
    assert Config().mcp.servers == {}


async def test_the_doctor_check_reports_each_server(tmp_path) -> None:
    config = McpConfig.model_validate(
        {
            "servers": {
                "t": {"command": [sys.executable, str(SERVER), "--state", str(tmp_path)]},
                "gone": {"command": ["/nonexistent/server"]},
                "off": {"command": ["x"], "enabled": False},
            },
            **FAST,
        }
    )
    report = await check_servers(config, timeout=30)
    assert (
        report["t"]["status"] == "running" and report["t"]["tools"] == 10 and report["t"]["server"] == "test-tools 1.0"
    )
    assert report["gone"]["status"] == "failed" and report["gone"]["error"]
    assert report["off"]["status"] == "disabled"


async def test_a_call_past_its_timeout_is_abandoned_and_the_server_keeps_serving(tmp_path) -> None:
    from gateway.config import AgentConfig
    from gateway.mcp import McpManager
    from gateway.tools import InMemoryNotes, ToolContext, ToolRegistry, run_tool

    server = {"command": [sys.executable, str(SERVER), "--state", str(tmp_path)], "trusted": True, "timeout_s": 1}
    registry = ToolRegistry()
    manager = McpManager(McpConfig.model_validate({"servers": {"t": server}, **FAST}), registry)
    await manager.start()
    try:
        await manager.wait_for(lambda m: m.states["t"].status == "running", 30)
        ctx = ToolContext(1, ThreadKey("console", "1", ""), "console", True, tmp_path, AgentConfig(), InMemoryNotes())
        slow = await run_tool(registry.get("mcp__t__slow"), {"seconds": 5}, ctx)
        assert slow.failed and slow.text == "The MCP server 't' did not answer within 1s; the call was abandoned."
        after = await run_tool(registry.get("mcp__t__lookup"), {"key": "k"}, ctx)
        assert after.text == "value of k" and manager.states["t"].restarts == 0
    finally:
        await manager.stop()
    assert len(registry) == 0  # a stopped server's tools are gone


async def test_the_doctor_section_says_what_to_change(tmp_path) -> None:
    from gateway.mcp.manager import doctor_checks

    config = McpConfig.model_validate(
        {
            "servers": {
                "t": {"command": [sys.executable, str(SERVER), "--state", str(tmp_path)], "tools": ["nothing*"]},
                "gone": {"url": "http://127.0.0.1:9/mcp"},
            },
            **FAST,
        }
    )
    checks = {name: (status, found, fix) for name, status, found, fix in await doctor_checks(config, timeout=30)}
    assert checks["MCP t"][0] == "warn" and "no tool matches mcp.servers.t.tools" in checks["MCP t"][2]
    assert checks["MCP gone"][0] == "fail" and checks["MCP gone"][2] == "check mcp.servers.gone.url"


def test_gateway_doctor_prints_a_line_per_mcp_server(tmp_path) -> None:
    import subprocess

    from mcp_support import free_port
    from test_chat_cli import child_env

    config = tmp_path / "config.yml"
    config.write_text(
        f"llm:\n  base_url: http://127.0.0.1:{free_port()}/v1\n  model: m\n"
        "mcp:\n  servers:\n"
        f"    t:\n      command: [{sys.executable}, {SERVER}, --state, {tmp_path / 'state'}]\n"
        "    gone:\n      command: [/nonexistent/server]\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "doctor", "--config", str(config), "--log-level", "error"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert "MCP servers: t, gone" in done.stdout
    assert "✓ MCP t: running, 10 tools (test-tools 1.0" in done.stdout
    assert "✗ MCP gone: failed:" in done.stdout and "-> check mcp.servers.gone.command" in done.stdout


async def test_on_the_older_protocol_questions_mid_call_are_declined_and_changes_still_arrive(tmp_path) -> None:
    from gateway.config import AgentConfig
    from gateway.mcp import McpManager
    from gateway.tools import InMemoryNotes, ToolContext, ToolRegistry, run_tool

    server = {"command": [sys.executable, str(SERVER), "--state", str(tmp_path)], "trusted": True, "protocol": "legacy"}
    registry = ToolRegistry()
    manager = McpManager(McpConfig.model_validate({"servers": {"t": server}, **FAST}), registry)
    await manager.start()
    try:
        await manager.wait_for(lambda m: m.states["t"].status == "running", 30)
        assert manager.summary()["t"]["protocol"] < "2026"  # a handshake-era version
        ctx = ToolContext(1, ThreadKey("console", "1", ""), "console", True, tmp_path, AgentConfig(), InMemoryNotes())
        # the question arrives in the middle of the call; with no chat to ask in, it is declined
        painted = await run_tool(registry.get("mcp__t__confirm"), {"item": "gate"}, ctx)
        assert painted.text == "not painted (decline)"
        old = registry.get("mcp__t__grow").grant_key
        assert (await run_tool(registry.get("mcp__t__grow"), {"size": 1}, ctx)).text == "grew 1"
        await manager.wait_for(
            lambda m: (spec := m.registry.get("mcp__t__grow")) is not None and spec.grant_key != old, 10
        )
    finally:
        await manager.stop()


async def test_a_stop_while_a_broken_server_is_being_restarted_always_returns() -> None:
    # A cancel landing while the SDK's client starts the server came back from anyio as an
    # exception group; taken for a failure, it kept the supervisor restarting forever and the
    # gateway's stop waited for it (seen as a test hung for 120 s about once in thirty runs).
    import asyncio
    import random

    from gateway.mcp import McpManager
    from gateway.tools import ToolRegistry

    config = McpConfig.model_validate({
        "servers": {"broken": {"command": ["/nonexistent/mcp-server"], "connect_timeout_s": 5}},
        "restart_initial_s": 0.001, "restart_max_s": 0.002,
    })
    for _ in range(150):  # the window is narrow: many stops at random points of the restart loop
        manager = McpManager(config, ToolRegistry())
        await manager.start()
        await asyncio.sleep(random.random() * 0.03)
        async with asyncio.timeout(5):
            await manager.stop()
