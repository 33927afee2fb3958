"""Memory across sessions: what the agent saves with `memory_save`, shown at the start of
every session of its owner's scope and found with `memory_search`.

`scope.py` decides whose memory a turn reads and writes (never the model); `block.py` renders
the entries that fit `memory.budget_tokens` into the system message; `tools.py` holds the three
tools; `commands.py` answers `/memory` in the chat. The entries live in the database
(gateway/store/memory.py), so they survive `/new`, restarts and instances.
"""

from gateway.memory.block import MemoryBook, render_block
from gateway.memory.commands import memory_command
from gateway.memory.scope import chat_owner, job_owner, message_owner, owner_label, person_owner, turn_scope
from gateway.memory.tools import memory_specs

__all__ = [
    "MemoryBook",
    "chat_owner",
    "job_owner",
    "memory_command",
    "memory_specs",
    "message_owner",
    "owner_label",
    "person_owner",
    "render_block",
    "turn_scope",
]
