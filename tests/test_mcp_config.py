"""The MCP configuration people paste: `command` as a string with `args` (Claude Desktop's
`mcpServers` shape), and `mcp.import` of such a JSON file, merged under `mcp.servers`."""

from __future__ import annotations

import json
import sys

import pytest

from gateway.config import ConfigError, load_config


def write(tmp_path, yaml_text: str, mcp_json: dict | str | None = None):
    if mcp_json is not None:
        text = mcp_json if isinstance(mcp_json, str) else json.dumps(mcp_json)
        (tmp_path / "mcp.json").write_text(text)
    file = tmp_path / "config.yml"
    file.write_text(yaml_text)
    return file


def test_a_string_command_takes_its_arguments_from_args(tmp_path) -> None:
    yaml_text = "mcp:\n  servers:\n    time:\n      command: uvx\n      args: [mcp-server-time, --local-timezone, X]\n"
    file = write(tmp_path, yaml_text)
    server = load_config(file, env={}).mcp.servers["time"]
    assert server.command == ["uvx", "mcp-server-time", "--local-timezone", "X"] and server.args == []
    listed = write(tmp_path, "mcp:\n  servers:\n    time:\n      command: [uvx, mcp-server-time]\n      args: [-v]\n")
    assert load_config(listed, env={}).mcp.servers["time"].command == ["uvx", "mcp-server-time", "-v"]


def test_a_string_command_with_its_arguments_in_it_is_a_clear_error(tmp_path) -> None:
    file = write(tmp_path, "mcp:\n  servers:\n    time:\n      command: uvx mcp-server-time\n")
    with pytest.raises(ConfigError, match=r"mcp\.servers\.time\.command: .*put its arguments in args"):
        load_config(file, env={})
    no_command = write(tmp_path, "mcp:\n  servers:\n    time:\n      args: [x]\n      url: http://h/mcp\n")
    with pytest.raises(ConfigError, match="give command too"):
        load_config(no_command, env={})


def test_mcp_import_reads_claude_desktops_servers_and_explicit_ones_win(tmp_path) -> None:
    desktop = {
        "mcpServers": {
            "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv"]},
            "search": {"command": sys.executable, "args": ["-m", "s"], "env": {"API_KEY": "${SEARCH_KEY}", "N": 3}},
            "remote": {"url": "https://tools.example.org/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}},
            "legacy": {"type": "sse", "url": "https://old.example.org/sse"},
            "off": {"command": "x", "disabled": True},
            "time": {"command": "uvx", "args": ["mcp-server-time"]},
        }
    }
    yaml_text = (
        "mcp:\n  import: mcp.json\n  servers:\n"
        "    files:\n      trusted: true\n"  # adds to the imported entry
        "    time:\n      command: [/opt/time-server]\n"  # replaces it
    )
    servers = load_config(write(tmp_path, yaml_text, desktop), env={"SEARCH_KEY": "k1", "TOKEN": "t2"}).mcp.servers
    assert servers["files"].command == ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv"]
    assert servers["files"].trusted is True
    assert servers["search"].env == {"API_KEY": "k1", "N": "3"}
    assert servers["remote"].url == "https://tools.example.org/mcp"
    assert servers["remote"].headers == {"Authorization": "Bearer t2"}
    assert servers["remote"].transport == "streamable_http"
    assert servers["legacy"].transport == "sse"
    assert servers["off"].enabled is False
    assert servers["time"].command == ["/opt/time-server"]


@pytest.mark.parametrize(
    "content, error",
    [
        (None, r"mcp\.import: mcp\.json: no such file"),
        ("{not json", r"mcp\.import: mcp\.json: not valid JSON"),
        ({"servers": {}}, r'mcp\.import: mcp\.json: expected \{"mcpServers"'),
        ({"mcpServers": {"x": ["npx"]}}, r"mcpServers\.x: expected a mapping"),
        ({"mcpServers": {"x": {"command": "npx", "autoApprove": []}}}, r"mcpServers\.x: autoApprove: not read"),
        ({"mcpServers": {"x": {"url": "http://h", "type": "websocket"}}}, r"mcpServers\.x: type 'websocket'"),
        ({"mcpServers": {"x": {"command": "npx", "env": {"K": "${UNSET_VAR}"}}}}, r"UNSET_VAR is not set"),
        ({"mcpServers": {"x": {"command": "npx", "url": "http://h"}}}, r"mcp\.servers\.x: .*either command"),
        ({"mcpServers": {"my_files": {"command": "npx"}}}, r"server name 'my_files'"),
    ],
)
def test_mcp_import_errors_name_the_file_and_the_entry(tmp_path, content, error) -> None:
    file = write(tmp_path, "mcp:\n  import: mcp.json\n", content)
    with pytest.raises(ConfigError, match=error):
        load_config(file, env={})


async def test_an_imported_reference_server_runs_and_offers_its_tools(tmp_path) -> None:
    from mcp_support import FAST
    from mcp_tier import python_server, unavailable_reason

    from gateway.mcp import McpManager
    from gateway.tools import ToolRegistry

    if (reason := unavailable_reason()) is not None:
        pytest.skip(reason)
    time = {"command": str(python_server("mcp-server-time")), "args": ["--local-timezone", "UTC"]}
    desktop = {"mcpServers": {"time": time}}
    fast = "".join(f"  {key}: {value}\n" for key, value in FAST.items())
    config = load_config(write(tmp_path, f"mcp:\n  import: mcp.json\n{fast}", desktop), env={})
    registry = ToolRegistry()
    manager = McpManager(config.mcp, registry)
    await manager.start()
    try:
        await manager.wait_for(lambda m: m.states["time"].status == "running", 60)
        assert {"mcp__time__get_current_time", "mcp__time__convert_time"} <= set(registry.names())
    finally:
        await manager.stop()
