"""The protocol's reference server, `@modelcontextprotocol/server-everything` (npm, written by
others, protocol 2025-11-25), over stdio through Telegram and Slack: its mid-call elicitation
answered by typing and declined by button, its mid-call sampling answered by our model and
priced, a resource link read with `mcp_read_resource`, its image shown to a vision model and
its structured content. The server comes from the conformance tier (tests/mcp_tier.py);
skipped (with the reason) when it is not built."""

from __future__ import annotations

from typing import Any

import pytest
from fakes.llm import FakeToolCall, Reply
from helpers import until
from mcp_support import mcp_section, until_running
from mcp_tier import node_server, unavailable_reason
from test_budgets import priced
from test_slack_e2e import buttons, has_prompt, prompt_message, slack_config
from test_slack_e2e import running as slack_running
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import PRIVATE, button, running, settle, texts, tg_config, tool_results
from test_telegram_e2e import has_prompt as tg_has_prompt
from test_telegram_e2e import prompt_message as tg_prompt_message


def everything() -> str:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"MCP tier skipped: {reason}")
    return str(node_server("mcp-server-everything"))


def servers(**settings: Any) -> dict[str, Any]:
    server = {"command": [everything(), "stdio"], "trusted": True, "timeout_s": 30, "connect_timeout_s": 60}
    return mcp_section(ev={**server, **settings})


ALLOW = {"rules": [{"tool": "mcp__ev__*", "action": "allow"}]}  # its tools say they have side effects


def results_reply(llm) -> None:  # noqa: ANN001
    llm.responder = lambda request: Reply(f"result: {tool_results(request)[-1]}")


async def test_its_mid_call_form_is_answered_by_typing_through_telegram(store, llm, tg, tmp_path) -> None:
    cfg = tg_config(llm, tg, tmp_path, mcp=servers(), approvals=ALLOW)
    llm.tool_call("mcp__ev__trigger-elicitation-request", {}, id="e1")
    results_reply(llm)
    async with running(store, cfg) as gateway:
        await until_running(gateway, "ev", 60)
        tg.private_message(PRIVATE, "fill the form")
        await until(lambda: tg_has_prompt(tg, PRIVATE), 30)
        prompt = tg_prompt_message(tg, PRIVATE)
        assert "Please provide inputs for the following fields" in prompt.text and "• name:" in prompt.text
        assert [[b["text"] for b in row] for row in prompt.buttons] == [["Decline"]]
        tg.private_message(PRIVATE, "name: Ann Smith\ncheck: yes\nuntitledMultipleSelectEnum: Piano, Drums")
        await settle(gateway, lambda: any(t.startswith("result:") for t in texts(tg, PRIVATE)))
        result = tool_results(llm.requests[-1])[-1]
        assert "User provided the requested information" in result and "- Name: Ann Smith" in result
        assert "- Agreed to terms: true" in result and '"Piano"' in result


async def test_its_mid_call_form_declined_by_a_click_in_slack(store, llm, slack, tmp_path) -> None:
    cfg = slack_config(llm, slack, tmp_path, mcp=servers(), approvals=ALLOW)
    llm.tool_call("mcp__ev__trigger-elicitation-request", {}, id="e1")
    results_reply(llm)
    async with slack_running(store, cfg, slack) as s:
        await until_running(s.gateway, "ev", 60)
        await s.mention("fill the form")
        await until(lambda: has_prompt(slack), 30)
        prompt = prompt_message(slack)
        assert [b["text"]["text"] for b in buttons(prompt)] == ["Decline"]
        await s.click(prompt, "Decline")
        await s.settle(lambda: any(t.startswith("result:") for t in slack_texts(slack)))
        assert "User declined to provide the requested information" in tool_results(llm.requests[-1])[-1]


