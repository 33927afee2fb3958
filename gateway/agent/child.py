"""What a child agent's turn knows about itself (see delegation.py): kept apart so that the
turn can name it without importing the delegation machinery, which imports the turn."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.events import ThreadKey

DELEGATE = "delegate"  # the tool's name (gateway/agent/delegate_tool.py)


@dataclass(frozen=True)
class ChildContext:
    task_id: int
    name: str
    depth: int
    tools: frozenset[str]  # what it may call (the parent's subset; `delegate` only below the depth limit)
    chat: ThreadKey  # where its prompts and progress lines are shown: the root's chat
    background: bool = False

    def may_use(self, tool: str) -> bool:
        return tool in self.tools
