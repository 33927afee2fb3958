"""Helpers shared by the tool and approval tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.config import AgentConfig
from gateway.events import ThreadKey
from gateway.tools import InMemoryNotes, ToolContext, ToolOutcome, builtin_specs, run_tool

THREAD = ThreadKey("telegram", "42", "7")


def make_ctx(workspace: Path, *, source: str = "telegram", interactive: bool = True, **agent: Any) -> ToolContext:
    return ToolContext(
        session_id=1,
        thread=THREAD,
        source=source,
        interactive=interactive,
        workspace=workspace,
        agent=AgentConfig(workspace=str(workspace), **agent),
        notes=InMemoryNotes(),
    )


def builtin(name: str):
    return next(spec for spec in builtin_specs() if spec.name == name)


async def call(ctx: ToolContext, name: str, **args: Any) -> ToolOutcome:
    return await run_tool(builtin(name), args, ctx)
