"""The console in a real browser (headless Chromium): login, a wrong token, an approval decided
from the console that resumes the turn in the chat, a run's page, a CSRF-less POST refused, and
a screenshot of each page for docs/operations.md."""

from __future__ import annotations

import pytest
from admin_support import TOKEN, admin_config, base_url, serving
from browser import Browser, require_chromium
from helpers import session_file

from gateway.events import utcnow
from scheduler.definitions import job_config, to_schedule


@pytest.fixture
async def browser():
    require_chromium()
    chromium = await Browser.start()
    try:
        yield chromium
    finally:
        await chromium.close()


async def log_in(browser: Browser, base: str, token: str = TOKEN, user: str = "dana") -> None:
    await browser.open(f"{base}/login")
    await browser.fill("input[name=user]", user)
    await browser.fill("input[name=token]", token)
    await browser.click("#login button[type=submit]")


async def test_login_and_a_wrong_token(browser, sqlite_store, llm, tmp_path):
    async with serving(sqlite_store, admin_config(llm.base_url, str(tmp_path / "ws"))) as h:
        base = base_url(h)
        await browser.open(f"{base}/")
        assert (await browser.url()).endswith("/admin/login")  # not logged in: sent to the login page
        await log_in(browser, base, token="not-the-token")
        assert await browser.text("#login-error") == "Wrong token."
        await browser.screenshot("login-wrong-token")
        await log_in(browser, base)
        assert (await browser.url()).endswith("/admin/")
        assert await browser.text("#leader") == h.gateway.inbox.instance_id
        assert await browser.text("#turns-running") == "0"
        assert (await browser.text("#llm-reachable")).startswith("Reachable yes")  # the start's check
        assert "test-model" in await browser.text("#llm-model")
        assert "bubblewrap" in await browser.text("#sandbox-mode")
        assert TOKEN not in await browser.page()
        await browser.screenshot("overview")
        await browser.screenshot("overview-phone", width=390)


async def test_approve_from_the_console_resumes_the_turn_in_the_chat(browser, sqlite_store, llm, tmp_path):
    llm.tool_call("write_file", {"path": "note.txt", "content": "hi"}, id="w1")
    llm.reply("Written.")
    async with serving(sqlite_store, admin_config(llm.base_url, str(tmp_path / "ws"))) as h:
        base = base_url(h)
        await h.say("write a note")
        await h.idle()
        await log_in(browser, base)
        await browser.open(f"{base}/approvals")
        assert "write_file" in await browser.text("#pending")
        await browser.screenshot("approvals")
        # A POST without the form's CSRF token, sent by the page itself with its session cookie.
        status = await browser.script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {method: 'POST', body: new URLSearchParams({})}).then(r => done(r.status));",
            f"{base}/approvals/1/approve",
        )
        assert status == 403
        assert (await sqlite_store.prompts.get(1)).status == "pending"
        await browser.click("#pending button.approve")
        assert "Approved by dana (console)" in await browser.text(".notice")
        await h.idle()
        assert session_file(tmp_path / "ws", "note.txt").read_text() == "hi"
        assert h.channel.messages()[-1] == "Written."
        assert any("Approved by dana (console)" in text for text in h.channel.closes())
        assert "dana (console)" in await browser.text("#decided")
        run = (await sqlite_store.runs.list())[0]
        await browser.open(f"{base}/runs/{run.id}")
        assert await browser.text("#run-stage") == "SUCCESS"
        timeline = await browser.text("#timeline")
        assert "LLM_RESPONSE" in timeline and "TOOL_CALL" in timeline and "write_file" in timeline
        await browser.screenshot("run")


async def test_sessions_jobs_and_access_pages(browser, sqlite_store, llm, tmp_path):
    llm.reply("Hello Alice.")
    config = admin_config(llm.base_url, str(tmp_path / "ws"))
    async with serving(sqlite_store, config) as h:
        base = base_url(h)
        await h.say("hi there")
        await h.idle()
        fields = {"name": "daily-digest", "cron": "0 9 * * 1-5", "prompt": "Summarise yesterday's tickets.",
                  "deliver_to": "none"}
        await sqlite_store.schedules.create(
            to_schedule(job_config(fields), config.scheduler, source="cli", now=utcnow(), created_by="cli")
        )
        await sqlite_store.access.request(
            kind="user", channel="fake", subject="300", name="Eve", thread_key="fake:300:", ttl_s=3600, max_pending=5
        )
        await log_in(browser, base)
        await browser.open(f"{base}/sessions?q=Alice")
        assert "fake:chat1" in await browser.text("#sessions")
        await browser.screenshot("sessions")
        await browser.click("#sessions a")
        assert "Hello Alice." in await browser.text("#history")
        await browser.screenshot("session")
        await browser.open(f"{base}/jobs")
        await browser.screenshot("jobs")
        await browser.click("#job-daily-digest button.deny")  # Disable
        assert await browser.text(".notice") == "daily-digest disabled"
        assert not (await sqlite_store.schedules.by_name("daily-digest")).enabled
        await browser.open(f"{base}/access")
        assert "Eve" in await browser.text("#pairing")
        await browser.screenshot("access")
        await browser.click("#pairing button.approve")
        assert "approved" in (await browser.text(".notice")).lower()
        grant = await sqlite_store.access.grant_for("user", "fake", "300")
        assert grant is not None and grant.granted_by == "console:dana"
        await browser.open(f"{base}/audit?since=1h&user=dana")
        trail = await browser.text("#audit")
        assert "approve_pairing" in trail and "job_disable" in trail and "login" in trail
        await browser.screenshot("audit")


async def test_the_overview_says_the_model_server_is_down_and_the_sandbox_missing(
    browser, sqlite_store, tmp_path, monkeypatch
):
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no bwrap here
    config = admin_config("http://127.0.0.1:9/v1", str(tmp_path / "ws"), agent={"shell_sandbox": "bwrap"})
    async with serving(sqlite_store, config) as h:
        await log_in(browser, base_url(h))
        assert (await browser.text("#llm-reachable")).startswith("Reachable no (since ")
        assert await browser.text("#llm-ready") == "Ready no (the last error below)"
        assert "set llm.base_url (LLM_BASE_URL)" in await browser.text("#llm-error")
        assert "bwrap is not installed" in await browser.text("#sandbox-mode")
        assert "apt-get install bubblewrap" in await browser.text("#sandbox-fix")
        await browser.screenshot("overview-model-down")


async def test_the_overview_tiles_lead_to_their_rows_and_a_missing_run_is_a_page(browser, sqlite_store, llm, tmp_path):
    llm.error(500, message="model crashed")
    config = admin_config(llm.base_url, str(tmp_path / "ws"), llm={"max_retries": 0})
    async with serving(sqlite_store, config) as h:
        base = base_url(h)
        await h.say("hi")
        await h.idle()
        failed = (await sqlite_store.runs.list())[0]
        await log_in(browser, base)
        await browser.click("a.tile[href$='stage=FAILED&since=1h']")
        assert (await browser.url()).endswith("/admin/runs?stage=FAILED&since=1h")
        assert str(failed.id) in await browser.text("#runs") and "FAILED" in await browser.text("#runs")
        await browser.click(f"#runs a[href$='/runs/{failed.id}']")
        assert await browser.text("#run-stage") == "FAILED"
        await browser.open(f"{base}/runs/{failed.id + 1000}")
        assert f"No run {failed.id + 1000}." in await browser.text("#not-found")
        await browser.click("#not-found a")
        assert (await browser.url()).endswith("/admin/")

