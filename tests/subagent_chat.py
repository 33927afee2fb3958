"""Sub-agent tests' shared parts: one chat over the Telegram or the Slack fake, and a scripted
model that answers each agent (the parent, each child) from its own script.

Children run concurrently, so one shared queue of replies would be played in a racy order; the
`Agents` responder picks the script by the conversation's first user message (a child's is its
task prompt) and plays it in order.
"""

from __future__ import annotations

import contextlib
import copy
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fakes.llm import FakeLLM, FakeToolCall, Reply, user_texts
from fakes.slack import SIGNING_SECRET, FakeSlack, SlackEventSender
from fakes.telegram import FakeTelegram
from test_slack_e2e import DM, slack_config
from test_slack_e2e import bot_messages as slack_bot_messages
from test_slack_e2e import buttons as slack_buttons
from test_telegram_e2e import PRIVATE, button, tg_config, until

from gateway.app import Gateway
from gateway.llm import LLMClient
from gateway.store import Store

ANN_SLACK = "U1"


def tool_names(request: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools") or []]


def delegate(*tasks: dict[str, Any], background: bool = False, id: str = "d1") -> FakeToolCall:
    arguments: dict[str, Any] = {"tasks": list(tasks)}
    if background:
        arguments["background"] = True
    return FakeToolCall("delegate", arguments, id)


class Agents:
    """`llm.responder`: the next reply of the agent whose first user message starts with a key."""

    def __init__(self) -> None:
        self.scripts: dict[str, deque[Reply]] = defaultdict(deque)
        self.asked: list[str] = []  # which agent each request was for, in arrival order

    def script(self, key: str, *replies: Reply) -> None:
        self.scripts[key].extend(replies)

    def __call__(self, request: dict[str, Any]) -> Reply:
        first = user_texts(request)[0]
        key = next((k for k in sorted(self.scripts, key=len, reverse=True) if first.startswith(k)), None)
        if key is None or not self.scripts[key]:
            return Reply(f"(unscripted reply for {first[:40]!r})")
        self.asked.append(key)
        return self.scripts[key].popleft()


@dataclass
class Chat:
    """One person's private conversation with the gateway, on Telegram or Slack."""

    kind: str
    gateway: Gateway
    tg: FakeTelegram | None = None
    slack: FakeSlack | None = None
    sender: SlackEventSender | None = None

    @property
    def thread_key(self) -> str:
        return f"telegram:{PRIVATE}:" if self.kind == "telegram" else f"slack:{DM}:"

    async def say(self, text: str) -> None:
        if self.tg is not None:
            self.tg.private_message(PRIVATE, text)
            return
        assert self.slack is not None and self.sender is not None
        ts = self.slack.post_as_user(DM, ANN_SLACK, text)["ts"]
        reply = await self.sender.event(self.sender.dm(DM, ANN_SLACK, text, ts=ts))
        assert reply.status == 200, reply.text

    def texts(self) -> list[str]:
        """What the bot said (prompts left out)."""
        if self.tg is not None:
            return [m.text for m in self.tg.bot_messages(PRIVATE) if m.text and not _is_tg_prompt(m)]
        assert self.slack is not None
        return [m.get("text", "") for m in slack_bot_messages(self.slack, DM) if not m.get("blocks")]

    def prompts(self) -> list[Any]:
        if self.tg is not None:
            return [copy.deepcopy(m) for m in self.tg.bot_messages(PRIVATE) if m.buttons]
        assert self.slack is not None
        return [copy.deepcopy(m) for m in slack_bot_messages(self.slack, DM) if slack_buttons(m)]

    def prompt_text(self, prompt: Any) -> str:
        if self.tg is not None:
            return prompt.text
        return " ".join(
            b.get("text", {}).get("text", "") for b in prompt.get("blocks") or [] if b.get("type") == "section"
        )

    async def press(self, prompt: Any, label: str) -> None:
        if self.tg is not None:
            self.tg.press(PRIVATE, prompt.message_id, button(prompt, label), user_id=PRIVATE)
            return
        assert self.sender is not None
        target = next(b for b in slack_buttons(prompt) if label in b["text"]["text"])
        reply = await self.sender.block_action(
            user=ANN_SLACK, channel=DM, message_ts=prompt["ts"], value=target["value"], action_id=target["action_id"]
        )
        assert reply.status == 200, reply.text

    async def wait(self, condition: Callable[[], bool], timeout: float = 15.0) -> None:
        """Wait for something visible (while other work may still run)."""
        await until(condition, timeout)

    async def settle(self, condition: Callable[[], bool], timeout: float = 15.0) -> None:
        await until(condition, timeout)
        await self.gateway.inbox.wait_until_idle(timeout)


def _is_tg_prompt(message: Any) -> bool:
    return bool(message.buttons) or "Approval required" in message.text or message.text.startswith("❓")


def chat_config(kind: str, llm: FakeLLM, fake: Any, tmp_path, **sections: Any):  # noqa: ANN001, ANN201
    if kind == "telegram":
        return tg_config(llm, fake, tmp_path, **sections)
    return slack_config(llm, fake, tmp_path, **sections)


@contextlib.asynccontextmanager
async def open_chat(kind: str, store: Store, config, fake: Any) -> AsyncIterator[Chat]:  # noqa: ANN001
    llm = LLMClient(config.llm, backoff_base_s=0.01)
    gateway = Gateway(config, store=store, llm=llm, serve_http=kind == "slack")
    if kind == "telegram":
        gateway.channels["telegram"].poll_backoff_s = 0.05  # type: ignore[attr-defined]
    await gateway.start()
    try:
        if kind == "telegram":
            yield Chat(kind, gateway, tg=fake)
        else:
            assert gateway.http is not None
            url = f"http://127.0.0.1:{gateway.http.port}/slack/events"
            async with SlackEventSender(url, SIGNING_SECRET, team_id=fake.team_id) as sender:
                yield Chat(kind, gateway, slack=fake, sender=sender)
    finally:
        await gateway.stop()
        await llm.aclose()


@contextlib.asynccontextmanager
async def platform(kind: str) -> AsyncIterator[Any]:
    if kind == "telegram":
        async with FakeTelegram() as tg:
            yield tg
    else:
        async with FakeSlack() as slack:
            yield slack
