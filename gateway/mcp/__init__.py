"""MCP tool servers: their tools offered like any other, under the same approvals.

`sdk.py` is the only module that imports the `mcp` SDK; `manager.py` supervises the servers
and keeps their tools in the registry; `calls.py` runs one call; `naming.py` names tools and
keys grants; `results.py` and `elicitation.py` translate results and questions; `stderr.py`
forwards a stdio server's stderr to the log.
"""

from gateway.mcp.manager import McpManager, ServerState

__all__ = ["McpManager", "ServerState"]
