"""`gateway doctor` and `gateway setup` find out which model APIs a server speaks and check the
model in the one it is configured with, against the fakes of each API (tests/fakes/)."""

from __future__ import annotations

import yaml
from aiohttp import web
from fakes.anthropic import FakeAnthropic, thinking_blocks
from fakes.llm import FakeLLM
from fakes.llm_responses import FakeResponses
from test_first_hour_setup import setup

from gateway.cli.doctor import diagnose
from gateway.config import LLMConfig
from gateway.llm.api_probe import APIS, PATHS, ApiAnswer, judge, probe_apis, spoken, suggest_api
from gateway.llm.formats.anthropic import THINKING_BUDGET


def checks_of(report) -> dict[str, object]:  # noqa: ANN001
    return {check.name: check for check in report.checks}


class FakeChatAndAnthropic(FakeAnthropic):
    """A server that speaks Chat Completions and Anthropic Messages, as llama.cpp's, vLLM's and
    LiteLLM's do, for the probe: the Anthropic fake with the Chat Completions fake's validation at
    /v1/chat/completions (it refuses an empty request as that API does; its answers are Anthropic's)."""

    def _routes(self, app: web.Application) -> None:
        super()._routes(app)

        async def chat(request: web.Request) -> web.StreamResponse:
            return await FakeLLM._handle(self, request)

        app.router.add_post("/v1/chat/completions", chat)


async def test_the_probe_tells_each_api_by_its_answer_to_an_empty_request():
    async with FakeLLM() as chat, FakeAnthropic() as anthropic, FakeChatAndAnthropic() as both:
        assert spoken(await probe_apis(chat.base_url)) == ["chat"]
        found = await probe_apis(anthropic.base_url, "k")
        assert spoken(found) == ["anthropic"]
        assert found["chat"].detail == "HTTP 404" and found["anthropic"].detail == "HTTP 400"
        assert spoken(await probe_apis(both.base_url, "k")) == ["chat", "anthropic"]
    assert anthropic.requests == [{}] and not anthropic.accepted  # refused by validation: nothing generated


async def test_the_suggestion_is_the_models_own_api_then_the_configured_then_the_first_spoken():
    async with FakeChatAndAnthropic() as both:
        answers = await probe_apis(both.base_url, "k")
    assert suggest_api("claude-sonnet-4-5", both.base_url, answers) == "anthropic"
    assert suggest_api("anthropic/claude-haiku-4-5", both.base_url, answers, "chat") == "anthropic"
    assert suggest_api("qwen3", both.base_url, answers, "chat") == "chat"
    assert suggest_api("qwen3", both.base_url, answers, "anthropic") == "anthropic"
    assert suggest_api("qwen3", both.base_url, answers, "responses") == "chat"  # not spoken there


def test_an_openai_reasoning_model_on_openais_api_is_suggested_responses():
    """What OpenAI's API answers the probe (its Chat Completions and Responses refuse an empty
    request, it has no /messages), as answers: the suggestion for each model there."""
    openai = "https://api.openai.com/v1"
    answers = {api: ApiAnswer(api, openai + PATHS[api], api != "anthropic", "HTTP 400") for api in APIS}
    assert suggest_api("o4-mini", openai, answers) == "responses"
    assert suggest_api("gpt-5-mini", openai, answers) == "responses"
    assert suggest_api("gpt-4o-mini", openai, answers) == "chat"  # no reasoning items to lose
    assert suggest_api("o4-mini", "http://127.0.0.1:8000/v1", answers) == "chat"  # another server: as configured


async def test_an_api_the_server_does_not_speak_fails_with_the_setting_and_the_fix():
    async with FakeLLM() as llm:
        report = await diagnose(LLMConfig(base_url=llm.base_url, model="m", api="anthropic"))
    checks = checks_of(report)
    assert list(checks) == ["reachable", "auth", "model listed", "api"] and report.failed  # stops there
    api = checks["api"]
    assert api.status == "fail"
    said = f"llm.api is anthropic, but {llm.base_url}/messages answered HTTP 404; {llm.base_url} speaks chat"
    assert api.found == said
    assert api.fix == "set llm.api: chat"
    assert llm.requests == [{}]  # the probe's empty request only: nothing was generated


async def test_a_claude_model_through_chat_where_anthropic_is_spoken_is_told_what_it_loses():
    async with FakeChatAndAnthropic() as both:
        answers = await probe_apis(both.base_url, "k")
    finding = judge("chat", "claude-sonnet-4-5", both.base_url, answers, "llm.models.claude.api")
    assert finding.status == "warn"
    assert finding.found == (
        f"chat works at {both.base_url}, but claude-sonnet-4-5 loses its thinking and prompt caching through it "
        "(it also speaks anthropic)"
    )
    assert finding.fix == "set llm.models.claude.api: anthropic"
    assert judge("chat", "qwen3", both.base_url, answers, "llm.api").status == "ok"  # a local model: chat is fine


