"""What a turn is given: the gateway's services, built once by the composition root (app.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from gateway.access import AccessPolicy, Gatekeeper
from gateway.approvals.policy import ApprovalPolicy
from gateway.approvals.prompts import PromptService
from gateway.budgets import SpendGate
from gateway.config import Config
from gateway.delivery.outbox import Outbox
from gateway.llm import LLMClient
from gateway.store import Store
from gateway.tools import ToolRegistry


@dataclass
class TurnServices:
    store: Store
    config: Config
    llm: LLMClient
    registry: ToolRegistry
    policy: ApprovalPolicy
    context: Any  # gateway.context.ContextBuilder
    outbox: Outbox
    prompts: PromptService
    tool_services: dict[str, Any] = field(default_factory=dict)
    attachments: Any = None  # gateway.attachments.AttachmentPreparer: files of messages, before their turn
    delegation: Any = None  # gateway.agent.delegation.Delegation: runs `delegate` calls
    access: AccessPolicy | None = None  # roles: which tools a person's turns may use
    gatekeeper: Gatekeeper | None = None  # who may talk to the agent (pairing)
    spend: SpendGate | None = None  # the spend caps (also the LLM client's gate)
    # inbox.max_concurrent_turns, shared by the threads' workers and the sub-agents they run
    turn_slots: asyncio.Semaphore | None = None
    memory: Any = None  # gateway.memory.MemoryBook: the memory shown at a session's start (None: off)
    voice: Any = None  # gateway.voice.VoiceReplies: answers also spoken where a chat asked (None: no speech model)
    telemetry: Any = None  # gateway.telemetry.Telemetry: spans exported (None: telemetry.otlp_endpoint is empty)
