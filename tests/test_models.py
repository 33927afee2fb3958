"""The model per chat and per job (`llm.models`): `/model` lists what the person's role may use
and switches the session, with the model's prices in `/cost`; a job names its model; a
retryable failure moves the call to the next model of `llm.fallback` (recorded on the run), a
prompt over the context does not. Through Telegram and Slack on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fakes.channel import FakeChannel
from fakes.llm import FakeLLM
from harness import ALICE, make_config, running_gateway
from test_costs import with_llm
from test_slack_e2e import DM, slack_config
from test_slack_e2e import running as slack_running
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import PRIVATE, running, settle, texts, tg_config

from gateway.cli.reports import print_run
from gateway.config import Config, LLMConfig
from gateway.events import ThreadKey
from gateway.llm import ContextTooLong, LLMClient

FAST_PRICE = {"input": 0.15, "output": 0.60, "cache_read": 0.075}


@pytest.fixture
async def fast():
    """The second server: `llm.models.fast` (and the fallback's)."""
    async with FakeLLM() as server:
        yield server


def models(fast: FakeLLM, **more: Any) -> dict[str, Any]:
    return {
        "models": {
            "fast": {"base_url": fast.base_url, "model": "gpt-4o-mini", "prices": FAST_PRICE},
            "premium": {"base_url": fast.base_url, "model": "o3"},
        },
        "prices": {"test-model": {"input": 1, "output": 2}},
        **more,
    }


MEMBERS_FAST_ONLY = {"dm_policy": "open", "group_policy": "open", "roles": {"member": {"models": ["fast"]}}}
LISTING = (
    "This session uses default (test-model).\n"
    "Models you may use:\n"
    "✓ default (test-model): $1.00 in, $2.00 out per million tokens\n"
    "• fast (gpt-4o-mini): $0.15 in, $0.60 out, $0.075 cache read per million tokens\n"
    "Switch with /model NAME; /model default goes back."
)
REFUSED = "Your role (member) may not use the model premium. Models you may use: default, fast."
SWITCHED = "This session now uses fast (gpt-4o-mini): $0.15 in, $0.60 out, $0.075 cache read per million tokens."
BACK = "This session now uses the default (test-model) model: $1.00 in, $2.00 out per million tokens."
FAST_MODEL_LINE = "Model: fast (gpt-4o-mini); $0.15 in, $0.60 out, $0.075 cache read per million tokens"
# 200 fresh x 0.15 + 800 read x 0.075 + 100 out x 0.60 = 150 micro-USD
FAST_USAGE = {"prompt_tokens": 1000, "completion_tokens": 100, "prompt_tokens_details": {"cached_tokens": 800}}


async def conversation(say, said, llm: FakeLLM, fast: FakeLLM) -> None:  # noqa: ANN001
    """/model, a refused switch, a switch, a turn on the fast model, /cost and /status, back."""
    fast.reply("from fast", usage=FAST_USAGE)
    llm.reply("from default")
    for text, wanted in (
        ("/model", LISTING),
        ("/model premium", REFUSED),
        ("/model fast", SWITCHED),
        ("hello", "from fast"),
    ):
        await say(text, wanted)
    await say("/cost", FAST_MODEL_LINE)
    cost = said()[-1]
    assert cost.startswith(FAST_MODEL_LINE + "\n") and "cost $0.00015" in cost
    await say("/status", "Status:")
    assert FAST_MODEL_LINE in said()[-1]
    await say("/model default", BACK)
    await say("again", "from default")
    assert [r["model"] for r in fast.requests] == ["gpt-4o-mini"]
    assert [r["model"] for r in llm.requests] == ["test-model"]


async def runs_record_the_models(store) -> None:  # noqa: ANN001
    runs = sorted(await store.runs.list(), key=lambda r: r.id)
    assert [r.model for r in runs] == ["fast", "test-model"] and runs[0].cost_nano_usd == 150_000
    assert (await store.sessions.get(runs[-1].session_id)).model is None  # back to the default


async def test_model_switch_with_its_prices_in_cost_through_telegram(store, llm, fast, tg, tmp_path) -> None:
    config = with_llm(tg_config(llm, tg, tmp_path, agent={"tools": []}, access=MEMBERS_FAST_ONLY), models(fast))
    async with running(store, config) as gateway:

        async def say(text: str, wanted: str) -> None:
            count = len(texts(tg, PRIVATE))
            tg.private_message(PRIVATE, text, user_id=PRIVATE)
            await settle(gateway, lambda: len(texts(tg, PRIVATE)) > count and texts(tg, PRIVATE)[-1].startswith(wanted))

        await conversation(say, lambda: texts(tg, PRIVATE), llm, fast)
    await runs_record_the_models(store)


async def test_model_switch_with_its_prices_in_cost_through_slack(store, llm, fast, slack, tmp_path) -> None:
    config = with_llm(slack_config(llm, slack, tmp_path, agent={"tools": []}, access=MEMBERS_FAST_ONLY), models(fast))
    async with slack_running(store, config, slack) as side:

        async def say(text: str, wanted: str) -> None:
            count = len(slack_texts(slack, DM))
            await side.dm(text)
            await side.settle(
                lambda: len(slack_texts(slack, DM)) > count and slack_texts(slack, DM)[-1].startswith(wanted)
            )

        await conversation(say, lambda: slack_texts(slack, DM), llm, fast)
    await runs_record_the_models(store)


# ---- the fallback ---------------------------------------------------------------------------


def fallback_config(config: Config, fast: FakeLLM) -> Config:
    return with_llm(config, {**models(fast), "fallback": ["fast"], "max_retries": 1})


async def fell_back(store, llm: FakeLLM, fast: FakeLLM, capsys) -> None:  # noqa: ANN001
    assert [r["model"] for r in llm.requests] == ["test-model", "test-model"]  # retried once, then moved on
    assert [r["model"] for r in fast.requests] == ["gpt-4o-mini"]
    (run,) = await store.runs.list()
    assert (run.model, run.stage, run.cost_nano_usd) == ("fast", "SUCCESS", 150_000)
    events = await store.runs.events(run.id)
    kinds = [e.kind for e in events]
    assert kinds.index("LLM_FALLBACK") < kinds.index("LLM_REQUEST")
    (moved,) = [e.payload for e in events if e.kind == "LLM_FALLBACK"]
    assert (moved["from"], moved["to"], moved["after"]) == ("test-model", "fast", 2)
    assert "HTTP 500" in moved["error"]
    (request,) = [e.payload for e in events if e.kind == "LLM_REQUEST"]
    assert request["model"] == "fast" and request["fell_back_from"] == ["test-model"]
    print_run(run, events)  # `gateway runs show`
    shown = capsys.readouterr().out
    assert "model fast" in shown and "LLM_FALLBACK" in shown and "test-model -> fast after 2 attempt(s)" in shown


async def test_a_500_falls_back_to_the_next_model_through_telegram(store, llm, fast, tg, tmp_path, capsys) -> None:
    llm.error(500)
    llm.error(500)
    fast.reply("from the fallback", usage=FAST_USAGE)
    config = fallback_config(tg_config(llm, tg, tmp_path, agent={"tools": []}), fast)
    async with running(store, config) as gateway:
        tg.private_message(PRIVATE, "hello", user_id=PRIVATE)
        await settle(gateway, lambda: texts(tg, PRIVATE) == ["from the fallback"])
    await fell_back(store, llm, fast, capsys)


async def test_a_500_falls_back_to_the_next_model_through_slack(store, llm, fast, slack, tmp_path, capsys) -> None:
    llm.error(500)
    llm.error(500)
    fast.reply("from the fallback", usage=FAST_USAGE)
    config = fallback_config(slack_config(llm, slack, tmp_path, agent={"tools": []}), fast)
    async with slack_running(store, config, slack) as side:
        await side.dm("hello")
        await side.settle(lambda: slack_texts(slack, DM) == ["from the fallback"])
    await fell_back(store, llm, fast, capsys)


async def test_a_prompt_over_the_context_is_not_a_reason_to_fall_back(llm, fast) -> None:
    llm.context_too_long("openai")
    settings = {"base_url": llm.base_url, "model": "test-model", **models(fast), "fallback": ["fast"]}
    config = LLMConfig.model_validate(settings)
    async with LLMClient(config, backoff_base_s=0.01) as client:
        with pytest.raises(ContextTooLong):
            await client.complete([{"role": "user", "content": "hi"}])
    assert len(llm.requests) == 1 and fast.requests == []


async def test_each_named_model_has_its_own_window(llm, fast) -> None:
    fast.context_window = 16_384
    config = LLMConfig.model_validate(
        {"base_url": llm.base_url, "model": "test-model", "models": {"fast": {"base_url": fast.base_url, "model": "x"},
                                                                     "fixed": {"model": "y", "context_window": 4096}}}
    )
    async with LLMClient(config) as client:
        assert (await client.context_window("fast")).tokens == 16_384
        assert (await client.context_window()).tokens == 131_072
    assert config.window_setting("fixed") == 4096 and config.window_setting("test-model") == "auto"


# ---- a job's model --------------------------------------------------------------------------

JOB = {"name": "digest", "kind": "cron", "cron": "0 3 * * *", "prompt": "Report.", "deliver_to": "telegram:900",
       "model": "fast"}


async def test_a_job_runs_on_the_model_it_names(store, llm, fast, tmp_path) -> None:
    fast.reply("Report from fast.", usage=FAST_USAGE)
    config = make_config(
        llm.base_url, str(tmp_path / "ws"), llm=models(fast), agent={"tools": []},
        scheduler={"enabled": True, "jobs": [JOB]},
    )
    async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
        schedule = await store.schedules.by_name("digest")
        assert schedule.model == "fast"
        await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
        await h.wait_for(lambda: bool(h.channel.messages(ThreadKey("telegram", "900", ""))))
        await h.idle()
    assert [r["model"] for r in fast.requests] == ["gpt-4o-mini"] and llm.requests == []
    (run,) = await store.runs.list()
    assert (run.model, run.cost_nano_usd) == ("fast", 150_000)


def test_a_job_naming_an_unknown_model_is_a_configuration_error(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"scheduler.jobs\[digest\].model: 'fast' is not in llm.models \(default\)"):
        make_config("http://x", str(tmp_path), scheduler={"jobs": [JOB]})


def test_the_old_fallback_models_are_read_as_named_models_of_the_same_server() -> None:
    config = LLMConfig.model_validate({"model": "m1", "fallback_models": ["m2"], "api_key": "k"})
    assert config.fallback == ["m2"] and config.models["m2"].model == "m2" and config.models["m2"].base_url == ""
    with pytest.raises(ValueError, match=r"llm.fallback: nope not in llm.models"):
        LLMConfig.model_validate({"fallback": ["nope"]})
    with pytest.raises(ValueError, match="llm itself"):
        LLMConfig.model_validate({"models": {"default": {"model": "x"}}})


# ---- the console ----------------------------------------------------------------------------


async def test_the_console_shows_the_model_of_a_session_and_of_its_runs(store, llm, fast, tmp_path) -> None:
    import aiohttp
    from admin_support import admin_config, base_url, logged_in, serving

    fast.reply("from fast", usage=FAST_USAGE)
    config = admin_config(llm.base_url, str(tmp_path / "ws"), llm=models(fast), agent={"tools": []})
    async with serving(store, config) as h:
        await h.say("/model fast")
        await h.say("hello")
        await h.idle()
        (run,) = await store.runs.list()
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            base = base_url(h)
            await logged_in(http, base)
            async with http.get(f"{base}/runs/{run.id}") as response:
                page = await response.text()
            assert '<b id="run-model">fast</b>' in page
            async with http.get(f"{base}/sessions/{run.session_id}") as response:
                page = await response.text()
            # the harness's chat is shared: /model there is the sender's, shown per person
            assert '<span id="session-model">default</span>' in page and "<td>fast</td>" in page
            assert f'<span id="person-models">{ALICE.id}: fast</span>' in page


async def test_the_old_fallback_models_are_named_in_the_start_log(store, llm, tmp_path, caplog) -> None:
    config = make_config(llm.base_url, str(tmp_path), llm={"fallback_models": ["m2"]})
    async with running_gateway(store, config):
        pass
    assert any(
        "llm.fallback_models is deprecated: m2 read as llm.models" in r.getMessage() and r.levelname == "WARNING"
        for r in caplog.records
    )