async def test_an_anthropic_model_is_checked_in_its_api_with_a_thinking_round_trip():
    async with FakeAnthropic(context_window=200_000) as llm:
        llm.reply("hi")
        llm.tool_call("get_time", {"timezone": "Europe/Oslo"}, id="toolu_1")
        llm.reply("It is noon.")
        llm.tool_call("get_time", {"timezone": "Europe/Oslo"}, id="toolu_2", reasoning="Oslo, so the clock tool.")
        llm.reply("It is noon in Oslo.")
        config = LLMConfig(base_url=llm.base_url, model="claude-sonnet-4-5", api="anthropic", api_key="k")
        report = await diagnose(config)
    checks = checks_of(report)
    statuses = {name: check.status for name, check in checks.items()}
    assert statuses == {
        "reachable": "ok", "auth": "ok", "model listed": "warn", "api": "ok", "context window": "ok",
        "completion": "ok", "tools": "ok", "thinking": "ok",
    }  # fmt: skip
    assert checks["api"].found == f"llm.api: anthropic; {llm.base_url} speaks it"
    assert checks["thinking"].found == (
        "1 thinking block(s), 1 signed, went back unchanged with the tool's result and were accepted"
    )
    thinking_round = llm.requests[-2]
    assert thinking_round["thinking"] == {"type": "enabled", "budget_tokens": THINKING_BUDGET["low"]}
    sent_back = thinking_blocks(llm.requests[-1])
    assert [b["thinking"] for b in sent_back] == ["Oslo, so the clock tool."] and sent_back[0]["signature"]
    assert not llm.rejections[1:], llm.rejections  # only the probe's empty request was refused


async def test_a_model_that_refuses_thinking_is_said_not_failed_unless_reasoning_asks_for_it():
    refused = "thinking is not supported by this model"
    async with FakeAnthropic() as llm:
        llm.reply("hi")
        llm.tool_call("get_time", {"timezone": "Europe/Oslo"}, id="toolu_1")
        llm.reply("It is noon.")
        llm.error(400, message=refused)  # the thinking round trip's first request
        config = LLMConfig(base_url=llm.base_url, model="claude-3-5-haiku", api="anthropic", api_key="k")
        report = await diagnose(config)
    thinking = checks_of(report)["thinking"]
    assert thinking.status == "ok" and thinking.found.startswith("claude-3-5-haiku does not take thinking (refused: ")
    assert refused in thinking.found
    assert not report.failed

    async with FakeAnthropic() as llm:
        llm.reply("hi")
        llm.error(400, message=refused)  # llm.reasoning: high thinks in the tool round trip too
        llm.error(400, message=refused)
        report = await diagnose(config.model_copy(update={"base_url": llm.base_url, "reasoning": "high"}))
    thinking = checks_of(report)["thinking"]
    assert thinking.status == "fail" and refused in thinking.found and report.failed
    assert thinking.fix == "set llm.reasoning: off, or use a model that thinks"


async def test_setup_asks_the_server_what_it_speaks_and_writes_the_api(tmp_path):
    async with FakeAnthropic(api_key="sk-setup") as llm:
        llm.reply("hi")
        llm.tool_call("get_time", {"timezone": "Europe/Oslo"}, id="toolu_1")
        llm.reply("It is noon.")
        llm.tool_call("get_time", {"timezone": "Europe/Oslo"}, id="toolu_2", reasoning="The clock tool.")
        llm.reply("It is noon in Oslo.")
        config = tmp_path / "config.yml"
        code, out = await setup(
            config, "--llm-base-url", llm.base_url, "--llm-api-key", "sk-setup", "--llm-model", "claude-sonnet-4-5"
        )
    assert code == 0, out
    assert f"✓ api: llm.api: anthropic; {llm.base_url} speaks it" in out
    assert "✓ tools" in out and "✓ thinking: 1 thinking block(s), 1 signed" in out
    written = yaml.safe_load(config.read_text())["llm"]
    assert (written["api"], written["model"]) == ("anthropic", "claude-sonnet-4-5")
    assert llm.headers[-1]["x-api-key"] == "sk-setup"  # every request in Anthropic's own way


async def test_each_named_model_is_checked_in_its_own_api():
    async with FakeLLM() as local, FakeAnthropic(api_key="sk-ant") as claude:
        local.reply("hi")
        local.reply("no tools here")
        config = LLMConfig(
            base_url=local.base_url, model="qwen3",
            models={
                "claude": {"base_url": claude.base_url, "model": "claude-sonnet-4-5", "api_key": "sk-ant"},
                "sonnet": {"base_url": claude.base_url, "model": "claude-sonnet-4-5", "api_key": "sk-ant",
                           "api": "anthropic"},
                "small": {"model": "qwen3:0.6b"},  # llm's server, in llm's API
            },
        )  # fmt: skip
        report = await diagnose(config)
    checks = checks_of(report)
    assert checks["api (claude)"].status == "fail"
    assert checks["api (claude)"].fix == "set llm.models.claude.api: anthropic"
    assert f"{claude.base_url}/chat/completions answered HTTP 404" in checks["api (claude)"].found
    assert checks["api (sonnet)"].status == "ok" and checks["api (small)"].status == "ok"
    assert claude.requests == [{}]  # its server asked once for both models, with an empty request: nothing generated


async def test_a_responses_model_carries_its_reasoning_items_through_the_tool_round_trip():
    """The fake refuses a function call sent back without the reasoning item it came with, as
    OpenAI does: doctor's round trip passes only by carrying it."""
    async with FakeResponses(server_kind="openai") as llm:
        llm.reply("hi")
        llm.tool_call("get_time", {"timezone": "Europe/Oslo"}, id="call_1", reasoning="Oslo: the clock tool.")
        llm.reply("It is noon.")
        report = await diagnose(LLMConfig(base_url=llm.base_url, model="o4-mini", api="responses", reasoning="low"))
    checks = checks_of(report)
    assert checks["api"].status == "ok" and checks["tools"].status == "ok", report.checks
    assert checks["tools"].found == "the model called get_time and the server accepted its result"
    sent_back = [item for item in llm.requests[-1]["input"] if item.get("type") == "reasoning"]
    assert len(sent_back) == 1 and sent_back[0]["encrypted_content"] and not llm.rejections[1:]
