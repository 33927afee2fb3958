"""The first hour in `gateway chat` and the web console.

`gateway chat` runs as a real process against the scripted LLM server: a turn waiting on a
prompt shows the prompt again after a restart (and a number typed then decides it); a number
that is no button is answered in the terminal and never reaches the agent; the terminal says
what to type, never "tap". The console is read over HTTP: the overview's model server and
sandbox rows, its tiles linking to the pages that list what they count, and a run that does
not exist answered by a 404 page in the console's layout.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
from admin_support import TOKEN, admin_config, base_url, logged_in, serving
from fakes.llm import FakeLLM, user_texts
from harness import make_config
from helpers import tool_results
from test_chat_cli import ChatProcess, button_number, write_config

from gateway.events import utcnow
from gateway.llm import LLMClient, LLMError
from gateway.llm.health import model_server_state
from gateway.store import NewItem


@pytest.fixture
def config(tmp_path: Path, llm: FakeLLM) -> Path:
    return write_config(tmp_path, llm.base_url)


def choices_of(prompt: str) -> list[str]:
    return re.findall(r"^\s*\[(\d+)\]", prompt, re.M)


# ---- gateway chat ---------------------------------------------------------------------------


@pytest.mark.parametrize("ended_by", ["quit", "kill -9"])
async def test_a_prompt_waiting_over_a_restart_is_shown_again_and_a_number_decides_it(
    config: Path, llm: FakeLLM, ended_by: str
):
    assert config.read_text().endswith("inbox:\n  poll_interval_s: 0.1\n")
    with config.open("a") as file:  # the killed holder's lease on the thread runs out soon
        file.write("  lease_ttl_s: 2\n")
    llm.tool_call("shell", {"command": "echo decided-after-restart"}, id="call_1")
    llm.reply("The command ran after the restart.")
    chat = await ChatProcess.start(config)
    try:
        await chat.type("run the echo command")
        first = await chat.expect("Allow in this chat")
        assert "echo decided-after-restart" in first
        if ended_by == "quit":
            assert await chat.quit() == 0
    finally:
        await chat.kill()

    chat = await ChatProcess.start(config)
    try:
        shown = await chat.expect("Allow in this chat")  # before anything is typed
        assert "Approve `shell`?" in shown and "echo decided-after-restart" in shown, shown
        assert choices_of(shown) == ["1", "2", "3", "4"], shown
        assert "Waiting for a decision" not in shown
        assert len(llm.requests) == 1, "the parked turn went on before the decision"
        await chat.type(button_number(shown, "Approve"))
        await chat.expect("Approved")
        await chat.expect("The command ran after the restart.")
        assert any("decided-after-restart" in r for r in tool_results(llm.requests[-1]))
        assert await chat.quit() == 0
    finally:
        await chat.kill()


async def test_a_number_that_is_no_choice_is_answered_and_never_reaches_the_agent(config: Path, llm: FakeLLM):
    llm.tool_call("shell", {"command": "echo chosen"}, id="call_1")
    llm.reply("Done choosing.")
    chat = await ChatProcess.start(config)
    try:
        await chat.type("run it")
        prompt = await chat.expect("Allow in this chat")
        for typed in ("7", "0", "12"):
            await chat.type(typed)
            assert "Choose 1-4" in await chat.expect("Choose 1-4"), typed
        await chat.type(button_number(prompt, "Deny"))
        await chat.expect("Denied")
        await chat.expect("Done choosing.")
        assert await chat.quit() == 0
    finally:
        await chat.kill()
    assert len(llm.requests) == 2
    assert tool_results(llm.requests[-1])[-1] == "User rejected this tool call.", "a typed number became the reason"
    assert all(typed not in user_texts(r) for r in llm.requests for typed in ("7", "0", "12"))
    assert "Waiting for a decision" not in chat.out


async def test_the_terminal_says_what_to_type_and_never_tap(config: Path, llm: FakeLLM):
    llm.tool_call("shell", {"command": "echo typed"}, id="call_1")
    llm.reply("It ran.")
    chat = await ChatProcess.start(config)
    try:
        await chat.type("run it")
        prompt = await chat.expect("to choose.")
        assert prompt.rstrip().endswith("Allow in this chat\nType 1-4 to choose."), prompt
        await chat.type("why do you need the shell?")  # a message while the request waits
        notice = await chat.expect("your message is used as the reason")
        assert "type its number" in notice, notice
        await chat.type(button_number(prompt, "Approve"))
        await chat.expect("It ran.")
        assert await chat.quit() == 0
    finally:
        await chat.kill()
    assert "tap" not in chat.out.lower(), chat.out


# ---- the console ----------------------------------------------------------------------------


async def test_the_model_servers_account_follows_its_requests(llm: FakeLLM):
    config = make_config(llm.base_url, "/unused", llm={"max_retries": 0}).llm
    async with LLMClient(config, backoff_base_s=0.01) as client:
        assert model_server_state(client)["reachable"] is None  # nothing asked yet
        assert model_server_state(client)["window"] is None
        llm.reply("hi")
        await client.complete([{"role": "user", "content": "hello"}])
        await client.context_window()
        state = model_server_state(client)
        assert state["reachable"] is True and state["error"] == "" and state["answered_at"] is not None
        assert state["window"] and state["window_source"] != "fallback"
        llm.error(500, message="the model crashed")
        with pytest.raises(LLMError):
            await client.complete([{"role": "user", "content": "again"}])
        state = model_server_state(client)
        assert state["reachable"] is True, "an HTTP error is an answer: the server is there"
        assert "the model crashed" in state["error"] and state["error_kind"] == "server"
    dead = make_config("http://127.0.0.1:9/v1", "/unused", llm={"max_retries": 0}).llm
    async with LLMClient(dead, backoff_base_s=0.01) as client:
        with pytest.raises(LLMError):
            await client.complete([{"role": "user", "content": "hello"}])
        state = model_server_state(client)
        assert state["reachable"] is False and state["error_kind"] == "connection" and state["error_at"] is not None


async def open_overview(h) -> tuple[aiohttp.ClientSession, str]:  # noqa: ANN001
    """A logged-in client (to close) and the overview page it read."""
    http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    await logged_in(http, base_url(h))
    async with http.get(f"{base_url(h)}/") as response:
        assert response.status == 200
        return http, await response.text()


def row(page: str, row_id: str) -> str:
    """The text of the table row with this id, tags removed."""
    found = re.search(rf'<tr id="{row_id}"[^>]*>(.*?)</tr>', page, re.S)
    assert found, f"no row {row_id} on the page"
    return " ".join(re.sub(r"<[^>]+>", " ", found.group(1)).split())


WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


async def test_the_overview_shows_the_model_server_and_the_sandbox(store, llm, tmp_path):
    config = admin_config(llm.base_url, str(tmp_path / "ws"), agent={"shell_sandbox": "none"})
    async with serving(store, config) as h:
        http, page = await open_overview(h)  # the start's check has asked the server: nobody has talked yet
        async with http:
            assert re.fullmatch(rf"Reachable yes \(last answer {WHEN} \)", row(page, "llm-reachable")), page
            assert row(page, "llm-ready") == "Ready yes"
            assert row(page, "llm-server") == f"Server {llm.base_url}"
            assert row(page, "llm-model") == "Model test-model"
            window = row(page, "llm-window")
            assert re.fullmatch(r"Context window [\d,]+ tokens \(.+\)", window) and "assumed" not in window, window
            assert row(page, "llm-error") == "Last error none"
            assert "none: commands run unconfined" in row(page, "sandbox-mode")
            assert row(page, "sandbox-setting") == "Setting agent.shell_sandbox: none"
            assert row(page, "sandbox-shell") == "Shell offered yes"
            assert "bubblewrap" in row(page, "sandbox-fix")
            async with http.get(f"{base_url(h)}/api/overview", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                body = await r.json()
            assert body["model_server"]["reachable"] is True and body["model_server"]["model"] == "test-model"
            assert body["sandbox"]["mode"] == "none" and body["sandbox"]["offered"] is True


async def test_the_overview_tells_an_unreachable_model_server_and_its_last_error(store, llm, tmp_path):
    dead = "http://user:s3cret-pass@127.0.0.1:9/v1"  # nothing listens on the discard port
    config = admin_config(dead, str(tmp_path / "ws"), llm={"max_retries": 0, "context_window": 4096})
    async with serving(store, config) as h:
        await h.say("hi")
        await h.idle()
        http, page = await open_overview(h)
        async with http:
            assert re.fullmatch(rf"Reachable no \(since {WHEN} \)", row(page, "llm-reachable")), page
            assert row(page, "llm-ready") == "Ready no (the last error below)", row(page, "llm-ready")
            assert row(page, "llm-server") == "Server http://••••@127.0.0.1:9/v1"
            assert row(page, "llm-window") == "Context window 4,096 tokens (llm.context_window)"
            error = row(page, "llm-error")
            assert re.fullmatch(rf"Last error .*(connect|reach).* \( ?{WHEN} ?\)", error, re.I), error
            assert "s3cret-pass" not in page
            failed = (await store.runs.list())[0]
            for path in (f"/runs/{failed.id}", "/runs?stage=FAILED"):
                async with http.get(f"{base_url(h)}{path}") as response:
                    shown = await response.text()
                assert response.status == 200 and "cannot reach" in shown and "s3cret-pass" not in shown, path
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            for path in (f"/api/runs/{failed.id}", "/api/runs?stage=FAILED", "/api/overview"):
                async with http.get(f"{base_url(h)}{path}", headers=bearer) as response:
                    assert response.status == 200 and "s3cret-pass" not in await response.text(), path


async def test_a_missing_sandbox_is_shown_with_its_fix(store, llm, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # neither bwrap nor unshare on PATH
    config = admin_config(llm.base_url, str(tmp_path / "ws"), agent={"shell_sandbox": "bwrap"})
    async with serving(store, config) as h:
        http, page = await open_overview(h)
        async with http:
            assert "bwrap is not installed" in row(page, "sandbox-mode"), row(page, "sandbox-mode")
            assert row(page, "sandbox-shell") == "Shell offered no (its sandbox is missing)"
            assert "apt-get install bubblewrap" in row(page, "sandbox-fix")


async def test_each_tile_links_to_the_page_of_what_it_counts(store, llm, tmp_path):
    llm.tool_call("write_file", {"path": "a.txt", "content": "x"}, id="w1")
    config = admin_config(llm.base_url, str(tmp_path / "ws"))
    async with serving(store, config) as h:
        await h.say("write a file")
        await h.idle()  # parked on its approval
        http, page = await open_overview(h)
        async with http:
            links = dict(re.findall(r'<a class="tile[^"]*" href="([^"]+)"[^>]*>\s*<span>([^<]+)</span>', page))
            assert set(links.values()) >= {
                "Turns running", "Awaiting input", "Inbox depth", "Stuck outbox rows", "Errors, last hour",
            }, links
            for href, label in links.items():
                async with http.get(f"http://127.0.0.1:{h.gateway.http.port}{href.replace('&amp;', '&')}") as response:
                    assert response.status == 200, (label, href)
                    target = await response.text()
                if label == "Awaiting input":
                    assert "approval of write_file" in target, "the parked run is not on the awaiting page"
            async with http.get(f"{base_url(h)}/runs", params={"stage": "BOGUS"}) as response:
                assert response.status == 400 and "stage: expected one of" in await response.text()
            async with http.get(f"{base_url(h)}/runs", params={"since": "yesterday"}) as response:
                assert response.status == 400 and "since: expected a duration" in await response.text()


async def test_the_queues_page_lists_the_rows_behind_the_inbox_and_outbox_tiles(store, llm, tmp_path):
    config = admin_config(llm.base_url, str(tmp_path / "ws"))
    async with serving(store, config) as h:
        # Items of a thread another (stalled) instance holds: they wait, as the inbox depth counts them.
        assert await store.inbox.acquire("thread:fake:7:", "stalled-instance", 600) is not None
        await store.inbox.add([NewItem(f"q{i}", "fake:7:", "message", {"text": "words-of-a-person"}) for i in range(3)])
        row = await store.outbox.record("stuck-1", "nowhere:8:", "message", {"text": "words-never-sent"})
        await store.outbox.attempt_failed(row.id, "chat not found", final=False)
        stuck_after = timedelta(seconds=config.outbox.sweep_after_s)
        later = utcnow() + stuck_after + timedelta(seconds=5)
        assert [r.key for r in await store.console.stuck_outbox(stuck_after=stuck_after, now=later)] == ["stuck-1"]
        waiting = await store.console.waiting_threads()
        assert [(t.thread_key, t.pending) for t in waiting] == [("fake:7:", 3)]
        assert waiting[0].oldest.tzinfo is not None and waiting[0].oldest <= utcnow()
        http, page = await open_overview(h)
        async with http:
            assert re.search(r'id="inbox-depth">3<', page), "the tile counts the same rows"
            async with http.get(f"{base_url(h)}/queues") as response:
                queues = await response.text()
            assert "fake:7:" in queues
            assert "words-of-a-person" not in queues and "words-never-sent" not in queues  # what, never the text


async def test_a_run_that_does_not_exist_is_a_404_page_in_the_console(store, llm, tmp_path):
    async with serving(store, admin_config(llm.base_url, str(tmp_path / "ws"))) as h:
        base = base_url(h)
        http, _ = await open_overview(h)
        async with http:
            for path in ("/runs/4242", "/runs/99999999999999999999999", "/runs/abc", "/sessions/4242", "/nowhere"):
                async with http.get(f"{base}{path}") as response:
                    page = await response.text()
                    assert response.status == 404, (path, page[:300])
                    assert response.content_type == "text/html", path
                    assert "Log out" in page and 'id="not-found"' in page, (path, page[:300])
                    assert f'href="{base_url(h).removeprefix(f"http://127.0.0.1:{h.gateway.http.port}")}/' in page
            async with http.get(f"{base}/runs/4242") as response:
                assert "No run 4242" in await response.text()
        async with aiohttp.ClientSession() as anonymous:  # not logged in: the login, not what exists
            async with anonymous.get(f"{base}/runs/4242", allow_redirects=False) as response:
                assert response.status == 303
