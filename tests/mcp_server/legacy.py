"""An MCP server pinned to one handshake-era protocol version (2024-11-05 ... 2025-11-25),
written on the wire (JSON-RPC over stdio, standard library only), so the client meets a
server that negotiates exactly that version and knows nothing newer: `server/discover` and
`subscriptions/listen` are "Method not found", as from any server of that time.

    python legacy.py --version 2024-11-05

Tools: `echo` (text), `picture` (an image), `fail` (an `isError` result), `grow` (announces a
tool list change); from 2025-03-26 `echo` carries annotations; from 2025-06-18 `weather` answers
structured content with its output schema and a resource link. `--no-tools`: a server of
prompts only, to which `tools/list` is "Method not found".
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any

PNG = base64.b64encode(bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000")).decode()


def tools(version: str, grown: bool) -> list[dict[str, Any]]:
    echo: dict[str, Any] = {
        "name": "echo",
        "description": "Say it back.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    }
    if version >= "2025-03-26":
        echo["annotations"] = {"readOnlyHint": True}
    listed = [
        echo,
        {"name": "picture", "description": "A picture.", "inputSchema": {"type": "object"}},
        {"name": "fail", "description": "Always fails.", "inputSchema": {"type": "object"}},
        {"name": "grow", "description": "Changes the tool list.", "inputSchema": {"type": "object"}},
    ]
    if version >= "2025-06-18":
        listed.append(
            {
                "name": "weather",
                "description": "The weather, structured.",
                "inputSchema": {"type": "object"},
                "outputSchema": {"type": "object", "properties": {"celsius": {"type": "number"}}},
            }
        )
    if grown:
        listed.append({"name": "sprout", "description": "Grown.", "inputSchema": {"type": "object"}})
    return listed


def call(name: str, args: dict[str, Any], version: str) -> dict[str, Any]:
    if name == "echo":
        return {"content": [{"type": "text", "text": f"echo: {args.get('text', '')}"}]}
    if name == "picture":
        return {"content": [{"type": "image", "data": PNG, "mimeType": "image/png"}]}
    if name == "fail":
        return {"content": [{"type": "text", "text": "it failed"}], "isError": True}
    if name == "grow":
        return {"content": [{"type": "text", "text": "grown"}]}
    if name == "weather" and version >= "2025-06-18":
        link = {"type": "resource_link", "uri": "weather://today", "name": "today", "mimeType": "text/plain"}
        return {
            "content": [{"type": "text", "text": '{"celsius": 21}'}, link],
            "structuredContent": {"celsius": 21},
        }
    return {"content": [{"type": "text", "text": f"unknown tool {name}"}], "isError": True}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--version", required=True)
    parser.add_argument("--no-tools", action="store_true", help="a server of prompts only: tools/list is unknown")
    options = parser.parse_args()
    version, has_tools = options.version, not options.no_tools
    grown = False

    def send(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method, ident, params = message.get("method"), message.get("id"), message.get("params") or {}
        if ident is None or method is None:
            continue  # a notification (initialized, cancelled) or a response
        if method == "initialize":
            capabilities = {"tools": {"listChanged": True}} if has_tools else {"prompts": {}}
            info = {"name": f"legacy-{version}", "version": "1.0"}
            result = {"protocolVersion": version, "capabilities": capabilities, "serverInfo": info}
            send({"id": ident, "result": result})
        elif method == "ping":
            send({"id": ident, "result": {}})
        elif method == "tools/list" and has_tools:
            send({"id": ident, "result": {"tools": tools(version, grown)}})
        elif method == "tools/call" and has_tools:
            name = params.get("name", "")
            send({"id": ident, "result": call(name, params.get("arguments") or {}, version)})
            if name == "grow" and not grown:
                grown = True
                send({"method": "notifications/tools/list_changed"})
        else:
            send({"id": ident, "error": {"code": -32601, "message": "Method not found"}})


if __name__ == "__main__":
    main()
