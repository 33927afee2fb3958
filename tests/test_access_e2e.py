"""Who may talk to the agent, end to end through Telegram and Slack (SQLite and PostgreSQL):
pairing by button and by the CLI, expired codes, groups nobody approved, roles on tools and
commands, and the fixed `allowed_users` lists of earlier set-ups."""

from __future__ import annotations

import io
import re
from typing import Any

from fakes.llm import FakeLLM, Reply
from fakes.telegram import FakeTelegram
from helpers import echo, session_file
from test_slack_e2e import DM as SLACK_DM
from test_slack_e2e import bot_messages as slack_bot_messages
from test_slack_e2e import buttons as slack_buttons
from test_slack_e2e import running as slack_running
from test_slack_e2e import slack_config
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import (
    GROUP,
    button,
    has_prompt,
    last_user_text,
    prompt_message,
    running,
    settle,
    texts,
    tg_config,
    until,
)

from gateway.__main__ import build_parser
from gateway.access import cli as access_cli
from gateway.approvals.routing import OWN_REQUEST_SEPARATE

STRANGER, ADMIN, FRIEND = 43, 7, 44
PAIRING = {"dm_policy": "pairing", "group_policy": "allowlist"}
CODE = re.compile(r"pairing code is ([A-Z0-9]{4}-[A-Z0-9]{4})")


def paired_config(llm: FakeLLM, tg: FakeTelegram, tmp_path, **access: Any):  # noqa: ANN201
    return tg_config(llm, tg, tmp_path, access={**PAIRING, **access}, approvals={"admins": {"telegram": [ADMIN]}})


def code_in(text: str) -> str:
    match = CODE.search(text)
    assert match, text
    return match.group(1)


async def cli(store, config, *argv: str) -> tuple[int, str]:  # noqa: ANN001
    out = io.StringIO()
    status = await access_cli.run(build_parser().parse_args(list(argv)), store, config, out)
    return status, out.getvalue()


# ---- pairing through Telegram -----------------------------------------------------------


