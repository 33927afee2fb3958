"""CPU per streamed token of each API's stream decoder, and of the official SDK's where installed.

    .venv/bin/python bench/stream_decoders.py                 # every adapter, 5 runs of 4,000 tokens
    .venv/bin/python bench/stream_decoders.py --tokens 20000 --runs 9
    PYTHONPATH=~/.cache/gateway-tests/openai-sdk-3.63.0 .venv/bin/python bench/stream_decoders.py

One answer as each API streams it (one token per text event, as the hosted APIs send them,
then a tool call whose arguments come in 40 fragments, then the end with usage), cut into
4 KiB network reads, is decoded two ways:

- "decoder": the SSE decoder and the adapter's parser alone, over the bytes in memory;
- "client": the whole `LLMClient.stream` through httpx (a mock transport, no socket), as a
  turn reads it; and, when the `openai` package can be imported, the SDK's own
  `client.responses.create(stream=True)` over the same bytes and the same transport (it parses
  every event into its pydantic models). The SDK is not a dependency: install it outside the
  clone to compare (`pip install --target ~/.cache/gateway-tests/openai-sdk-3.63.0 --no-deps
  openai==3.63.0 distro jiter sniffio tqdm`).

Prints microseconds of CPU per token (process time, the best and the median of the runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from gateway.config import LLMConfig  # noqa: E402
from gateway.llm import LLMClient  # noqa: E402
from gateway.llm.formats import format_for  # noqa: E402
from gateway.llm.stream import SSEDecoder  # noqa: E402

READ_BYTES = 4096
WORD = "tok "
ARGUMENT_FRAGMENTS = 40


# ---- one answer as each API streams it --------------------------------------------------------


def sse(payload: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload)}\n\n".encode()


def chat_stream(tokens: int) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> bytes:
        choices = [{"index": 0, "delta": delta, "finish_reason": finish}] if delta or finish else []
        return sse({"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": choices, "usage": usage})

    parts = [chunk({"role": "assistant", "content": ""})]
    parts += [chunk({"content": WORD}) for _ in range(tokens)]
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "clock", "arguments": ""}}
    parts.append(chunk({"tool_calls": [call]}))
    parts += [
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"x",'}}]}) for _ in range(ARGUMENT_FRAGMENTS)
    ]
    parts.append(chunk({}, "tool_calls"))
    parts.append(chunk({}, usage={"prompt_tokens": 900, "completion_tokens": tokens, "total_tokens": 900 + tokens}))
    return b"".join(parts) + b"data: [DONE]\n\n"


def responses_stream(tokens: int) -> bytes:
    seq = iter(range(10**9))

    def event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, "sequence_number": next(seq), **fields}, kind)

    response = {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": "m",
        "status": "in_progress",
        "output": [],
        "tools": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
    }
    message = {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    text = WORD * tokens
    done_part = {**part, "text": text}
    done_message = {**message, "status": "completed", "content": [done_part]}
    call = {
        "id": "fc_1",
        "type": "function_call",
        "status": "in_progress",
        "call_id": "call_1",
        "name": "clock",
        "arguments": "",
    }
    arguments = '"x",' * ARGUMENT_FRAGMENTS
    done_call = {**call, "status": "completed", "arguments": arguments}
    usage = {
        "input_tokens": 900,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 900 + tokens,
    }
    parts = [
        event("response.created", response=response),
        event("response.in_progress", response=response),
        event("response.output_item.added", output_index=0, item=message),
        event("response.content_part.added", **where, part=part),
    ]
    parts += [event("response.output_text.delta", **where, delta=WORD, logprobs=[]) for _ in range(tokens)]
    parts += [
        event("response.output_text.done", **where, text=text, logprobs=[]),
        event("response.content_part.done", **where, part=done_part),
        event("response.output_item.done", output_index=0, item=done_message),
        event("response.output_item.added", output_index=1, item=call),
    ]
    parts += [
        event("response.function_call_arguments.delta", item_id="fc_1", output_index=1, delta='"x",')
        for _ in range(ARGUMENT_FRAGMENTS)
    ]
    parts += [
        event("response.function_call_arguments.done", item_id="fc_1", output_index=1, arguments=arguments),
        event("response.output_item.done", output_index=1, item=done_call),
        event(
            "response.completed",
            response={**response, "status": "completed", "output": [done_message, done_call], "usage": usage},
        ),
    ]
    return b"".join(parts)


STREAMS: dict[str, Callable[[int], bytes]] = {"chat": chat_stream, "responses": responses_stream}


def reads(body: bytes) -> list[bytes]:
    return [body[i : i + READ_BYTES] for i in range(0, len(body), READ_BYTES)]


async def replay(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


# ---- the ways to decode it ----------------------------------------------------------------------


async def decoder_only(api: str, chunks: list[bytes]) -> int:
    wire = format_for(api)
    decoder, parser = SSEDecoder(replay(chunks), wire.classify), wire.parser()
    count = 0
    while (payload := await decoder.next()) is not None:
        count += len(parser.feed(payload))
    assert parser.finished
    return count


def transport(chunks: list[bytes]) -> httpx.MockTransport:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=replay(chunks))

    return httpx.MockTransport(handler)


async def whole_client(api: str, chunks: list[bytes]) -> int:
    config = LLMConfig(base_url="http://bench.invalid/v1", model="m", api=api)
    async with LLMClient(config, transport=transport(chunks)) as client:
        count = 0
        async for _ in client.stream([{"role": "user", "content": "hi"}]):
            count += 1
        return count


async def openai_sdk(api: str, chunks: list[bytes]) -> int:
    import openai

    http = httpx.AsyncClient(transport=transport(chunks))
    async with openai.AsyncOpenAI(api_key="sk-bench", base_url="http://bench.invalid/v1", http_client=http) as sdk:
        count = 0
        if api == "responses":
            stream = await sdk.responses.create(model="m", input="hi", stream=True)
        else:
            stream = await sdk.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        async for _ in stream:
            count += 1
        return count


def sdk_available() -> bool:
    try:
        import openai  # noqa: F401
    except ImportError:
        return False
    return True


async def cpu_per_token(way: Callable[[str, list[bytes]], Any], api: str, tokens: int, runs: int) -> list[float]:
    chunks = reads(STREAMS[api](tokens))
    await way(api, chunks)  # warm up: imports, first allocations
    found = []
    for _ in range(runs):
        started = time.process_time()
        await way(api, chunks)
        found.append((time.process_time() - started) / tokens * 1e6)
    return found


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--api", action="append", choices=sorted(STREAMS), help="default: every one")
    args = parser.parse_args()
    ways: list[tuple[str, Callable[[str, list[bytes]], Any]]] = [("decoder", decoder_only), ("client", whole_client)]
    if sdk_available():
        import openai

        ways.append((f"openai SDK {openai.__version__}", openai_sdk))
    else:
        print("openai SDK: not importable, skipped (see --help to install it outside the clone)")
    print(f"CPU per streamed token, {args.tokens} tokens, best / median of {args.runs} runs (us)")
    for api in args.api or sorted(STREAMS):
        for label, way in ways:
            figures = await cpu_per_token(way, api, args.tokens, args.runs)
            print(f"  {api:<10} {label:<20} {min(figures):7.2f} / {statistics.median(figures):7.2f}")


if __name__ == "__main__":
    asyncio.run(main())
