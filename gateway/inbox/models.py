"""`/model`: the models a person's role may use, and the switch of this session's model."""

from __future__ import annotations

from gateway.access import AccessPolicy
from gateway.config import DEFAULT_MODEL, LLMConfig, ModelPrice
from gateway.store import SessionRecord, Store


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


def model_line(llm: LLMConfig, session: SessionRecord | None) -> str:
    """The model a session uses, as /status and /cost show it."""
    name = session.model if session is not None and session.model in llm.models else None
    ref = llm.ref(name)
    return f"Model: {describe(llm, name)}; {price_text(llm.price_of(ref))}"


def describe(llm: LLMConfig, name: str | None) -> str:
    """`fast (gpt-4o-mini)`, `default (qwen2.5:7b-instruct)`."""
    if name is None or name not in llm.models:
        return f"{DEFAULT_MODEL} ({llm.model})"
    return f"{name} ({llm.models[name].model})"


class ModelCommand:
    def __init__(self, store: Store, llm: LLMConfig, access: AccessPolicy | None):
        self.store = store
        self.llm = llm
        self.access = access

    def allowed(self, channel: str, sender: str) -> list[str]:
        """The named models this person's role may switch to (the default always)."""
        if self.access is None:
            return list(self.llm.models)
        return [name for name in self.llm.models if self.access.model_allowed(channel, sender, name)]

    async def answer(self, session: SessionRecord, channel: str, sender: str, args: str) -> str:
        wanted = args.strip()
        allowed = self.allowed(channel, sender)
        if not wanted:
            return self._listing(session, allowed)
        if wanted.lower() == DEFAULT_MODEL:
            await self.store.sessions.set_model(session.id, None)
            price = price_text(self.llm.price_of(self.llm.model))
            return f"This session now uses the {describe(self.llm, None)} model: {price}."
        choices = ", ".join([DEFAULT_MODEL, *allowed])
        if wanted not in self.llm.models:
            return f"There is no model {wanted!r}. Models you may use: {choices}."
        if wanted not in allowed:
            role = self.access.role_name(channel, sender) if self.access is not None else "?"
            return f"Your role ({role}) may not use the model {wanted}. Models you may use: {choices}."
        await self.store.sessions.set_model(session.id, wanted)
        return f"This session now uses {describe(self.llm, wanted)}: {price_text(self.llm.price_of(wanted))}."

    def _listing(self, session: SessionRecord, allowed: list[str]) -> str:
        current = session.model if session.model in self.llm.models else None
        lines = [f"This session uses {describe(self.llm, current)}.", "Models you may use:"]
        for name in [None, *allowed]:
            mark = "✓" if name == current else "•"
            ref = self.llm.ref(name)
            lines.append(f"{mark} {describe(self.llm, name)}: {price_text(self.llm.price_of(ref))}")
        lines.append("Switch with /model NAME; /model default goes back.")
        return "\n".join(lines)