async def test_a_strangers_dm_gets_a_code_and_is_answered_once_an_admin_approves(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    async with running(store, paired_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(STRANGER, "hello there", user_id=STRANGER, first_name="Sam", username="sam")
        await settle(gateway, lambda: bool(texts(tg, STRANGER)) and has_prompt(tg, ADMIN))
        (notice,) = texts(tg, STRANGER)
        code = code_in(notice)
        assert not llm.requests  # the message is kept, not sent to the model
        prompt = prompt_message(tg, ADMIN)
        assert "Sam" in prompt.text and "telegram:43" in prompt.text and code in prompt.text

        tg.press(ADMIN, prompt.message_id, button(prompt, "Approve"), user_id=ADMIN, first_name="Ada")
        await settle(gateway, lambda: "re: hello there" in texts(tg, STRANGER))
        closed = tg.messages[ADMIN][prompt.message_id]
        assert closed.buttons == [] and "Access approved by Ada" in closed.text
        assert [last_user_text(r) for r in llm.requests] == ["hello there"]

        tg.private_message(STRANGER, "and now?", user_id=STRANGER)
        await settle(gateway, lambda: "re: and now?" in texts(tg, STRANGER))
        assert texts(tg, STRANGER) == [notice, "re: hello there", "re: and now?"]
        status, listing = await cli(store, gateway.config, "access", "list")
        assert status == 0 and "telegram:43" in listing and "approved by telegram:7" in listing
    approved, requested = await store.audit.list_audit(kind="access")  # the trail, newest first
    assert (requested.action, requested.actor, requested.decided_by) == ("pairing_requested", "telegram:43", None)
    assert (approved.action, approved.decided_by, approved.via) == ("pairing_approved", "telegram:7", "button")


async def test_one_pending_code_per_person_and_only_admins_decide(store, llm, tg, tmp_path) -> None:
    async with running(store, paired_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(STRANGER, "one", user_id=STRANGER)
        tg.private_message(STRANGER, "two", user_id=STRANGER)
        await settle(gateway, lambda: len(texts(tg, STRANGER)) == 1)
        await gateway.inbox.wait_until_idle(10)
        (first,) = texts(tg, STRANGER)  # one reply per code, not one per message
        assert code_in(first) == (await store.access.pending())[0].code
        assert len(await store.inbox.pending(f"telegram:{STRANGER}:")) == 0  # both held, not pending
        assert len(await store.access.pending()) == 1 and len([m for m in tg.bot_messages(ADMIN) if m.buttons]) == 1
        prompt = prompt_message(tg, ADMIN)
        tg.press(ADMIN, prompt.message_id, button(prompt, "Approve"), user_id=FRIEND)  # not an admin
        await until(lambda: bool(tg.calls_to("answerCallbackQuery")))
        await gateway.inbox.wait_until_idle(10)
        assert tg.calls_to("answerCallbackQuery")[0].params["text"] == "Only an admin can decide access requests."
        assert not llm.requests and await store.access.grant_for("user", "telegram", str(STRANGER)) is None


async def test_pending_requests_per_channel_are_capped(store, llm, tg, tmp_path) -> None:
    async with running(store, paired_config(llm, tg, tmp_path, max_pending_per_channel=2)) as gateway:
        for person in (50, 51, 52):
            tg.private_message(person, "hi", user_id=person)
        await settle(gateway, lambda: all(texts(tg, p) for p in (50, 51, 52)))
        answers = sorted("code" if "pairing code" in texts(tg, p)[0] else texts(tg, p)[0] for p in (50, 51, 52))
        assert (
            answers[:2] == ["code", "code"] and "too many requests are waiting" in answers[2]
        )  # threads run concurrently
        assert len(await store.access.pending()) == 2 and not llm.requests


async def test_approval_by_the_cli_answers_the_held_message(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    config = tg_config(llm, tg, tmp_path, access=PAIRING)  # no admins: only the CLI can approve
    async with running(store, config) as gateway:
        tg.private_message(STRANGER, "waiting for you", user_id=STRANGER, first_name="Sam")
        await settle(gateway, lambda: bool(texts(tg, STRANGER)))
        code = code_in(texts(tg, STRANGER)[0])
        status, listing = await cli(store, config, "pairing", "list")
        assert status == 0 and code in listing and "Sam" in listing
        status, said = await cli(store, config, "pairing", "approve", code.lower().replace("-", ""))  # typed loosely
        assert status == 0 and "approved" in said
        await settle(gateway, lambda: "re: waiting for you" in texts(tg, STRANGER))
        assert await cli(store, config, "pairing", "approve", code) == (1, "")  # decided already
        status, _ = await cli(store, config, "access", "revoke", f"telegram:{STRANGER}")
        assert status == 0
        tg.private_message(STRANGER, "still there?", user_id=STRANGER)
        await settle(gateway, lambda: len(texts(tg, STRANGER)) == 3)
        assert "pairing code" in texts(tg, STRANGER)[-1] and len(llm.requests) == 1
    trail = [(r.action, r.decided_by, r.via) for r in await store.audit.list_audit(user=f"telegram:{STRANGER}")]
    assert trail == [
        ("pairing_requested", None, None), ("revoked", "cli", "cli"),
        ("pairing_approved", "cli", "cli"), ("pairing_requested", None, None),
    ]


async def test_an_approval_landing_while_the_code_is_sent_lets_the_message_be_answered(
    store, llm, tg, tmp_path
) -> None:
    """Approved (by the CLI, or on another instance) after the gatekeeper found the request
    pending, before the worker held the message: it is answered, not held for good."""
    llm.responder = echo
    config = tg_config(llm, tg, tmp_path, access=PAIRING)
    tg.fail_next("sendMessage", "429", retry_after=2)  # the code's send waits: the message is not held yet
    async with running(store, config) as gateway:
        tg.private_message(STRANGER, "waiting for you", user_id=STRANGER, first_name="Sam")
        await until(lambda: bool(tg.calls_to("sendMessage")))
        (request,) = await store.access.pending()
        assert (await cli(store, config, "pairing", "approve", request.code))[0] == 0
        await settle(gateway, lambda: "re: waiting for you" in texts(tg, STRANGER))


async def test_a_denied_request_drops_the_held_message(store, llm, tg, tmp_path) -> None:
    config = tg_config(llm, tg, tmp_path, access=PAIRING)
    async with running(store, config) as gateway:
        tg.private_message(STRANGER, "let me in", user_id=STRANGER)
        await settle(gateway, lambda: bool(texts(tg, STRANGER)))
        status, said = await cli(store, config, "pairing", "deny", code_in(texts(tg, STRANGER)[0]))
        assert status == 0 and "denied" in said
        await gateway.inbox.wait_until_idle(10)
        assert not llm.requests and await store.inbox.count_pending() == 0


async def test_an_expired_code_is_not_approved_and_a_new_one_is_given(store, llm, tg, tmp_path, clock) -> None:
    async with running(store, paired_config(llm, tg, tmp_path, pairing_ttl="1s"), clock=clock) as gateway:
        tg.private_message(STRANGER, "hello", user_id=STRANGER)
        await settle(gateway, lambda: bool(texts(tg, STRANGER)) and has_prompt(tg, ADMIN))
        old_code = code_in(texts(tg, STRANGER)[0])
        assert "expires in 1 s" in texts(tg, STRANGER)[0]
        prompt = prompt_message(tg, ADMIN)
        clock.advance(1)  # the code's expiry
        tg.press(ADMIN, prompt.message_id, button(prompt, "Approve"), user_id=ADMIN)
        await until(lambda: bool(tg.calls_to("answerCallbackQuery")))
        await gateway.inbox.wait_until_idle(10)
        answer = tg.calls_to("answerCallbackQuery")[0].params
        assert answer["text"] == "This access request has expired." and str(answer.get("show_alert")).lower() == "true"
        assert "Expired" in tg.messages[ADMIN][prompt.message_id].text
        assert await cli(store, gateway.config, "pairing", "approve", old_code) == (1, "")
        assert not llm.requests and await store.access.grant_for("user", "telegram", str(STRANGER)) is None

        tg.private_message(STRANGER, "hello again", user_id=STRANGER)
        await settle(gateway, lambda: len(texts(tg, STRANGER)) == 2)
        assert code_in(texts(tg, STRANGER)[1]) != old_code
        assert not llm.requests


async def test_a_group_nobody_approved_stays_silent_until_an_admin_approves_it(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    async with running(store, paired_config(llm, tg, tmp_path)) as gateway:
        tg.group_message(GROUP, "@test_bot what is new?", user_id=FRIEND, first_name="Fred")
        await settle(gateway, lambda: has_prompt(tg, ADMIN))
        assert not texts(tg, GROUP) and not llm.requests
        prompt = prompt_message(tg, ADMIN)
        assert str(GROUP) in prompt.text
        tg.press(ADMIN, prompt.message_id, button(prompt, "Approve"), user_id=ADMIN)
        await settle(gateway, lambda: "re: what is new?" in texts(tg, GROUP))
        tg.group_message(GROUP, "@test_bot and you?", user_id=FRIEND + 1)  # anyone in an approved group
        await settle(gateway, lambda: "re: and you?" in texts(tg, GROUP))


async def test_allowlist_refuses_strangers_and_answers_approved_chats(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    config = tg_config(llm, tg, tmp_path, access={"dm_policy": "allowlist", "group_policy": "allowlist"})
    await store.access.grant(kind="chat", channel="telegram", subject=str(GROUP), granted_by="test")
    async with running(store, config) as gateway:
        tg.group_message(GROUP, "@test_bot hi", user_id=FRIEND)
        tg.private_message(STRANGER, "hi", user_id=STRANGER)
        await settle(gateway, lambda: bool(texts(tg, GROUP)) and bool(texts(tg, STRANGER)))
        assert texts(tg, GROUP) == ["re: hi"]
        (refusal,) = texts(tg, STRANGER)
        assert refusal.startswith("Sorry, this assistant is private.")
        assert "the claim code" in refusal  # telegram has no admin yet: the stranger may be its owner
        assert len(llm.requests) == 1 and not await store.access.pending()


async def test_an_allowed_users_set_up_works_as_before(store, llm, tg, tmp_path) -> None:
    """Upgrading: a config with telegram.allowed_users and no access section (the defaults)."""
    llm.responder = echo
    config = tg_config(llm, tg, tmp_path, telegram={"allowed_users": [str(STRANGER)]})
    config = config.model_copy(update={"access": type(config.access)()})  # the defaults, as after an upgrade
    assert config.access.dm_policy == "pairing"
    async with running(store, config) as gateway:
        tg.private_message(STRANGER, "hi", user_id=STRANGER)
        tg.group_message(GROUP, "@test_bot in the group", user_id=STRANGER)
        tg.private_message(FRIEND, "me too?", user_id=FRIEND)
        await settle(gateway, lambda: bool(texts(tg, STRANGER)) and bool(texts(tg, GROUP)) and bool(texts(tg, FRIEND)))
        assert texts(tg, STRANGER) == ["re: hi"] and texts(tg, GROUP) == ["re: in the group"]
        assert "Your Telegram id is 44" in texts(tg, FRIEND)[0]  # the refusal of before, no pairing
        assert not await store.access.pending() and len(llm.requests) == 2


# ---- roles ------------------------------------------------------------------------------

ROLES = {"dm_policy": "open", "roles": {"member": {"tools": ["*"], "deny_tools": ["shell"]}}}


def offered(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools") or []}


def told_refused(request: dict[str, Any], tool: str) -> bool:
    """Whether the request's tail names `tool` among those this turn's people may not use (the
    tools array is the same whoever asks: a provider caches it with the prompt)."""
    tail = str(request["messages"][-1]["content"])
    return "does not allow them): " in tail and tool in tail.split("does not allow them): ", 1)[1].split("\n")[0]


async def test_a_member_is_told_a_denied_tool_is_refused_and_a_forced_call_is(store, llm, tg, tmp_path) -> None:
    config = tg_config(llm, tg, tmp_path, access=ROLES, approvals={"admins": {"telegram": [ADMIN]}})
    llm.tool_call("shell", {"command": "echo pwned > pwned.txt"}, id="s1")
    llm.responder = lambda request: Reply(
        f"tool said: {[m['content'] for m in request['messages'] if m['role'] == 'tool'][-1]}"
    )
    async with running(store, config) as gateway:
        tg.private_message(STRANGER, "run it", user_id=STRANGER)
        await settle(gateway, lambda: any(t.startswith("tool said") for t in texts(tg, STRANGER)))
        assert told_refused(llm.requests[0], "shell") and not told_refused(llm.requests[0], "read_file")
        assert texts(tg, STRANGER)[-1] == "tool said: Tool call denied: the role 'member' may not use 'shell'."
        assert not session_file(tmp_path / "ws", "pwned.txt").exists() and not has_prompt(tg, STRANGER)
        llm.responder = echo
        tg.private_message(ADMIN, "and me?", user_id=ADMIN)
        await settle(gateway, lambda: bool(texts(tg, ADMIN)))
        assert offered(llm.requests[-1]) == offered(llm.requests[0])  # the same array for both
        assert not told_refused(llm.requests[-1], "shell")  # an admin's turn may use it


async def test_separate_requester_and_approving_roles(store, llm, tg, tmp_path) -> None:
    config = tg_config(
        llm,
        tg,
        tmp_path,
        access={
            "dm_policy": "open",
            "group_policy": "open",
            "roles": {"reviewer": {"approve": True}},
            "users": {f"telegram:{FRIEND}": "reviewer"},
        },
        approvals={"separate_requester": True},
    )
    llm.tool_call("write_file", {"path": "note.txt", "content": "hi"}, id="w1")
    llm.reply("Written.")
    async with running(store, config) as gateway:
        tg.group_message(GROUP, "@test_bot write a note", user_id=STRANGER)
        await settle(gateway, lambda: has_prompt(tg, GROUP))
        prompt = prompt_message(tg, GROUP)
        tg.press(GROUP, prompt.message_id, button(prompt, "Approve"), user_id=STRANGER)  # the requester
        await until(lambda: bool(tg.calls_to("answerCallbackQuery")))
        await gateway.inbox.wait_until_idle(10)
        assert tg.calls_to("answerCallbackQuery")[0].params["text"] == OWN_REQUEST_SEPARATE
        assert not session_file(tmp_path / "ws", "note.txt").exists()
        tg.press(GROUP, prompt.message_id, button(prompt, "Approve"), user_id=FRIEND, first_name="Rita")  # a reviewer
        await settle(gateway, lambda: "Written." in texts(tg, GROUP))
        assert session_file(tmp_path / "ws", "note.txt").exists() and "Approved by Rita" in tg.messages[GROUP][
            prompt.message_id
        ].text


async def test_roles_decide_who_may_compact_and_start_over_for_others(store, llm, tg, tmp_path) -> None:
    config = tg_config(
        llm,
        tg,
        tmp_path,
        access={
            "dm_policy": "open",
            "group_policy": "open",
            "roles": {"guest": {"compact": False}},
            "users": {f"telegram:{FRIEND}": "guest"},
        },
    )
    llm.responder = echo
    async with running(store, config) as gateway:
        tg.group_message(GROUP, "@test_bot hello", user_id=STRANGER)
        await settle(gateway, lambda: bool(texts(tg, GROUP)))
        session = await store.sessions.current(f"telegram:{GROUP}:")
        tg.group_message(GROUP, "/new@test_bot", user_id=FRIEND)
        tg.group_message(GROUP, "/compact@test_bot", user_id=FRIEND)
        await settle(gateway, lambda: len(texts(tg, GROUP)) == 3)
        assert "may not run /new for others" in texts(tg, GROUP)[1]
        assert "may not run /compact" in texts(tg, GROUP)[2]
        assert (await store.sessions.current(f"telegram:{GROUP}:")).id == session.id
        tg.group_message(GROUP, "/new@test_bot", user_id=STRANGER)  # the one who started it may
        await settle(gateway, lambda: "Started a new session." in texts(tg, GROUP))


# ---- Slack ------------------------------------------------------------------------------

ANN, BOB = "U1", "U2"  # FakeSlack's people: Ann asks, Bob is the admin


async def test_slack_a_strangers_dm_is_paired_by_the_admins_button(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    config = slack_config(llm, slack, tmp_path, access=PAIRING, approvals={"admins": {"slack": [BOB]}})
    async with slack_running(store, config, slack) as side:
        await side.dm("hello from slack")
        await side.settle(
            lambda: (
                bool(slack_texts(slack, SLACK_DM)) and any(slack_buttons(m) for m in slack_bot_messages(slack, "D2"))
            )
        )
        (notice,) = slack_texts(slack, SLACK_DM)
        code = code_in(notice)
        assert not llm.requests
        prompt = next(m for m in slack_bot_messages(slack, "D2") if slack_buttons(m))  # Bob's DM, opened by the gateway
        assert code in prompt["text"] and "slack:U1" in prompt["text"]
        await side.click(prompt, "Approve", user=BOB, channel="D2")
        await side.settle(lambda: "re: hello from slack" in slack_texts(slack, SLACK_DM))
        assert not slack_buttons(slack.message("D2", prompt["ts"]))
        assert [c.params["users"] for c in slack.calls_to("conversations.open")] == [BOB]


async def test_slack_a_member_whose_role_denies_shell(store, llm, slack, tmp_path) -> None:
    config = slack_config(llm, slack, tmp_path, access=ROLES)
    llm.tool_call("shell", {"command": "echo pwned > pwned.txt"}, id="s1")
    llm.reply("done")
    async with slack_running(store, config, slack) as side:
        await side.mention("run it")
        await side.settle(lambda: len(llm.requests) == 2)
        assert told_refused(llm.requests[0], "shell")
        tool_result = [m["content"] for m in llm.requests[1]["messages"] if m["role"] == "tool"][-1]
        assert tool_result == "Tool call denied: the role 'member' may not use 'shell'."
        assert not session_file(tmp_path / "ws", "pwned.txt").exists()


async def test_slack_a_channel_nobody_approved_stays_silent(store, llm, slack, tmp_path) -> None:
    config = slack_config(llm, slack, tmp_path, access=PAIRING, approvals={"admins": {"slack": [BOB]}})
    async with slack_running(store, config, slack) as side:
        await side.mention("anyone home?")
        await side.settle(lambda: any(slack_buttons(m) for m in slack_bot_messages(slack, "D2")))
        assert not slack_bot_messages(slack) and not llm.requests
        assert [r.kind for r in await store.access.pending()] == ["chat"]
