"""A gateway wired to an in-process fake channel and the fake LLM server, on a test store."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

from fakes.channel import FakeChannel

from gateway.app import Gateway
from gateway.config import Config
from gateway.events import ButtonPress, InboundMessage, Sender, SubmitResult, ThreadKey
from gateway.llm import LLMClient
from gateway.running.clock import SYSTEM_CLOCK, Clock
from gateway.store import Store

_ids = itertools.count(1)
ALICE = Sender("100", "Alice", "alice")
BOB = Sender("200", "Bob", "bob")


def make_config(llm_url: str, workspace: str, **sections: dict[str, Any]) -> Config:
    data: dict[str, Any] = {
        "llm": {"base_url": llm_url, "model": "test-model", "max_retries": 1, "retry_budget_s": 5},
        "agent": {"workspace": workspace, "system_prompt": "You are a test agent."},
        "inbox": {"poll_interval_s": 0.05, "lease_ttl_s": 5},
        "serve": {"shutdown_grace": 2},
        "scheduler": {"enabled": False},
        # The tests talk to the bot as people nobody listed: they say so (the default is pairing).
        "access": {"dm_policy": "open", "group_policy": "open"},
        # The tests of approvals approve their own requests (the behaviour of before); the
        # default (admins decide) is tried in tests/security/test_security_approvals.py.
        "approvals": {"self_approve": True},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return Config.model_validate(data)


@contextlib.asynccontextmanager
async def running_gateway(
    store: Store,
    config: Config,
    channel: FakeChannel | None = None,
    *,
    instance_id: str | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> AsyncIterator[Harness]:
    channel = channel or FakeChannel()
    llm = LLMClient(config.llm, backoff_base_s=0.01)
    gateway = Gateway(
        config,
        channels={channel.name: channel},
        serve_http=False,
        store=store,
        llm=llm,
        instance_id=instance_id,
        clock=clock,
    )
    await gateway.start()
    try:
        yield Harness(gateway, channel)
    finally:
        await gateway.stop()
        await llm.aclose()


class Harness:
    def __init__(self, gateway: Gateway, channel: FakeChannel):
        self.gateway = gateway
        self.channel = channel
        self.store = gateway.store

    async def say(
        self, text: str, *, thread: ThreadKey | None = None, sender: Sender = ALICE, event_id: str | None = None
    ) -> SubmitResult:
        thread = thread or ThreadKey("fake", "chat1", "")
        event = InboundMessage(thread, sender, text, event_id or f"fake:{next(_ids)}", message_id=str(next(_ids)))
        return (await self.gateway.submit([event]))[0]

    async def tap(
        self, token: str, *, thread: ThreadKey | None = None, sender: Sender = ALICE, event_id: str | None = None
    ) -> SubmitResult:
        thread = thread or ThreadKey("fake", "chat1", "")
        press = ButtonPress(thread, sender, token, event_id or f"fake:tap:{next(_ids)}")
        return (await self.gateway.submit([press]))[0]

    async def idle(self, timeout: float = 15.0) -> None:
        await self.gateway.inbox.wait_until_idle(timeout)

    async def wait_for(self, predicate, timeout: float = 15.0) -> None:  # noqa: ANN001
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate():
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("condition not reached")
            await asyncio.sleep(0.02)

    def token(self, prompt_index: int, label_prefix: str) -> str:
        prompt = self.channel.prompts()[prompt_index]
        for row in prompt.buttons:
            for button in row:
                if button.label.startswith(label_prefix) or label_prefix in button.label:
                    return button.token
        raise KeyError(label_prefix)
