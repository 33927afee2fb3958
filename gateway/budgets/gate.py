"""The spend caps, checked before every LLM request.

The client asks `SpendGate.open` before each request it sends (retries, fallbacks, the
compaction summariser's calls too). The gate reserves the call's worst case (the prompt's
bound plus the reply's max tokens, at the model's price) on every counter its caps name, in one
transaction of conditional writes; after the call the reservation is replaced by what the
call used. Who pays is the `current_payer` of the task (the turn sets it).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gateway.budgets.caps import PERIOD_WORDS, AppliedCap, Caps, Payer, current_payer, limit_text, usd_text
from gateway.config import Config
from gateway.llm import Usage
from gateway.llm.gate import BudgetReached
from gateway.llm.pricing import chars_cost, minutes_cost, usage_cost
from gateway.serving import metrics
from gateway.store import AuditEntry, CounterKey, CounterRecord, Refused, Store

log = logging.getLogger(__name__)
Alert = Callable[[str, str], Awaitable[None]]  # (alert key, text) -> tell the admins


def unpriced_text(model: str) -> str:
    return f"The model {model} has no price in llm.prices, so the USD budget cannot be kept; the call was not made."


def unpriced_minutes_text(model: str) -> str:
    return f"the transcription model {model} has no llm.prices.{model}.per_minute, so the USD budget cannot be kept"


def unpriced_chars_text(model: str) -> str:
    return f"the speech model {model} has no llm.prices.{model}.per_million_chars, so the USD budget cannot be kept"


@dataclass
class _Ticket:
    gate: SpendGate
    reservation: int
    model: str
    applied: list[AppliedCap]
    reply_tokens: int | None
    settled: bool = field(default=False)

    async def settle(self, usage: Usage | None, *, sent: bool) -> None:
        if self.settled:
            return
        self.settled = True
        await self.gate.settle(self, usage, sent=sent)


@dataclass
class _MinutesTicket:
    gate: SpendGate
    reservation: int
    model: str
    applied: list[AppliedCap]
    worst: int
    settled: bool = field(default=False)

    async def settle_minutes(self, seconds: float | None, *, sent: bool) -> None:
        if self.settled:
            return
        self.settled = True
        if not sent:
            nano = 0  # refused or unreachable: nothing was heard
        elif seconds is None:
            nano = self.worst  # answered without saying how long: the bound it was reserved at
        else:
            nano = minutes_cost(self.gate.caps.price(self.model), seconds) or 0
        await self.gate._settled(self, nano, 0)


@dataclass
class _CharsTicket:
    gate: SpendGate
    reservation: int
    model: str
    applied: list[AppliedCap]
    settled: bool = field(default=False)

    async def settle_chars(self, chars: int, *, sent: bool) -> None:
        if self.settled:
            return
        self.settled = True
        nano = (chars_cost(self.gate.caps.price(self.model), chars) or 0) if sent else 0
        await self.gate._settled(self, nano, 0)


class SpendGate:
    def __init__(self, store: Store, config: Config, *, alert: Alert | None = None):
        self.store = store
        self.config = config
        self.caps = Caps(config)
        self.alert = alert
        self._worst: dict[int, tuple[int, int]] = {}
        self._highest: dict[tuple[str, str], tuple[str, float]] = {}  # (scope, period) -> (period key, share)

    async def open(self, model: str, request_bytes: int, max_tokens: int | None) -> _Ticket | None:
        if not self.caps.any:
            return None
        now = datetime.now(UTC)
        payer = current_payer.get() or Payer()
        priced = self.caps.price(model) is not None
        applied = self.caps.applied(payer, now, usd=priced or self.config.budgets.unpriced == "deny")
        if not applied:
            return None
        if not priced and any(a.limit.nano_usd is not None for a in applied):
            raise BudgetReached(unpriced_text(model))
        reply = max_tokens or self.config.llm.max_tokens or self.config.budgets.reply_tokens
        tokens, nano = self.caps.worst_case(model, request_bytes, reply)
        reservation = await self._reserve(applied, now, nano, tokens)
        self._worst[reservation] = (tokens, nano)
        return _Ticket(self, reservation, model, applied, None if max_tokens else reply)

    async def settle(self, ticket: _Ticket, usage: Usage | None, *, sent: bool) -> None:
        worst_tokens, worst_nano = self._worst.pop(ticket.reservation, (0, 0))
        if not sent:
            tokens, nano = 0, 0  # the request failed before any answer: nothing was spent
        elif usage is None:
            tokens, nano = worst_tokens, worst_nano  # no usage reported: count the worst case
        else:
            tokens = usage.prompt_tokens + usage.completion_tokens
            nano = usage_cost(self.caps.price(ticket.model), usage) or 0  # the same figure as the run's
        await self._settled(ticket, nano, tokens)

    async def open_minutes(self, model: str, seconds: float | None, audio_bytes: int) -> _MinutesTicket | None:
        """A transcription's reservation, at its worst case (see `_reserve_audio`)."""
        price = self.caps.price(model)
        worst = self.caps.worst_minutes(model, seconds, audio_bytes)
        priced = price is not None and price.per_minute is not None
        reserved = await self._reserve_audio(priced, worst, unpriced_minutes_text(model))
        return _MinutesTicket(self, reserved[0], model, reserved[1], worst) if reserved else None

    async def open_chars(self, model: str, chars: int) -> _CharsTicket | None:
        """A speech request's reservation, at its text's price: known before the call."""
        price = self.caps.price(model)
        priced = price is not None and price.per_million_chars is not None
        reserved = await self._reserve_audio(priced, chars_cost(price, chars) or 0, unpriced_chars_text(model))
        return _CharsTicket(self, reserved[0], model, reserved[1]) if reserved else None

    async def _reserve_audio(self, priced: bool, nano: int, unpriced: str) -> tuple[int, list[AppliedCap]] | None:
        """An audio request's reservation (a transcription, speech): `nano` in USD, and one
        token, so that a token cap already used up refuses it too (settled at no tokens). None
        when nothing caps the payer; `BudgetReached` (`unpriced`) for an unpriced model under a
        USD cap."""
        if not self.caps.any:
            return None
        now = datetime.now(UTC)
        payer = current_payer.get() or Payer()
        applied = self.caps.applied(payer, now, usd=priced or self.config.budgets.unpriced == "deny")
        if not applied:
            return None
        if not priced and any(a.limit.nano_usd is not None for a in applied):
            raise BudgetReached(unpriced)
        return await self._reserve(applied, now, nano, 1), applied

    async def _reserve(self, applied: list[AppliedCap], now: datetime, nano: int, tokens: int) -> int:
        """The reservation's id, or `BudgetReached` when a counter has no room."""
        result = await self.store.budgets.reserve(
            self.caps.merged(applied), nano_usd=nano, tokens=tokens, ttl_s=self.config.budgets.reservation_ttl
        )
        if isinstance(result, Refused):
            cap = next(a.cap for a in applied if a.key == result.limit.key)
            if result.counter is not None:
                await self._alert_reached(cap, result.counter)
            raise BudgetReached(self.caps.reached_text(cap, now))
        return result.id

    async def _settled(self, ticket: _Ticket | _MinutesTicket | _CharsTicket, nano: int, tokens: int) -> None:
        try:
            counters = await self.store.budgets.settle(ticket.reservation, nano_usd=nano, tokens=tokens)
        except Exception:  # noqa: BLE001 - the reservation stays and is counted in full by the sweep
            log.exception("could not settle budget reservation %s", ticket.reservation)
            return
        by_key = {CounterKey(c.scope, c.subject, c.period, c.period_key): c for c in counters}
        for scope in {applied.cap.scope for applied in ticket.applied}:
            metrics.BUDGET_SPENT.labels(scope).inc(nano / 1e9)
        for applied in ticket.applied:
            counter = by_key.get(applied.key)
            if counter is not None:
                self._show_use(applied, counter)
                await self._alert_share(applied, counter)

    def _show_use(self, applied: AppliedCap, counter: CounterRecord) -> None:
        """The use gauge of the cap's kind and period: the highest share a payer of that kind
        has used in the current period (a new period starts from the first payer's share)."""
        label = (counter.scope, counter.period)
        period_key, highest = self._highest.get(label, ("", 0.0))
        share = _share(applied, counter)
        if period_key != counter.period_key or share > highest:
            self._highest[label] = (counter.period_key, share)
            metrics.BUDGET_USE.labels(*label).set(share)

    async def room_for_job(self, schedule_id: int) -> str | None:
        """Why a scheduled run must not start (a cap of the job, or everyone's, is used up);
        None when there is room."""
        if not self.caps.any:
            return None
        now = datetime.now(UTC)
        applied = self.caps.applied(Payer(job=str(schedule_id)), now)
        counters = await self.store.budgets.counters([a.key for a in applied])
        for item in applied:
            counter = counters.get(item.key)
            if counter is not None and _used_up(item, counter):
                await self._alert_reached(item.cap, counter)
                return self.caps.reached_text(item.cap, now)
        return None

    # ---- alerts ----------------------------------------------------------------------------
    async def _alert_share(self, applied: AppliedCap, counter: CounterRecord) -> None:
        share = _share(applied, counter)
        crossed = [t for t in sorted(self.config.budgets.alert_at) if share >= t]
        if not crossed or self.alert is None:
            return
        permille = round(crossed[-1] * 1000)
        audit = _audit("alert", counter, applied.cap, permille)
        if await self.store.budgets.claim_alert(counter.id, permille, audit=audit):
            await self._send(
                applied.cap.scope,
                counter,
                f"💸 Budget alert: {_who(counter)} has used {share:.0%} of the "
                f"{PERIOD_WORDS[applied.cap.period].lower()} cap ({limit_text(applied.cap)}): {_used(counter)}.",
                permille,
            )

    async def _alert_reached(self, cap, counter: CounterRecord) -> None:  # noqa: ANN001
        if self.alert is not None and await self.store.budgets.claim_alert(
            counter.id, 1000, audit=_audit("reached", counter, cap, 1000)
        ):
            await self._send(
                cap.scope,
                counter,
                f"💸 Budget reached: {_who(counter)} hit the {PERIOD_WORDS[cap.period].lower()} cap "
                f"({limit_text(cap)}): "
                f"{_used(counter)}. Calls are refused until the period ends.",
                1000,
            )

    async def _send(self, scope: str, counter: CounterRecord, text: str, permille: int) -> None:
        try:
            await self.alert(f"budget:{counter.id}:{permille}", text)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - an alert must not fail the call
            log.exception("could not send the budget alert for %s %s", scope, counter.subject)

    async def sweep(self) -> int:
        """Count reservations whose call never settled (housekeeping; nothing to do without caps)."""
        return await self.store.budgets.sweep() if self.caps.any else 0


