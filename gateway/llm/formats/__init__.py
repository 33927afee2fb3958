"""The wire formats a model server may speak, one adapter each, behind one small protocol.

The turn loop knows one shape of conversation: OpenAI Chat Completions messages (system, user
with text or image parts, assistant with `tool_calls`, tool results), OpenAI function tools, and
the stream events of gateway/llm/events.py. An adapter translates that shape into its API's
request and decodes its API's stream back into those events; the client (gateway/llm/client.py)
does the rest the same way for every API: the pool, retries, fallback (to a model on another
API too, inside one turn), the spend caps, the read cadence.

An adapter (`WireFormat`) is an object with:

- `name`: the value of `api:` that selects it (`llm.api`, `llm.models.<name>.api`);
- `path`: appended to the server's base URL (`/chat/completions`, `/responses`, `/messages`);
- `limit_key`: the body's key for the reply's token limit (`max_tokens`, `max_output_tokens`),
  read by the spend caps; when the body has none, the client builds it again with the limit the
  reservation covers;
- `headers(api_key)`: every header of a request (auth and version; JSON in, SSE out), set once
  on the server's HTTP clients;
- `body(request)`: the JSON body without `model` (the client puts `model` first), from a
  `Request`: the turn's messages, the tools, and the options (reply limit, temperature, the
  model's `reasoning` level, the session's cache key when the model takes one);
- `parser()`: a fresh `StreamParser` for one response; its `feed(payload)` takes one decoded
  SSE `data:` JSON object (the SSE decoder has already raised a mid-stream `error` through
  `classify`) and returns the events it means; `finished` is true once the answer is complete
  (a stream that ends before is a `StreamInterrupted`, retried while nothing was yielded);
- `classify(status, body, headers)`: an error answer (or a mid-stream error, status None) as a
  typed `LLMError` (gateway/llm/errors.py: retryable or not, `RateLimited.retry_after`).

What an API needs carried from one round to the next of a turn (Anthropic's signed thinking
blocks, Responses' encrypted reasoning items) travels opaquely: the parser emits a `Replay`
event (`api`, `data`: JSON) once per answer; the turn stores it with the assistant message and
gives it back on that message under `REPLAY_KEY` while the turn lasts, as `{"api": ..., "data":
...}`. An adapter uses the replay of its own `api` and ignores (drops) the others; every adapter
must leave `REPLAY_KEY` out of what it sends.

To add a format: a module here with the class (taking `Request`, `REPLAY_KEY` and `replay_of` from
`gateway.llm.formats.base`, since this registry imports the adapters), and its line in `_formats`.
"""

from __future__ import annotations

from gateway.config.core import Api
from gateway.llm.formats.base import REPLAY_KEY, Request, StreamParser, WireFormat, replay_of

__all__ = ["REPLAY_KEY", "Request", "StreamParser", "WireFormat", "format_for", "replay_of"]


def _formats() -> dict[str, WireFormat]:
    from gateway.llm.formats.anthropic import AnthropicFormat
    from gateway.llm.formats.chat import ChatFormat
    from gateway.llm.formats.responses import ResponsesFormat

    return {"chat": ChatFormat(), "anthropic": AnthropicFormat(), "responses": ResponsesFormat()}


_FORMATS: dict[str, WireFormat] = {}


def format_for(api: Api | str) -> WireFormat:
    """The adapter of `api`; a ValueError names the ones there are."""
    if not _FORMATS:
        _FORMATS.update(_formats())
    try:
        return _FORMATS[api]
    except KeyError:
        raise ValueError(f"llm api {api!r} has no adapter (there are: {', '.join(sorted(_FORMATS))})") from None
