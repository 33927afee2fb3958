"""`/model`: the models a person's role may use, and the switch of a private chat's session or
of one person's model in a shared chat; the check of a turn's model as it starts."""

from __future__ import annotations

from gateway.access import AccessPolicy
from gateway.access.models import ModelChoice, chosen_model, shared
from gateway.agent.messages import acting_person
from gateway.config import DEFAULT_MODEL, LLMConfig, ModelPrice
from gateway.delivery.outbox import Outbox
from gateway.events import ThreadKey
from gateway.store import InboxItem, SessionRecord, Store
from gateway.store.items import Said


def price_text(price: ModelPrice | None) -> str:
    """"$0.15 in, $0.60 out, $0.075 cache read per million tokens"; "no price" when there is none."""
    if price is None or not price.for_tokens:
        return "no price (llm.prices)"
    parts = [f"{_usd(price.input)} in", f"{_usd(price.output)} out"]
    if price.cache_read is not None:
        parts.append(f"{_usd(price.cache_read)} cache read")
    if price.cache_write is not None:
        parts.append(f"{_usd(price.cache_write)} cache write")
    return ", ".join(parts) + " per million tokens"


def _usd(value: float | None) -> str:
    """$0.60, $2.50; a price with more digits keeps them ($0.075)."""
    value = value or 0.0
    return f"${value:.2f}" if round(value * 100, 9).is_integer() else f"${value:g}"


def model_line(llm: LLMConfig, name: str | None) -> str:
    """The model a person's turns use here (`ModelCommand.for_person`), as /status and /cost show it."""
    return f"Model: {describe(llm, name)}; {price_text(llm.price_of(llm.ref(name)))}"


def describe(llm: LLMConfig, name: str | None) -> str:
    """`fast (gpt-4o-mini)`, `default (qwen2.5:7b-instruct)`."""
    if name is None or name not in llm.models:
        return f"{DEFAULT_MODEL} ({llm.model})"
    return f"{name} ({llm.models[name].model})"


def refused_text(llm: LLMConfig, role: str, choice: ModelChoice) -> str:
    """Told once when a person's own /model is one their role no longer allows."""
    return (
        f"⚠️ Your role ({role}) may not use the model {choice.refused} any more: your turns here use "
        f"{describe(llm, choice.name)}. /model lists the models you may use."
    )


class ModelCommand:
    """`/model`: in a private chat it switches the session; in a shared chat (a group, a topic,
    a Slack channel) it sets the model of the person who sent it, for this session."""

    def __init__(self, store: Store, llm: LLMConfig, access: AccessPolicy | None, outbox: Outbox | None = None):
        self.store = store
        self.llm = llm
        self.access = access
        self.outbox = outbox

    def allowed(self, channel: str, sender: str) -> list[str]:
        """The named models this person's role may switch to (the default always)."""
        if self.access is None:
            return list(self.llm.models)
        return [name for name in self.llm.models if self.access.model_allowed(channel, sender, name)]

    def for_person(self, session: SessionRecord | None, channel: str, sender: str) -> str | None:
        """The model this person's next turn here runs on (a name of llm.models; None: the default)."""
        if session is None:
            return None
        return chosen_model(self.llm, self.access, session, sender, (channel, sender)).name

    async def for_turn(
        self, thread: ThreadKey, session: SessionRecord, item: InboxItem, on_behalf_of: str
    ) -> ModelChoice:
        """The model of the turn `item` starts, as its person's role allows it now (the turn
        itself logs every replacement)."""
        said = Said.of(item)
        acting = acting_person(thread.channel, said.sender.id, on_behalf_of)
        choice = chosen_model(self.llm, self.access, session, said.sender.id, acting)
        if choice.own and said.sender.id:
            await self._forget(thread, session, item, choice, acting)
        return choice

    async def _forget(
        self, thread: ThreadKey, session: SessionRecord, item: InboxItem, choice: ModelChoice, acting: tuple[str, str]
    ) -> None:
        """A person's own choice their role no longer allows is forgotten, and they are told once."""
        said = Said.of(item)
        if shared(session):
            await self.store.sessions.set_person_model(session.id, said.sender.id, None)
        else:
            await self.store.sessions.set_model(session.id, None)
        if self.outbox is not None:
            role = self.access.role_name(*acting) if self.access is not None else "?"
            text = refused_text(self.llm, role, choice)
            await self.outbox.send_text(thread, text, key=f"model:{item.id}", reply_to=said.message_id)

    async def answer(self, session: SessionRecord, channel: str, sender: str, args: str) -> str:
        wanted = args.strip()
        allowed = self.allowed(channel, sender)
        per_person = shared(session) and bool(sender)  # the sender's own choice, not the session's
        if not wanted:
            return self._listing(self.for_person(session, channel, sender), allowed, per_person)
        if wanted.lower() == DEFAULT_MODEL:
            await self._switch(session, sender, None, per_person)
            price = price_text(self.llm.price_of(self.llm.model))
            if per_person:
                return f"You now use the {describe(self.llm, None)} model in this chat: {price}."
            return f"This session now uses the {describe(self.llm, None)} model: {price}."
        choices = ", ".join([DEFAULT_MODEL, *allowed])
        if wanted not in self.llm.models:
            return f"There is no model {wanted!r}. Models you may use: {choices}."
        if wanted not in allowed:
            role = self.access.role_name(channel, sender) if self.access is not None else "?"
            return f"Your role ({role}) may not use the model {wanted}. Models you may use: {choices}."
        await self._switch(session, sender, wanted, per_person)
        price = price_text(self.llm.price_of(wanted))
        if per_person:
            return f"You now use {describe(self.llm, wanted)} in this chat (the others keep theirs): {price}."
        return f"This session now uses {describe(self.llm, wanted)}: {price}."

    async def _switch(self, session: SessionRecord, sender: str, name: str | None, per_person: bool) -> None:
        """A shared chat's choice is the sender's own ("default" too: the session's model is not
        theirs); a private chat's is the session's."""
        if per_person:
            await self.store.sessions.set_person_model(session.id, sender, name or DEFAULT_MODEL)
        else:
            await self.store.sessions.set_model(session.id, name)

    def _listing(self, current: str | None, allowed: list[str], per_person: bool) -> str:
        if per_person:
            head = f"You use {describe(self.llm, current)} in this chat; each person here picks their own."
        else:
            head = f"This session uses {describe(self.llm, current)}."
        lines = [head, "Models you may use:"]
        for name in [None, *allowed]:
            mark = "✓" if name == current else "•"
            ref = self.llm.ref(name)
            lines.append(f"{mark} {describe(self.llm, name)}: {price_text(self.llm.price_of(ref))}")
        lines.append("Switch with /model NAME; /model default goes back.")
        return "\n".join(lines)
