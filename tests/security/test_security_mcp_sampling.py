"""An MCP server allowed to sample may not spend the model at its own discretion.

The attack: a server with `sampling: true` (or one that turned hostile after an update) asks
for 100,000 tokens per request, five requests in one tool call, on the payer's account. Each
request's `max_tokens` is clamped to `mcp.servers.<name>.sampling_max_tokens`, and a call gets at
most `sampling_per_call` requests answered; one more ends the call with a tool error naming the
setting. Both ways a server asks: inside the call's result (the 2026-07-28 protocol) and as
requests in the middle of the call (older protocols)."""

from __future__ import annotations

import pytest
from fakes.llm import Reply, user_texts
from mcp_support import mcp_section, stdio_server, until_running
from test_telegram_e2e import PRIVATE, running, settle, texts, tg_config, tool_results

CAP_TOKENS, CAP_CALLS = 200, 3


def config(llm, tg, tmp_path, protocol: str, per_call: int = CAP_CALLS):  # noqa: ANN001, ANN201
    server = stdio_server(
        tmp_path / "state", trusted=True, protocol=protocol, sampling=True,
        sampling_max_tokens=CAP_TOKENS, sampling_per_call=per_call,
    )
    server["command"].append("--extra")
    return tg_config(llm, tg, tmp_path, mcp=mcp_section(t=server))


def is_sampling(request: dict) -> bool:
    return any("very long essay" in text for text in user_texts(request))


async def ramble(store, llm, tg, tmp_path, protocol: str, per_call: int) -> tuple[list[dict], str]:  # noqa: ANN001
    """The model calls `ramble`; the sampling requests that reached the model, and the tool result."""
    llm.tool_call("mcp__t__ramble", {"topic": "tides"}, id="r1")
    llm.responder = lambda request: Reply("a part" if is_sampling(request) else "Done.")
    async with running(store, config(llm, tg, tmp_path, protocol, per_call)) as gateway:
        await until_running(gateway)
        assert (gateway.mcp.summary()["t"]["protocol"] >= "2026") is (protocol == "auto")
        tg.private_message(PRIVATE, "an essay please")
        await settle(gateway, lambda: "Done." in texts(tg, PRIVATE))
    (result,) = tool_results(next(r for r in llm.requests if tool_results(r)))
    return [request for request in llm.requests if is_sampling(request)], result


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_a_sampling_request_gets_no_more_tokens_than_the_cap(store, llm, tg, tmp_path, protocol) -> None:
    sampled, result = await ramble(store, llm, tg, tmp_path, protocol, per_call=5)
    assert [request.get("max_tokens") for request in sampled] == [CAP_TOKENS] * 5  # not 100,000
    assert result == "essay: " + " / ".join(["a part"] * 5)


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_a_server_cannot_sample_more_often_than_the_cap_in_one_call(store, llm, tg, tmp_path, protocol) -> None:
    sampled, result = await ramble(store, llm, tg, tmp_path, protocol, per_call=CAP_CALLS)
    # Older protocols ask one at a time (the first three are answered); the newest asks for the
    # five at once, refused before any is spent.
    assert len(sampled) == {"legacy": CAP_CALLS, "auto": 0}[protocol]
    assert f"more than {CAP_CALLS} times in one call" in result and "sampling_per_call" in result