async def test_its_mid_call_sampling_is_answered_by_our_model_and_priced(store, llm, tg, tmp_path) -> None:
    cfg = priced(tg_config(llm, tg, tmp_path, mcp=servers(sampling=True), approvals=ALLOW))
    llm.tool_call(
        "mcp__ev__trigger-sampling-request", {"prompt": "a word", "maxTokens": 10}, id="s1",
        usage={"prompt_tokens": 10, "completion_tokens": 2},
    )
    llm.reply("Bonjour", usage={"prompt_tokens": 40, "completion_tokens": 3})
    llm.reply("done", usage={"prompt_tokens": 10, "completion_tokens": 2})
    async with running(store, cfg) as gateway:
        await until_running(gateway, "ev", 60)
        tg.private_message(PRIVATE, "sample")
        await settle(gateway, lambda: "done" in texts(tg, PRIVATE))
        assert llm.requests[1]["messages"][0] == {"role": "system", "content": "You are a helpful test server."}
        assert '"text": "Bonjour"' in tool_results(llm.requests[2])[-1]
        (run,) = await store.runs.list()
        assert run.llm_calls == 3 and run.cost_nano_usd == 67_000_000  # 67 tokens at $0.001


async def test_its_url_mode_question_is_done_by_button(store, llm, tg, tmp_path) -> None:
    cfg = tg_config(llm, tg, tmp_path, mcp=servers(), approvals=ALLOW)
    llm.tool_call("mcp__ev__trigger-url-elicitation", {"url": "https://example.org/sign-in"}, id="u1")
    results_reply(llm)
    async with running(store, cfg) as gateway:
        await until_running(gateway, "ev", 60)
        if gateway.registry.get("mcp__ev__trigger-url-elicitation") is None:
            pytest.skip("this server-everything has no trigger-url-elicitation")
        tg.private_message(PRIVATE, "open it")
        await until(lambda: tg_has_prompt(tg, PRIVATE), 30)
        prompt = tg_prompt_message(tg, PRIVATE)
        assert prompt.buttons[0][0] == {"text": "Open", "url": "https://example.org/sign-in"}
        assert "https://example.org/sign-in" in prompt.text
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Done"), user_id=PRIVATE)
        await settle(gateway, lambda: any(t.startswith("result:") for t in texts(tg, PRIVATE)))
        assert "User completed the URL elicitation flow" in tool_results(llm.requests[-1])[-1]


async def test_its_results_reach_the_model(store, llm, tg, tmp_path) -> None:
    cfg = tg_config(llm, tg, tmp_path, mcp=servers(), approvals=ALLOW)
    cfg = cfg.model_copy(update={"llm": cfg.llm.model_copy(update={"vision": True})})
    llm.tool_calls(
        ("mcp__ev__get-resource-links", {"count": 1}, "l1"),
        ("mcp__ev__get-tiny-image", {}, "i1"),
        ("mcp__ev__get-structured-content", {"location": "Chicago"}, "s1"),
    )

    def read_the_link(request: dict[str, Any]) -> Reply:
        if len(llm.requests) > 2:
            return Reply("done")
        links = tool_results(request)[0]
        uri = links.split("uri=")[1].split('"')[1]
        return Reply("", tool_calls=(FakeToolCall("mcp_read_resource", {"server": "ev", "uri": uri}, "r1"),))

    llm.responder = read_the_link
    async with running(store, cfg) as gateway:
        await until_running(gateway, "ev", 60)
        tg.private_message(PRIVATE, "try its results")
        await settle(gateway, lambda: "done" in texts(tg, PRIVATE))
        links, image, structured = tool_results(llm.requests[1])
        assert "[resource link" in links and "read it with mcp_read_resource" in links
        assert "image/png saved to the workspace: mcp/ev/" in image
        assert "\"temperature\"" in structured
        users = [m for m in llm.requests[1]["messages"] if m["role"] == "user" and isinstance(m["content"], list)]
        assert any(p.get("type") == "image_url" for m in users for p in m["content"])  # llm.vision
        read = tool_results(llm.requests[2])[-1]
        assert read and "Error" not in read and "could not read" not in read
