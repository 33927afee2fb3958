"""The console's Jobs page and /api/jobs (SQLite and PostgreSQL): each job's wake/skip history
(woken firings with their model calls, tokens and cost; "skipped (no change)" for a check that
found nothing new) and its spend today, this week and this month with the calls skipped firings
saved and the forecast; a check's failure that quotes a URL's password or a configured secret is
masked as on every other page. Driven through the real scheduler, its sandboxed command check and
the fake model server."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime

import aiohttp
import pytest
from admin_support import TOKEN, admin_config, base_url, logged_in, serving
from fakes.channel import FakeChannel
from test_admin_browser import browser, log_in  # noqa: F401 - the browser fixture

from gateway.budgets.jobs import budgets_with_jobs
from gateway.events import ThreadKey
from gateway.jobs.checks import job_dir
from gateway.tools.sandbox import sandbox_status

pytestmark = pytest.mark.skipif(
    bool(sandbox_status("auto").problem), reason=f"bubblewrap cannot sandbox here: {sandbox_status('auto').problem}"
)

CHAT = ThreadKey("telegram", "900", "")
API_KEY = "sk-live-Vt8wQ2pLmZ"  # a configured secret a check's error quotes
PRICE = {"input": 3, "output": 15, "cache_read": 0.3}
USAGE = {"prompt_tokens": 1200, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 1000}}
WATCH = {
    "name": "inbox-watch", "kind": "tick", "every": "30m", "prompt": "Tell me only what is urgent.",
    "deliver_to": "telegram:900", "check": {"command": "cat unread.txt 2>/dev/null || true"},
}
LEAKY = {
    "name": "leaky", "kind": "tick", "every": "1h", "prompt": "Anything?", "deliver_to": "telegram:900",
    "check": {"command": f"echo 'fetch https://bob:hunter2@mail.example/inbox {API_KEY}'; exit 3"},
}


def console_config(llm, tmp_path):  # noqa: ANN001, ANN201
    return admin_config(
        llm.base_url, str(tmp_path / "ws"),
        llm={"prices": {"test-model": PRICE}, "api_key": API_KEY},
        scheduler={"enabled": True, "jobs": [WATCH, LEAKY]},
    )


async def fire(h, name: str):  # noqa: ANN001, ANN201
    schedule = await h.store.schedules.by_name(name)
    run = await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
    await h.idle()
    return run


def section(page: str, job: str) -> str:
    start = page.index(f'id="job-{job}"')
    end = page.find('<section class="card job"', start)
    return html.unescape(page[start : end if end > 0 else len(page)])


async def test_the_jobs_page_shows_wakes_skips_and_spend_with_secrets_masked(store, llm, tmp_path):
    config = console_config(llm, tmp_path)
    unread = job_dir(config.agent, "inbox-watch") / "unread.txt"
    async with serving(store, config, FakeChannel(name="telegram")) as h:
        unread.write_text("mail from Ann: the server is down\n")
        llm.reply("NOTHING_TO_REPORT", usage=USAGE)
        assert (await fire(h, "inbox-watch")).session_id is not None  # woke
        for _ in range(2):
            skipped = await fire(h, "inbox-watch")
            assert (skipped.status, skipped.error) == ("skipped", "no change")
        unread.write_text("mail from Ann: the server is down\nmail from Bo: lunch?\n")
        llm.reply("NOTHING_TO_REPORT", usage=USAGE)
        assert (await fire(h, "inbox-watch")).session_id is not None  # woke again
        assert len(llm.requests) == 2
        failed = await fire(h, "leaky")
        assert failed.status == "failed" and "hunter2" in failed.error  # stored as it was: masked when shown
        await h.say("/cost", thread=CHAT)
        await h.idle()
        cost_reply = h.channel.messages(CHAT)[-1]
        report = await budgets_with_jobs(store, config)

        base = base_url(h)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:  # 127.0.0.1
            await logged_in(http, base)
            async with http.get(f"{base}/jobs") as response:
                assert response.status == 200
                page = await response.text()
            async with http.get(f"{base}/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"}) as response:
                api = await response.json()

    watch = section(page, "inbox-watch")
    assert "check before the model: command" in watch and "wakes when changed" in watch
    statuses = re.findall(r'<td class="status">([^<]*)</td>', watch)
    assert statuses == ["success", "skipped (no change)", "skipped (no change)", "success"]
    today = re.search(r'<tr class="period"><th>today</th>(.*?)</tr>', watch, re.S).group(1)
    cells = re.findall(r"<td>([^<]*)</td>", today)
    # firings, woke, skipped (no change), calls saved, model calls, input, cached, output, cost
    assert cells == ["4", "2", "2", "2", "2", "2,400", "2,000", "8", "$0.00192"]
    assert "at the rate since it was added (under 1 h ago, taken as 1 h): 58 k tokens/day, $0.05/day" in watch
    woken = re.findall(r'<tr class="firing success">(.*?)</tr>', watch, re.S)
    assert all("1,204 (1,000 cached)" in row and "$0.00096" in row for row in woken)

    leaky = section(page, "leaky")
    assert "hunter2" not in page and API_KEY not in page
    assert "check failed: the command exited 3: fetch ••••" in leaky  # the failure, its secrets masked

    # /cost in the chat the jobs report to, and `gateway budgets`: the same figures
    assert "today: 2 model calls, 2,400 input tokens (2,000 cached), 8 output, $0.00192; 4 firings (2 woke the model)" \
        "; 2 skipped (no change), 2 calls saved" in cost_reply
    today_row = next(line for line in report[report.index("  inbox-watch"):] if line.strip().startswith("today"))
    assert today_row.split() == ["today", "4", "2", "2", "2", "2", "2,400", "2,000", "8", "$0.00192"]

    (spend,) = [j["spend"] for j in api["jobs"] if j["schedule"]["name"] == "inbox-watch"]
    month = spend[2]
    assert (month["period"], month["firings"], month["woke"], month["skipped"], month["calls_saved"]) == (
        "this month", 4, 2, 2, 2,
    )
    assert (month["calls"], month["input_tokens"], month["cached_tokens"], month["cost_nano_usd"]) == (
        2, 2400, 2000, 1_920_000,
    )
    assert "hunter2" not in str(api) and API_KEY not in str(api)


async def test_the_jobs_page_in_a_browser(browser, sqlite_store, llm, tmp_path):  # noqa: F811
    """What a person sees: the history says "skipped (no change)", the spend table and forecast."""
    config = console_config(llm, tmp_path)
    (job_dir(config.agent, "inbox-watch") / "unread.txt").write_text("mail from Ann\n")
    llm.reply("NOTHING_TO_REPORT", usage=USAGE)
    async with serving(sqlite_store, config, FakeChannel(name="telegram")) as h:
        for _ in range(3):
            await fire(h, "inbox-watch")
        await log_in(browser, base_url(h))
        await browser.open(f"{base_url(h)}/jobs")
        history = await browser.text("#job-inbox-watch table.firings")
        assert history.count("skipped (no change)") == 2 and history.count("success") == 1
        spend = await browser.text("#job-inbox-watch table.spend")
        assert "today 3 1 2 2 1 1,200 1,000 4 $0.00096" in " ".join(spend.split())
        assert "tokens/day" in await browser.text("#job-inbox-watch .forecast")
        await browser.screenshot("jobs-spend")
