"""The console and the admin API over HTTP: login, cookies, CSRF, bearer tokens, and an
approval decided from the console that resumes the turn in its chat."""

from __future__ import annotations

import aiohttp
from admin_support import TOKEN, admin_config, base_url, csrf_of, logged_in, serving
from helpers import session_file

from gateway.admin.auth import LOGIN_FAILURES


def jar() -> aiohttp.CookieJar:
    return aiohttp.CookieJar(unsafe=True)  # cookies for 127.0.0.1


async def test_login_sets_a_strict_httponly_session_cookie(store, llm, tmp_path):
    async with serving(store, admin_config(llm.base_url, str(tmp_path / "ws"))) as h:
        base = base_url(h)
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            async with http.get(f"{base}/", allow_redirects=False) as response:
                assert response.status == 303 and response.headers["Location"] == "/admin/login"
            async with http.post(f"{base}/login", data={"token": TOKEN}, allow_redirects=False) as response:
                assert response.status == 303
                cookie = response.headers["Set-Cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/admin" in cookie
            assert TOKEN not in cookie
            async with http.get(f"{base}/") as response:
                page = await response.text()
            assert response.status == 200 and "Turns running" in page and "Log out admin" in page
            assert TOKEN not in page  # the configuration view redacts it


async def test_a_wrong_token_is_refused_clearly_and_rate_limited(store, llm, tmp_path):
    async with serving(store, admin_config(llm.base_url, str(tmp_path / "ws"))) as h:
        base = base_url(h)
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            for _ in range(LOGIN_FAILURES):
                async with http.post(f"{base}/login", data={"token": "nope"}) as response:
                    assert response.status == 401 and "Wrong token." in await response.text()
            async with http.post(f"{base}/login", data={"token": TOKEN}) as response:
                assert response.status == 429 and "Too many wrong tokens" in await response.text()
            assert len(http.cookie_jar) == 0


async def test_a_post_without_its_csrf_token_is_refused(store, llm, tmp_path):
    async with serving(store, admin_config(llm.base_url, str(tmp_path / "ws"))) as h:
        base = base_url(h)
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            page = await logged_in(http, base)
            for data in ({}, {"csrf": "forged"}):
                async with http.post(f"{base}/logout", data=data) as response:
                    assert response.status == 403 and "CSRF" in await response.text()
            async with http.get(f"{base}/", allow_redirects=False) as response:
                assert response.status == 200  # still logged in
            async with http.post(f"{base}/logout", data={"csrf": csrf_of(page)}, allow_redirects=False) as response:
                assert response.status == 303
            async with http.get(f"{base}/", allow_redirects=False) as response:
                assert response.status == 303  # the session is gone


async def test_the_api_wants_the_bearer_token(store, llm, tmp_path):
    async with serving(store, admin_config(llm.base_url, str(tmp_path / "ws"))) as h:
        base = base_url(h)
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                async with http.get(f"{base}/api/overview", headers=headers) as response:
                    assert response.status == 401
            async with http.get(f"{base}/api/overview", headers={"Authorization": f"Bearer {TOKEN}"}) as response:
                body = await response.json()
            assert response.status == 200
            assert body["channels"] == {"fake": "running", "cron": "running", "tick": "running"}
            assert body["instance"] == h.gateway.inbox.instance_id
            assert body["turns_running"] == 0 and body["inbox"]["pending"] == 0


async def test_without_a_token_the_console_is_off(store, llm, tmp_path, caplog):
    caplog.set_level("INFO")
    async with serving(store, admin_config(llm.base_url, str(tmp_path / "ws"), token="")) as h:
        async with aiohttp.ClientSession() as http:
            for path in ("/login", "/api/overview"):
                async with http.get(base_url(h) + path) as response:
                    assert response.status == 404
    assert "set GATEWAY_ADMIN_TOKEN to enable /admin" in caplog.text


async def test_approving_through_the_api_resumes_the_turn_in_its_chat(store, llm, tmp_path):
    llm.tool_call("write_file", {"path": "note.txt", "content": "hi"}, id="w1")
    llm.reply("Written.")
    async with serving(store, admin_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("write a note")
        await h.idle()
        auth = {"Authorization": f"Bearer {TOKEN}", "X-Admin-User": "carol"}
        async with aiohttp.ClientSession(headers=auth) as http:
            async with http.get(f"{base_url(h)}/api/approvals") as response:
                pending = (await response.json())["pending"]
            assert [p["payload"]["tool"] for p in pending] == ["write_file"]
            url = f"{base_url(h)}/api/approvals/{pending[0]['id']}/approve"
            async with http.post(url) as response:
                body = await response.json()
            assert response.status == 200 and body == {"ok": True, "message": "✅ Approved by carol (console)"}
            async with http.post(url) as response:  # the second decision changes nothing
                assert response.status == 409 and not (await response.json())["ok"]
        await h.idle()
        assert session_file(tmp_path / "ws", "note.txt").read_text() == "hi"
        assert h.channel.messages()[-1] == "Written."
        decided = await store.prompts.get(pending[0]["id"])
        assert (decided.status, decided.decided_by) == ("approved", "console:carol")


async def test_console_logins_and_actions_are_in_the_audit_trail(store, llm, tmp_path):
    async with serving(store, admin_config(llm.base_url, str(tmp_path / "ws"))) as h:
        base = base_url(h)
        async with aiohttp.ClientSession(cookie_jar=jar()) as http:
            async with http.post(f"{base}/login", data={"user": "mallory", "token": "guess"}) as response:
                assert response.status == 401
            await logged_in(http, base, user="erin")
        auth = {"Authorization": f"Bearer {TOKEN}", "X-Admin-User": "erin"}
        async with aiohttp.ClientSession(headers=auth) as http:
            async with http.post(f"{base}/api/approvals/99/approve") as response:
                assert response.status == 409 and (await response.json())["message"] == "no approval request 99"
            async with http.get(f"{base}/api/audit", params={"since": "1h", "user": "erin"}) as response:
                entries = (await response.json())["entries"]
            assert [(e["action"], e["outcome"]) for e in entries] == [("approve", "refused"), ("login", "ok")]
            async with http.get(f"{base}/api/audit", params={"kind": "console_login"}) as response:
                logins = (await response.json())["entries"]
            assert [(e["actor"], e["outcome"]) for e in logins] == [("erin", "ok"), ("mallory", "refused")]
            async with http.get(f"{base}/api/audit", params={"since": "yesterday"}) as response:
                assert response.status == 400 and "since:" in (await response.json())["error"]
