"""Approvals are decided by the owner's people (docs/security.md, "Who may run what" 1 and 2):
a member cannot approve their own `write_file` / `shell`; in a group the prompt waits for an
admin there (the member's tap is refused), in a DM it goes to the admins' DMs and the member
is told it waits; a standing approval covers the requester's later calls, not another member's.
The one-person set-up (the owner is an admin) stays one tap."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from helpers import tool_results, until
from security_support import written
from test_chat_cli import child_env
from test_slack_e2e import DM as SLACK_DM
from test_slack_e2e import bot_messages as slack_bot_messages
from test_slack_e2e import buttons as slack_buttons
from test_slack_e2e import running as slack_running
from test_slack_e2e import slack_config
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import answers, button, has_prompt, prompt_message, running, settle, texts, tg_config

from gateway.approvals.routing import OWN_REQUEST
from gateway.config import ApprovalsConfig

MEMBER, ADMIN, OTHER = 43, 7, 44
GROUP = -100200300
DEFAULT = {"self_approve": False}  # the tests' harness opts in to the behaviour of before; these try the default


def config(llm, tg, tmp_path, **approvals):  # noqa: ANN001, ANN003, ANN201
    return tg_config(llm, tg, tmp_path, approvals={**DEFAULT, "admins": {"telegram": [ADMIN]}, **approvals})


def test_the_default_is_that_the_requester_does_not_decide() -> None:
    assert ApprovalsConfig().self_approve is False


async def test_in_a_group_a_member_cannot_approve_their_own_call(store, llm, tg, tmp_path) -> None:
    llm.tool_call("write_file", {"path": "pwned.txt", "content": "x"}, id="w1")
    llm.reply("Written.")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        tg.group_message(GROUP, "@test_bot write it", user_id=MEMBER, first_name="Mel")
        await settle(gateway, lambda: has_prompt(tg, GROUP))
        prompt = prompt_message(tg, GROUP)
        assert "An admin decides" in prompt.text
        tg.press(GROUP, prompt.message_id, button(prompt, "Approve"), user_id=MEMBER)
        await until(lambda: len(answers(tg)) == 1)
        await gateway.inbox.wait_until_idle(10)
        assert answers(tg) == [(OWN_REQUEST, True)]  # who decides instead
        assert not written(tmp_path, "pwned.txt")
        tg.press(GROUP, prompt.message_id, button(prompt, "Approve"), user_id=ADMIN, first_name="Ada")
        await settle(gateway, lambda: "Written." in texts(tg, GROUP))
        assert written(tmp_path, "pwned.txt")


async def test_a_members_dm_request_goes_to_the_admins_dm(store, llm, tg, tmp_path) -> None:
    llm.tool_call("shell", {"command": "echo hi > made.txt"}, id="s1")
    llm.reply("Done.")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        tg.private_message(MEMBER, "run it", user_id=MEMBER, first_name="Mel")
        await settle(gateway, lambda: has_prompt(tg, ADMIN) and bool(texts(tg, MEMBER)))
        assert not has_prompt(tg, MEMBER)  # no buttons where they cannot count
        assert "needs an admin's approval" in texts(tg, MEMBER)[0]
        copy = prompt_message(tg, ADMIN)
        assert "Mel" in copy.text and "telegram:43" in copy.text and "direct message" in copy.text
        tg.private_message(MEMBER, "well?", user_id=MEMBER)  # held: not theirs to decide
        await settle(gateway, lambda: len(texts(tg, MEMBER)) == 2)
        assert "Waiting for an admin's decision" in texts(tg, MEMBER)[1]
        tg.press(MEMBER, copy.message_id, button(copy, "Approve"), user_id=MEMBER)  # a forged tap of theirs
        await until(lambda: len(answers(tg)) == 1)
        assert answers(tg) == [(OWN_REQUEST, True)]  # who decides instead
        assert not written(tmp_path, "made.txt")
        tg.press(ADMIN, copy.message_id, button(copy, "Approve"), user_id=ADMIN, first_name="Ada")
        await settle(gateway, lambda: "Done." in texts(tg, MEMBER))
        assert written(tmp_path, "made.txt")
        assert tg.messages[ADMIN][copy.message_id].buttons == []  # the copy is closed with the outcome
        assert "Approved by Ada" in tg.messages[ADMIN][copy.message_id].text


async def test_the_owner_as_admin_approves_their_own_request_in_one_tap(store, llm, tg, tmp_path) -> None:
    llm.tool_call("write_file", {"path": "mine.txt", "content": "x"}, id="w1")
    llm.reply("Written.")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        tg.private_message(ADMIN, "write it", user_id=ADMIN)
        await settle(gateway, lambda: has_prompt(tg, ADMIN))
        prompt = prompt_message(tg, ADMIN)
        tg.press(ADMIN, prompt.message_id, button(prompt, "Approve"), user_id=ADMIN)
        await settle(gateway, lambda: "Written." in texts(tg, ADMIN))
        assert written(tmp_path, "mine.txt") and len(tg.bot_messages(ADMIN)) == 2


@pytest.mark.parametrize("label", ["Allow 15 min", "Allow in this chat"])
async def test_a_standing_approval_covers_the_requester_only(store, llm, tg, tmp_path, label) -> None:
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        llm.tool_call("shell", {"command": "echo first"}, id="s1")
        llm.reply("one")
        tg.group_message(GROUP, "@test_bot run it", user_id=MEMBER)
        await settle(gateway, lambda: has_prompt(tg, GROUP))
        prompt = prompt_message(tg, GROUP)
        tg.press(GROUP, prompt.message_id, button(prompt, label), user_id=ADMIN)
        await settle(gateway, lambda: "one" in texts(tg, GROUP))

        llm.tool_call("shell", {"command": "echo second"}, id="s2")
        llm.reply("two")
        tg.group_message(GROUP, "@test_bot again", user_id=MEMBER)  # the requester: covered
        await settle(gateway, lambda: "two" in texts(tg, GROUP))
        assert "second" in tool_results(llm.requests[-1])[-1]

        llm.tool_call("shell", {"command": "echo third"}, id="s3")
        tg.group_message(GROUP, "@test_bot me too", user_id=OTHER)  # another member: asked again
        await settle(gateway, lambda: len([m for m in tg.bot_messages(GROUP) if m.buttons]) == 1
                     and len(llm.requests) == 5)
        assert len(await store.prompts.pending(thread_key=f"telegram:{GROUP}:")) == 1


async def test_slack_a_members_dm_request_goes_to_the_admins_dm(store, llm, slack, tmp_path) -> None:
    llm.tool_call("shell", {"command": "echo hi > made.txt"}, id="s1")
    llm.reply("Done.")
    config = slack_config(llm, slack, tmp_path, approvals={**DEFAULT, "admins": {"slack": ["U2"]}})
    async with slack_running(store, config, slack) as side:
        await side.dm("run it")  # Ann (U1), a member
        await side.settle(lambda: any(slack_buttons(m) for m in slack_bot_messages(slack, "D2")))
        assert "needs an admin's approval" in slack_texts(slack, SLACK_DM)[0]
        assert not any(slack_buttons(m) for m in slack_bot_messages(slack, SLACK_DM))
        copy = next(m for m in slack_bot_messages(slack, "D2") if slack_buttons(m))  # Bob's DM
        await side.click(copy, "Approve", user="U2", channel="D2")
        await side.settle(lambda: "Done." in slack_texts(slack, SLACK_DM))
        assert written(tmp_path, "made.txt")


def test_doctor_warns_when_no_admin_is_configured(tmp_path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = tmp_path / "config.yml"
    path.write_text(f"llm:\n  base_url: http://127.0.0.1:{port}/v1\n  model: m\n")
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "doctor", "--config", str(path), "--log-level", "warning"],
        env={**child_env(), "TELEGRAM_BOT_TOKEN": "1:abc"}, capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert "! admins (telegram): no admin" in done.stdout and "approvals.admins" in done.stdout, done.stdout