def _share(applied: AppliedCap, counter: CounterRecord) -> float:
    shares = []
    if applied.limit.nano_usd:
        shares.append(counter.used_nano_usd / applied.limit.nano_usd)
    if applied.limit.tokens:
        shares.append(counter.used_tokens / applied.limit.tokens)
    return max(shares, default=0.0)


def _audit(action: str, counter: CounterRecord, cap, permille: int) -> AuditEntry:  # noqa: ANN001
    """The trail's row of a budget alert: whose counter, which cap and share, the use then."""
    return AuditEntry(
        kind="budget_alert",
        action=action,
        actor=counter.subject or None,
        detail={
            "scope": counter.scope, "period": counter.period, "period_key": counter.period_key,
            "share": permille / 1000, "cap": limit_text(cap),
            "used_nano_usd": counter.used_nano_usd, "used_tokens": counter.used_tokens,
        },
    )


def _who(counter: CounterRecord) -> str:
    if counter.scope == "global":
        return "the assistant"
    return f"{counter.scope} {counter.subject}"


def _used(counter: CounterRecord) -> str:
    tokens = f"{counter.used_tokens:,} tokens"
    return f"{usd_text(counter.used_nano_usd)}, {tokens} this {counter.period} ({counter.period_key})"


def _used_up(applied: AppliedCap, counter: CounterRecord) -> bool:
    limit = applied.limit
    if limit.nano_usd is not None and counter.used_nano_usd + counter.reserved_nano_usd >= limit.nano_usd:
        return True
    return limit.tokens is not None and counter.used_tokens + counter.reserved_tokens >= limit.tokens
