"""Names and identities of MCP tools.

A tool is offered as `mcp__<server>__<tool>` within the 64-character `[A-Za-z0-9_-]` limit of
function names; a name that would not fit (or holds other characters) is shortened
deterministically with a hash suffix, and the spec keeps the server's own name.

A grant ("allow for 15 minutes", "allow in this chat") is keyed on `grant_key`: the offered
name plus a hash of the server's identity and the tool's schema, so when the server changes
the tool (a new schema or description, another server behind the same name) the grant no
longer applies and the user is asked again.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

PREFIX = "mcp__"
MAX_NAME = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def tool_name(server: str, tool: str) -> str:
    full = f"{PREFIX}{server}__{tool}"
    safe = _UNSAFE.sub("_", full)
    if safe == full and len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    return f"{safe[: MAX_NAME - 9]}_{digest}"


def schema_hash(identity: str, tool: str, description: str, schema: dict[str, Any], annotations: dict[str, Any]) -> str:
    material = json.dumps(
        {"server": identity, "tool": tool, "description": description, "schema": schema, "annotations": annotations},
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def grant_key(name: str, digest: str) -> str:
    return f"{name}#{digest}"
