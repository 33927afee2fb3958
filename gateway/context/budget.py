"""Token estimates and the budget: chars/3 rounded up, corrected per model, minus a reserve.

The estimate must err high: an estimate that is too low lets a request through that the provider
then refuses mid-turn. Each model keeps a correction factor (real / estimated prompt tokens,
never below 1) learned from reported usage and from refusals; a refusal may also teach the real
window. A window of 0 means unbudgeted: nothing is ever truncated or folded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from gateway.llm.formats.base import REPLAY_KEY

CHARS_PER_TOKEN = 3
MESSAGE_OVERHEAD_CHARS = 12  # role, separators and template tokens around each message
IMAGE_PART_CHARS = (85 + 170 * 6) * CHARS_PER_TOKEN  # 6 tiles (a 3:2 photo, 1152x768 by OpenAI's rule), as chars
REFUSAL_SHRINK = 1.2  # a refusal that gave no numbers still means "smaller next time"
# Shaping goes down to this share of the conversation's room when it has to start (at the
# target): the prefix then grows untouched for a while before the next change (hysteresis).
LOW_WATER = 0.5


def estimate_tokens(chars: int) -> int:
    return math.ceil(max(chars, 0) / CHARS_PER_TOKEN)


def message_chars(message: dict[str, Any]) -> int:
    """Characters one chat message costs: content, tool-call ids, names and arguments."""
    content = message.get("content") or ""
    chars = MESSAGE_OVERHEAD_CHARS + (len(content) if isinstance(content, str) else parts_chars(content))
    for call in message.get("tool_calls") or ():
        function = call["function"]
        chars += len(call["id"]) + len(function["name"]) + len(function["arguments"]) + MESSAGE_OVERHEAD_CHARS
    if "tool_call_id" in message:
        chars += len(message["tool_call_id"])
    if (replay := message.get(REPLAY_KEY)) is not None:  # a turn's thinking is read again by its next rounds
        chars += len(json.dumps(replay, ensure_ascii=False))
    return chars


def parts_chars(parts: list[dict[str, Any]]) -> int:
    """Content parts: their text, and `IMAGE_PART_CHARS` per image (the estimate of an image of
    unknown size; the context builder counts the images it attaches by their pixel size)."""
    return sum(len(p.get("text") or "") if p.get("type") == "text" else IMAGE_PART_CHARS for p in parts)


def messages_chars(messages: list[dict[str, Any]]) -> int:
    return sum(message_chars(m) for m in messages)


@dataclass(frozen=True)
class Budget:
    """Where shaping starts (`target`) and the hard limit (`budget`), in estimated tokens.
    `fixed_chars`: what every request carries besides its messages (the tools' schemas),
    counted in every fit."""

    window: int
    budget: int
    target: int
    factor: float
    fixed_chars: int = 0

    @property
    def unbudgeted(self) -> bool:
        return self.window <= 0

    def tokens(self, chars: int) -> int:
        return math.ceil(estimate_tokens(chars) * self.factor)

    def fits(self, chars: int) -> bool:
        return self.unbudgeted or self.tokens(chars + self.fixed_chars) <= self.target

    def within(self, chars: int, limit: int) -> bool:
        """Whether a request of `chars` (besides the tools) takes at most `limit` tokens."""
        return self.unbudgeted or self.tokens(chars + self.fixed_chars) <= limit

    @property
    def low_water(self) -> int:
        """Where shaping stops once it started: `LOW_WATER` of the room the target leaves the
        conversation besides the tools."""
        fixed = self.tokens(self.fixed_chars) if self.fixed_chars else 0
        return fixed + math.floor(max(self.target - fixed, 0) * LOW_WATER)

    def with_fixed(self, chars: int) -> Budget:
        """The budget of requests that also carry `chars` of tools: the headroom stays the
        conversation's, the hard limit counts them too."""
        if self.unbudgeted or chars <= 0:
            return self
        target = min(self.target + self.tokens(chars), self.budget)
        return Budget(self.window, self.budget, target, self.factor, chars)


def make_budget(window: int, reserve_pct: float, headroom: int, factor: float = 1.0) -> Budget:
    if window <= 0:
        return Budget(0, 0, 0, factor)
    budget = max(1, math.floor(window * (100 - reserve_pct) / 100))
    target = budget - headroom if 0 < headroom < budget else budget
    return Budget(window, budget, target, factor)


@dataclass
class ModelCorrection:
    factor: float = 1.0
    window: int = 0  # learned from a refusal; 0 = use the configured window


class Corrections:
    """Per-model correction factors and learned windows (in memory; relearned after a restart)."""

    def __init__(self) -> None:
        self._models: dict[str, ModelCorrection] = {}

    def get(self, model: str) -> ModelCorrection:
        return self._models.setdefault(model, ModelCorrection())

    def observe(self, model: str, estimated: int, real: int) -> None:
        if estimated <= 0 or real <= 0:
            return
        entry = self.get(model)
        ratio = max(1.0, real / estimated)
        # Rise at once (too low is what gets refused), fall back slowly.
        if ratio >= entry.factor:
            entry.factor = ratio
        else:
            decayed = entry.factor * 0.9 + ratio * 0.1
            entry.factor = ratio if decayed - ratio < 0.001 else decayed

    def refused(self, model: str, estimated: int, prompt_tokens: int | None, window: int | None) -> None:
        entry = self.get(model)
        learned = False
        if prompt_tokens and estimated > 0 and prompt_tokens / estimated > entry.factor:
            entry.factor = prompt_tokens / estimated
            learned = True
        if window and window > 0 and (entry.window <= 0 or window < entry.window):
            entry.window = window
            learned = True
        if not learned:
            entry.factor *= REFUSAL_SHRINK

    def window_for(self, model: str, configured: int) -> int:
        learned = self.get(model).window
        if learned > 0 and (configured <= 0 or learned < configured):
            return learned
        return configured
