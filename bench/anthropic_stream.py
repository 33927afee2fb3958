"""CPU per streamed token of the Anthropic Messages decoder, against the official SDK's stream parser.

    .venv/bin/python bench/anthropic_stream.py                       # 5 runs of 4,000 tokens
    PYTHONPATH=~/.cache/gateway-tests/anthropic-sdk-2.17.0 .venv/bin/python bench/anthropic_stream.py

One answer as the API streams it (message_start, a ping, a thinking block, one text_delta per
token, a tool_use whose input comes in 40 input_json_delta fragments, message_delta with the
usage, message_stop), cut into 4 KiB network reads, decoded:

- "ours": the SSE decoder and `MessageParser` (gateway/llm/formats/anthropic.py), as the client
  reads a stream;
- "ours, client": the whole `LLMClient.stream` in `api: anthropic` through httpx (a mock
  transport, no socket), as a turn reads it;
- "sdk raw": `AsyncAnthropic().messages.create(stream=True)` over the same bytes (a mock transport
  of its HTTP library, no socket), iterating its typed events;
- "sdk stream": the SDK's `messages.stream()` helper, which also accumulates the message.

The SDK is not a dependency: install it outside the clone to compare (`pip download anthropic`,
then `pip install --target ~/.cache/gateway-tests/anthropic-sdk-2.17.0 --no-deps` its wheel and
docstring_parser, jiter, sniffio, httpx2, httpcore2). Prints microseconds of CPU per token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from gateway.config import LLMConfig  # noqa: E402
from gateway.llm import LLMClient  # noqa: E402
from gateway.llm.formats.anthropic import AnthropicFormat  # noqa: E402
from gateway.llm.stream import SSEDecoder  # noqa: E402

READ_BYTES = 4096


def event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


def answer(tokens: int) -> bytes:
    usage = {"input_tokens": 900, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4000, "output_tokens": 1}
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "claude-bench",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    parts = [event("message_start", message=message), event("ping")]
    parts.append(
        event("content_block_start", index=0, content_block={"type": "thinking", "thinking": "", "signature": ""})
    )
    parts += [
        event("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "hm "}) for _ in range(20)
    ]
    parts.append(event("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "sig" * 40}))
    parts.append(event("content_block_stop", index=0))
    parts.append(event("content_block_start", index=1, content_block={"type": "text", "text": ""}))
    parts += [
        event("content_block_delta", index=1, delta={"type": "text_delta", "text": "tok "}) for _ in range(tokens)
    ]
    parts.append(event("content_block_stop", index=1))
    start = {"type": "tool_use", "id": "toolu_1", "name": "clock", "input": {}}
    parts.append(event("content_block_start", index=2, content_block=start))
    parts += [
        event(
            "content_block_delta",
            index=2,
            delta={"type": "input_json_delta", "partial_json": '{"a": 1' if i == 0 else ""},
        )
        for i in range(40)
    ]
    parts.append(event("content_block_delta", index=2, delta={"type": "input_json_delta", "partial_json": "}"}))
    parts.append(event("content_block_stop", index=2))
    parts.append(
        event(
            "message_delta",
            delta={"stop_reason": "tool_use", "stop_sequence": None},
            usage={"output_tokens": tokens + 60},
        )
    )
    parts.append(event("message_stop"))
    return b"".join(parts)


def reads(body: bytes) -> list[bytes]:
    return [body[i : i + READ_BYTES] for i in range(0, len(body), READ_BYTES)]


async def chunks_of(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def ours(chunks: list[bytes]) -> int:
    wire = AnthropicFormat()
    sse, parser = SSEDecoder(chunks_of(chunks), wire.classify), wire.parser()
    events = 0
    while (payload := await sse.next()) is not None:
        events += len(parser.feed(payload))
    assert parser.finished
    return events


async def ours_client(chunks: list[bytes]) -> int:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=chunks_of(chunks))

    config = LLMConfig(base_url="http://bench.invalid/v1", model="m", api="anthropic", api_key="k")
    async with LLMClient(config, transport=httpx.MockTransport(handler)) as client:
        events = 0
        async for _ in client.stream([{"role": "user", "content": "hi"}]):
            events += 1
        return events


def sdk_client(chunks: list[bytes]) -> Any:
    import anthropic
    import httpx2

    async def handler(request: Any) -> Any:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=b"".join(chunks))

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    return anthropic.AsyncAnthropic(api_key="k", base_url="http://bench", http_client=http, max_retries=0)


async def sdk_raw(chunks: list[bytes]) -> int:
    client = sdk_client(chunks)
    events = 0
    stream = await client.messages.create(
        model="claude-bench", max_tokens=10, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    async for _ in stream:
        events += 1
    return events


async def sdk_stream(chunks: list[bytes]) -> int:
    client = sdk_client(chunks)
    events = 0
    async with client.messages.stream(
        model="claude-bench", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        async for _ in stream:
            events += 1
        await stream.get_final_message()
    return events


async def cpu_per_token(way: Callable[[list[bytes]], Awaitable[int]], tokens: int, runs: int) -> list[float]:
    chunks = reads(answer(tokens))
    await way(chunks)  # warm up
    timings = []
    for _ in range(runs):
        started = time.process_time()
        await way(chunks)
        timings.append((time.process_time() - started) / tokens * 1e6)
    return timings


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    ways: list[tuple[str, Callable[[list[bytes]], Awaitable[int]]]] = [("ours", ours), ("ours, client", ours_client)]
    try:
        import anthropic

        ways += [(f"sdk raw {anthropic.__version__}", sdk_raw), (f"sdk stream {anthropic.__version__}", sdk_stream)]
    except ImportError:
        print("(the anthropic SDK is not importable: only our decoder is measured)")
    print(f"Anthropic Messages, {args.tokens} tokens, {args.runs} runs: µs of CPU per token (best, median)")
    for name, way in ways:
        timings = await cpu_per_token(way, args.tokens, args.runs)
        print(f"  {name:<22} {min(timings):7.2f} {statistics.median(timings):7.2f}")


if __name__ == "__main__":
    asyncio.run(main())
