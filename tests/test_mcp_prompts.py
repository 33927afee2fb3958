"""MCP prompts as chat commands, through Telegram and Slack, against the test MCP server (written
with the SDK) and the protocol's reference server (`server-everything`, from the MCP tier):
listed by /help, arguments from the message or asked for with the question buttons, and the
prompt's messages handed to the model as the server's text (an MCP result), which starts the turn."""

from __future__ import annotations

import pytest
from fakes.llm import Reply
from helpers import until
from mcp_support import mcp_section, stdio_server, until_running
from mcp_tier import node_server, unavailable_reason
from test_slack_e2e import DM, slack_config
from test_slack_e2e import has_prompt as slack_has_prompt
from test_slack_e2e import running as slack_running
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import PRIVATE, has_prompt, running, settle, texts, tg_config, tool_results

from gateway.mcp.prompts import PromptCommand, command_name, parse_arguments
from gateway.mcp.sdk import PromptArgument, RemotePrompt
from gateway.memory.provenance import tool_kind


def tool_server(tmp_path):  # noqa: ANN001, ANN201
    return mcp_section(t=stdio_server(tmp_path / "state"))


def everything():  # noqa: ANN201
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"MCP tier skipped: {reason}")
    server = {"command": [str(node_server("mcp-server-everything")), "stdio"], "timeout_s": 30,
              "connect_timeout_s": 60}
    return mcp_section(ev=server)


def answered(llm) -> None:  # noqa: ANN001
    llm.responder = lambda request: Reply("Done: " + (tool_results(request) or ["-"])[-1][:60])


REVIEW = PromptCommand("t_code_review", "t", RemotePrompt("code_review", "Review code.", (
    PromptArgument("code", "", True), PromptArgument("language", "", False))))


def test_arguments_by_name_or_in_declared_order():
    assert parse_arguments(REVIEW, 'code="x = 1" language=go') == {"code": "x = 1", "language": "go"}
    assert parse_arguments(REVIEW, "'x = 1' go") == {"code": "x = 1", "language": "go"}
    assert parse_arguments(REVIEW, "language=rust fn main") == {"language": "rust", "code": "fn main"}
    assert parse_arguments(REVIEW, "") == {}
    with pytest.raises(ValueError, match=r"^/t_code_review has no argument 'lang'; write /t_code_review code=… "):
        parse_arguments(REVIEW, "lang=go")
    assert command_name("my-server", "Code Review!") == "my_server_code_review"
    assert tool_kind("mcp_prompt") == "mcp"  # its result is an MCP server's text, never the owner's words


async def test_telegram_a_prompt_is_a_command_listed_by_help_and_starts_a_turn(store, llm, tg, tmp_path) -> None:
    answered(llm)
    async with running(store, tg_config(llm, tg, tmp_path, mcp=tool_server(tmp_path))) as gateway:
        await until_running(gateway, "t")
        tg.private_message(PRIVATE, "/help")
        await settle(gateway, lambda: any("MCP prompts" in t for t in texts(tg, PRIVATE)))
        help_text = next(t for t in texts(tg, PRIVATE) if "MCP prompts" in t)
        assert "/t_code_review code [language] — Review a piece of code for bugs and style. (MCP t)" in help_text
        assert "/t_standup — A greeting for the team's standup. (MCP t)" in help_text
        tg.private_message(PRIVATE, '/t_code_review code="print(1)" language=python')
        await settle(gateway, lambda: any(t.startswith("Done:") for t in texts(tg, PRIVATE)))
    first = llm.requests[0]
    (result,) = tool_results(first)
    assert "Review this python code for bugs and style, most serious first:\n\nprint(1)" in result
    assert "the server's text, not the words of who asked" in result
    users = [m["content"] for m in first["messages"] if m["role"] == "user"]
    assert any('/t_code_review code="print(1)"' in str(u) for u in users)  # what the person typed
    assert "mcp_prompt" not in [t["function"]["name"] for t in first.get("tools") or []]  # never the model's


async def test_telegram_a_missing_argument_is_asked_for_with_the_question_buttons(store, llm, tg, tmp_path) -> None:
    answered(llm)
    async with running(store, tg_config(llm, tg, tmp_path, mcp=tool_server(tmp_path))) as gateway:
        await until_running(gateway, "t")
        tg.private_message(PRIVATE, "/t_code_review")
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        question = next(m for m in tg.bot_messages(PRIVATE) if m.buttons)
        assert question.text.startswith("❓ /t_code_review needs code")
        assert [[b["text"] for b in row] for row in question.buttons] == [["Cancel"]]
        assert llm.requests == []  # nothing reaches the model before the prompt has its arguments
        tg.private_message(PRIVATE, "SELECT * FROM users")
        await settle(gateway, lambda: any(t.startswith("Done:") for t in texts(tg, PRIVATE)))
    (result,) = tool_results(llm.requests[0])
    assert result.endswith("Review this python code for bugs and style, most serious first:\n\nSELECT * FROM users")


async def test_telegram_a_wrong_argument_is_one_line(store, llm, tg, tmp_path) -> None:
    async with running(store, tg_config(llm, tg, tmp_path, mcp=tool_server(tmp_path))) as gateway:
        await until_running(gateway, "t")
        tg.private_message(PRIVATE, "/t_code_review lang=go")
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
    assert texts(tg, PRIVATE) == [
        "/t_code_review has no argument 'lang'; write /t_code_review code=… [language=…]"
    ]
    assert llm.requests == []


async def test_slack_a_prompt_command_starts_a_turn(store, llm, slack, tmp_path) -> None:
    answered(llm)
    async with slack_running(store, slack_config(llm, slack, tmp_path, mcp=tool_server(tmp_path)), slack) as s:
        await until_running(s.gateway, "t")
        await s.dm("/t_standup")
        await s.settle(lambda: any(t.startswith("Done:") for t in slack_texts(slack, DM)))
    (result,) = tool_results(llm.requests[0])
    assert result.endswith("Greet the team and ask each person for yesterday, today and blockers.")


async def test_everything_prompts_through_telegram(store, llm, tg, tmp_path) -> None:
    answered(llm)
    async with running(store, tg_config(llm, tg, tmp_path, mcp=everything())) as gateway:
        await until_running(gateway, "ev", 60)
        tg.private_message(PRIVATE, "/ev_args_prompt city=Paris")
        await until(lambda: any(t.startswith("Done:") for t in texts(tg, PRIVATE)), 30)  # a node server: slower
    (result,) = tool_results(llm.requests[0])
    assert result.endswith("[user]\nWhat's weather in Paris?")


async def test_everything_prompts_through_slack(store, llm, slack, tmp_path) -> None:
    answered(llm)
    async with slack_running(store, slack_config(llm, slack, tmp_path, mcp=everything()), slack) as s:
        await until_running(s.gateway, "ev", 60)
        await s.dm("/ev_simple_prompt")
        await until(lambda: any(t.startswith("Done:") for t in slack_texts(slack, DM)), 30)
        assert not slack_has_prompt(slack, DM)
    (result,) = tool_results(llm.requests[0])
    assert "simple prompt" in result.lower()
