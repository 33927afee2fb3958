"""What a call cost: the provider's own figure when it sends one, else its tokens at the model's
prices (cache reads and writes at theirs); a transcription by the minute; speech by the character. Integer nano-USD, so
sums are exact; None when there is no price (unpriced, not free)."""

from __future__ import annotations

import math

from gateway.config import ModelPrice
from gateway.llm.events import Usage

NANO_PER_USD = 1_000_000_000


def usage_cost(price: ModelPrice | None, usage: Usage) -> int | None:
    if usage.cost_usd is not None:
        return round(usage.cost_usd * NANO_PER_USD)
    if price is None or not price.for_tokens:
        return None
    assert price.input is not None and price.output is not None
    read_price = price.cache_read if price.cache_read is not None else price.input
    write_price = price.cache_write if price.cache_write is not None else price.input
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    written = min(usage.cache_write_tokens, usage.prompt_tokens - cached)
    fresh = usage.prompt_tokens - cached - written
    # prices are USD per million tokens
    total = fresh * price.input + cached * read_price + written * write_price + usage.completion_tokens * price.output
    return round(total * NANO_PER_USD / 1_000_000)


def worst_case_cost(price: ModelPrice | None, prompt_tokens: int, reply_tokens: int) -> int:
    """The most a call can cost: every prompt token fresh, the whole reply."""
    if price is None or not price.for_tokens:
        return 0
    assert price.input is not None and price.output is not None
    return math.ceil((prompt_tokens * price.input + reply_tokens * price.output) * NANO_PER_USD / 1_000_000)


def minutes_cost(price: ModelPrice | None, seconds: float) -> int | None:
    """A transcription: its audio's length at `per_minute` (billed by the second, as OpenAI does)."""
    if price is None or price.per_minute is None:
        return None
    return round(max(seconds, 0.0) / 60 * price.per_minute * NANO_PER_USD)


def chars_cost(price: ModelPrice | None, chars: int) -> int | None:
    """Speech: the characters of its text at `per_million_chars` (OpenAI bills speech so)."""
    if price is None or price.per_million_chars is None:
        return None
    return round(max(chars, 0) * price.per_million_chars * NANO_PER_USD / 1_000_000)
