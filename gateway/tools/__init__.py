"""Tools the agent can call: the registry, the per-call context and the built-ins."""

from __future__ import annotations

from gateway.config import AgentConfig
from gateway.tools.builtin_basic import basic_specs
from gateway.tools.builtin_files import file_specs
from gateway.tools.builtin_http import http_specs
from gateway.tools.builtin_send import send_specs
from gateway.tools.builtin_shell import shell_specs
from gateway.tools.registry import (
    SOURCES,
    InMemoryNotes,
    MemoryScope,
    NeedsAnswer,
    Notes,
    ToolContext,
    ToolError,
    ToolOutcome,
    ToolRegistry,
    ToolSpec,
    build_spec,
    matches_any,
    run_tool,
)
from gateway.tools.sandbox import withhold_unconfined

__all__ = [
    "SOURCES",
    "InMemoryNotes",
    "MemoryScope",
    "NeedsAnswer",
    "Notes",
    "ToolContext",
    "ToolError",
    "ToolOutcome",
    "ToolRegistry",
    "ToolSpec",
    "build_spec",
    "builtin_specs",
    "default_registry",
    "matches_any",
    "run_tool",
]


def builtin_specs(agent: AgentConfig | None = None) -> list[ToolSpec]:
    allow_hosts = agent.http_allow_hosts if agent is not None else ()
    return [*basic_specs(), *file_specs(), *shell_specs(), *http_specs(allow_hosts), *send_specs()]


def default_registry(agent: AgentConfig) -> ToolRegistry:
    """The built-ins named (or matched by a glob) in `agent.tools`; the shell only where its
    sandbox works (or `agent.shell_sandbox: none` was chosen)."""
    registry = ToolRegistry(spec for spec in builtin_specs(agent) if matches_any(spec.name, agent.tools))
    withhold_unconfined(registry, agent)
    return registry
