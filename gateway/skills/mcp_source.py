"""Skills an MCP server serves (the MCP skills extension: each file of a skill is a resource
`skill://<skill path>/<file>`, the skill's name the last segment of its path). `gateway skills
add mcp:<server>/<name>` downloads one into a folder and adds it like any other: the same door,
copied into skills.dirs, pinned by content. A change on the server reaches the agent only when
the operator adds it again (after `remove`), never by itself."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from gateway.config import McpServerConfig
from gateway.mcp.sdk import Connection, Refusal, connect
from gateway.skills.folder import MAX_FILE_BYTES, MAX_FILES, SKILL_FILE

SCHEME = "skill://"


class SkillSourceError(Exception):
    """One line: what is wrong and what to do."""


def skill_files(uris: list[str], name: str) -> dict[str, str]:
    """The files of the skill `name` by their path in it, from a server's resource uris."""
    roots = [uri[len(SCHEME) : -len("/" + SKILL_FILE)] for uri in uris
             if uri.startswith(SCHEME) and uri.endswith("/" + SKILL_FILE)]
    root = next((r for r in roots if PurePosixPath(r).name == name), None)
    if root is None:
        return {}
    prefix = f"{SCHEME}{root}/"
    return {uri[len(prefix):]: uri for uri in uris if uri.startswith(prefix)}


def skill_names(uris: list[str]) -> list[str]:
    return sorted(PurePosixPath(uri[len(SCHEME) : -len("/" + SKILL_FILE)]).name for uri in uris
                  if uri.startswith(SCHEME) and uri.endswith("/" + SKILL_FILE))


def _safe(relative: str) -> bool:
    parts = relative.split("/")
    return bool(relative) and not relative.startswith("/") and "\\" not in relative and all(
        part not in ("", ".", "..") for part in parts
    )


async def download(server: str, config: McpServerConfig, name: str, into: Path) -> None:
    """The skill's files written under `into` (a new folder named like the skill)."""

    async def nobody_to_ask(request: object) -> Refusal:
        return Refusal("skills are downloaded at the terminal; nobody answers requests there")

    # A failure is raised once the connection is closed (inside, the SDK's task group would wrap it).
    async with connect(config, on_legacy_request=nobody_to_ask, name=server) as connection:
        problem = await _fetch(connection, server, name, into)
    if problem:
        raise SkillSourceError(problem)


async def _fetch(connection: Connection, server: str, name: str, into: Path) -> str:
    """The skill written under `into`, or what is wrong (one line)."""
    if not connection.has_resources:
        return f"MCP server {server!r} serves no resources, so no skills"
    uris = await connection.list_resources()
    files = skill_files(uris, name)
    if SKILL_FILE not in files:
        offered = ", ".join(skill_names(uris)) or "none"
        return f"MCP server {server!r} serves no skill {name!r} (its skills: {offered})"
    if len(files) > MAX_FILES:
        return f"skill {name!r} of MCP server {server!r} has more than {MAX_FILES} files"
    for relative, uri in sorted(files.items()):
        if not _safe(relative):
            return f"skill {name!r} of MCP server {server!r} names a file outside it: {uri}"
        resource = await connection.read_resource(uri)
        data = b"".join(part.text.encode() if part.text else part.data for part in resource.contents)
        if len(data) > MAX_FILE_BYTES:
            return f"{uri}: {len(data):,} bytes; a skill's file is at most {MAX_FILE_BYTES:,}"
        target = into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return ""
