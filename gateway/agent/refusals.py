"""What a turn does when the model server refuses a request or breaks off an answer.

- A context-too-long refusal, or an empty answer to the same body twice (llama.cpp's way of
  refusing a prompt over its context) while the request was near the window: shrink once
  (the builder learns from the refusal) and send again; a second refusal ends the turn. When
  the turn's own new message is what does not fit, it is set aside (excluded from the context,
  kept in the database) so the next message works.
- An empty answer twice far from the window: the server refuses this conversation (a template
  error, usually); the turn ends naming the server's reason where it gave one.
- A stream that fails after text was shown: the shown text is finished with a note that it was
  cut off, never retried into a second copy.
"""

from __future__ import annotations

from gateway.llm import LLMError

NEAR_WINDOW = 0.5  # estimates err by this much: a refused request this near the target may be too long
TOO_LONG = (
    "⚠️ Your message is too long for the model's context window{window}, so I set it aside. "
    "Please send it shorter or in parts."
)
REFUSED = (
    "⚠️ The model server refused this conversation: {reason}. Nothing was lost; "
    "check the server's log and the model's chat template (docs/model-servers.md)."
)
CUT_OFF = "⚠️ The model's answer was cut off ({reason})."


def near_window(estimated_tokens: int, target: int) -> bool:
    """A refused request that could be over the window: unbudgeted requests never are known to be."""
    return target > 0 and estimated_tokens >= target * NEAR_WINDOW


def too_long_message(window: int | None) -> str:
    return TOO_LONG.format(window=f" ({window:,} tokens)" if window else "")


def refused_message(error: LLMError) -> str:
    return REFUSED.format(reason=_short(error.message))


def cut_off_text(shown: str, error: LLMError) -> str:
    return f"{shown.rstrip()}\n\n{CUT_OFF.format(reason=_short(error.message))}"


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
