"""`mcp_read_resource`: the model reads a resource a server linked to in a tool result (or any
uri the server serves), offered while a running server declares resources. Its text comes back
as the tool result (shortened by the usual limits of long results); binary parts are saved to
the workspace, images shown to a vision model, like the content of a tool result. Reading is
no side effect, but the server is trusted only as far as `trusted` says: reading from an
untrusted server asks for approval like its read-only tools do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.config import McpServerConfig
from gateway.mcp.calls import show_images
from gateway.mcp.results import READ_TOOL, render_contents
from gateway.mcp.sdk import CallFailed, Connection, ServerGone
from gateway.tools.registry import ToolContext, ToolError, ToolSpec


def read_spec(
    live: Callable[[str], Connection], servers: dict[str, McpServerConfig], readable: list[str]
) -> ToolSpec:
    async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
        server, uri = str(args["server"]), str(args["uri"])
        if server not in readable:
            raise ToolError(f"No running MCP server {server!r} has resources; these do: {', '.join(readable)}.")
        try:
            resource = await live(server).read_resource(uri)
        except ServerGone as exc:
            raise ToolError(f"The MCP server {server!r} stopped while reading {uri} ({exc}).") from None
        except CallFailed as exc:
            raise ToolError(f"The MCP server {server!r} could not read {uri}: {exc}") from None
        except TimeoutError:
            raise ToolError(f"The MCP server {server!r} did not answer the read of {uri} in time.") from None
        rendered = render_contents(resource.contents, server=server, workspace=ctx.workspace)
        await show_images(ctx, rendered, f"{READ_TOOL} of {server!r}")
        return rendered.text or "(the resource is empty)"

    def needs_approval(args: Any) -> str | None:
        config = servers.get(str(args.get("server", "")))
        return None if config is not None and config.trusted else "the MCP server is not trusted"

    return ToolSpec(
        name=READ_TOOL,
        description=(
            "Read a resource of an MCP server by its uri (e.g. a resource link a tool returned). "
            f"Servers with resources: {', '.join(readable)}."
        ),
        parameters={
            "type": "object",
            "properties": {
                "server": {"type": "string", "enum": list(readable), "description": "The server's name."},
                "uri": {"type": "string", "description": "The resource's uri."},
            },
            "required": ["server", "uri"],
            "additionalProperties": False,
        },
        func=run,
        classes=frozenset({"mcp"}),
        needs_approval=needs_approval,
    )
