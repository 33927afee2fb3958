"""Where a memory entry's words came from, and whether saving it needs a person's approval.

The model decides what to save from everything in its context, so a save's source is what its
conversation (the session: every turn since /new, folded history included) has held besides
the words of the person whose turn saves:

- web: a web page or search results (web_fetch, web_search)
- file: a file read from the workspace (read_file, list_dir)
- attachment: a file, photo or recording someone sent (a voice note is its sender's own words)
- mcp: an MCP server's tool or resource
- tool: any other tool's result (shell, history_search, a sub-agent's, a tool not known here)
- others: someone else's words (another member's message, kept group chatter, a quote)
- unknown: the conversation is older than the inbox's retention, so what it took in is no
  longer on record (fail closed)

None of these: the entry is the person's own words ("words") and is saved without a prompt.
Any of them: the save needs a person's approval, asked like any side-effecting tool's (and
auto-denied where nobody can be asked), and the entry is shown as an unverified note.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from gateway.events import utcnow
from gateway.store.provenance import Evidence, conversation_evidence

OWN_WORDS = "words"
UNKNOWN = "unknown"
# Tools whose results are the gateway's own account of what it did or holds, not outside content.
OWN_TOOLS = frozenset({
    "clock", "scratchpad_set", "scratchpad_get", "memory_save", "memory_search", "memory_forget", "write_file",
    "send_file", "schedule", "ask_user",
})
WEB_TOOLS = frozenset({"web_fetch", "http_fetch", "web_search"})
FILE_TOOLS = frozenset({"read_file", "list_dir"})
MCP_PREFIX = "mcp_"
SPOKEN = frozenset({"voice"})  # attachments that are their sender's own words
SCHEDULER = "scheduler"  # the sender of a job's prompt: the operator's words
KIND_WORDS = {
    "web": "a web page",
    "file": "a file it read",
    "attachment": "an attachment",
    "mcp": "an MCP server's result",
    "tool": "a tool's result",
    "others": "someone else's words",
    UNKNOWN: "content no longer on record",
}


def tool_kind(name: str) -> str | None:
    """What a tool's result is, as a source (None: the gateway's own words)."""
    if name in OWN_TOOLS:
        return None
    if name in WEB_TOOLS:
        return "web"
    if name in FILE_TOOLS:
        return "file"
    return "mcp" if name.startswith(MCP_PREFIX) else "tool"


def sources_of(evidence: Evidence, requester: str, *, inbox_days: float = 0) -> frozenset[str]:
    """The untrusted kinds a conversation has held, for a save in a turn of `requester`."""
    own = {str(requester), SCHEDULER, ""}
    kinds = {kind for kind in map(tool_kind, evidence.tools) if kind is not None}
    if evidence.senders - own:
        kinds.add("others")
    if evidence.images:
        kinds.add("attachment")
    for item in evidence.items:
        if item.kind == "report" or item.checked:
            kinds.add("tool")  # a background task's result; a job's check output
        elif item.sender not in own or item.quotes:
            kinds.add("others")
        if any(kind not in SPOKEN for kind in item.attachments):
            kinds.add("attachment")
    if inbox_days > 0 and evidence.began is not None and evidence.began < utcnow() - timedelta(days=inbox_days):
        kinds.add(UNKNOWN)
    return frozenset(kinds)


def label(kinds: Iterable[str]) -> str:
    """How an entry's source is stored: "words", or the kinds comma-separated."""
    return ",".join(sorted(kinds)) or OWN_WORDS


def kinds_of(source: str) -> list[str]:
    return [k for k in source.split(",") if k and k != OWN_WORDS]


def trusted(source: str) -> bool:
    """Whether an entry's words are its saver's own (a save before sources were recorded is not)."""
    return source == OWN_WORDS


def describe(source: str) -> str:
    """A source in words: "their own words", or "a web page and someone else's words"."""
    kinds = kinds_of(source)
    if not kinds:
        return "their own words"
    words = [KIND_WORDS.get(k, k) for k in kinds]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def approval_reason(kinds: frozenset[str]) -> str:
    return (
        f"this conversation holds {describe(label(kinds))}, not only the words of who asked: a memory "
        "save from it needs approval"
    )


async def conversation_sources(store: Any, session_id: int, requester: str, *, inbox_days: float) -> frozenset[str]:
    return sources_of(await conversation_evidence(store.db, session_id), requester, inbox_days=inbox_days)
