"""The first hour: the owner claims a chat channel that has no admin, end to end through the fake
Bot API (real PTB) and the fake Slack, on SQLite and PostgreSQL (docs/access.md, "Claiming the
owner").

With the default configuration (`approvals.self_approve: false`, nobody in `approvals.admins`)
the start log shows a one-time code on its claim line; the person who sends `/start <code>` (the
code alone on Slack) in a direct message becomes the channel's admin and approves their own
first `shell`. A wrong, reused or expired code is refused, wrong codes lock their sender out for
a while, and a tap nobody present may decide says how to become the decider. `/start` greets,
and a stranger's `/start` is answered once they are paired.
"""

from __future__ import annotations

import io
import logging
import re
from typing import Any

import pytest
from fakes.llm import FakeLLM, user_texts
from fakes.slack import FakeSlack
from fakes.telegram import FakeTelegram
from helpers import echo, session_file, until
from test_slack_e2e import DM as SLACK_DM
from test_slack_e2e import running as slack_running
from test_slack_e2e import slack_config
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import (
    UNPACED,
    answers,
    button,
    has_prompt,
    prompt_message,
    running,
    settle,
    texts,
    tg_config,
)

from gateway.__main__ import build_parser
from gateway.access import cli as access_cli
from gateway.access.claim import CLAIM_TTL_S, LOCKOUT_S, MAX_WRONG, current_claim_line
from gateway.approvals.routing import OTHERS_REQUEST
from gateway.config import Config

OWNER, STRANGER, MEMBER = 42, 43, 44
GROUP = -100200300
CLAIM_LINE = re.compile(r"claim: (\w+) has no admin yet: send `(?:/start )?([A-Z0-9]{5}-[A-Z0-9]{5})`")


def first_hour_config(llm: FakeLLM, tg: FakeTelegram, tmp_path, **sections: Any) -> Config:
    """What a new user runs: the defaults of `access` and `approvals` (nothing written for them)."""
    telegram = {"token": tg.token, "api_base_url": tg.base_url, "poll_timeout_s": 1, "edit_interval_s": 0,
                "typing_after_s": 0, **UNPACED}
    data: dict[str, Any] = {
        "llm": {"base_url": llm.base_url, "model": "test-model", "max_retries": 1, "retry_budget_s": 5},
        "agent": {"workspace": str(tmp_path / "ws"), "system_prompt": "You are a test agent."},
        "inbox": {"poll_interval_s": 0.05, "lease_ttl_s": 5},
        "serve": {"shutdown_grace": 2},
        "scheduler": {"enabled": False},
        "http": {"port": 0},
        "telegram": telegram,
        **sections,
    }
    return Config.model_validate(data)


def codes_logged(caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    """channel -> the code its claim line shows (the newest)."""
    found = {}
    for record in caplog.records:
        match = CLAIM_LINE.search(record.getMessage())
        if match:
            found[match.group(1)] = match.group(2)
    return found


async def cli(store, config, *argv: str) -> tuple[int, str]:  # noqa: ANN001
    out = io.StringIO()
    status = await access_cli.run(build_parser().parse_args(list(argv)), store, config, out)
    return status, out.getvalue()


async def said_to(gateway, tg: FakeTelegram, chat: int, text: str, *, user_id: int) -> str:  # noqa: ANN001
    """Send `text` in `chat` (a DM when it is the sender's id); return the bot's next message there."""
    before = len(texts(tg, chat))
    if chat == user_id:
        tg.private_message(chat, text, user_id=user_id)
    else:
        tg.group_message(chat, text, user_id=user_id)
    await settle(gateway, lambda: len(texts(tg, chat)) > before)
    return texts(tg, chat)[before]


# ---- the owner claims, and approves their own first shell --------------------------------


async def test_the_owner_claims_telegram_and_approves_their_own_first_shell(store, llm, tg, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO)
    config = first_hour_config(llm, tg, tmp_path)
    assert config.approvals.self_approve is False and not config.approvals.admins
    llm.tool_call("shell", {"command": "echo built > built.txt"}, id="s1")
    llm.reply("Built.")
    async with running(store, config) as gateway:
        code = codes_logged(caplog)["telegram"]
        notice = await said_to(gateway, tg, OWNER, "run the build", user_id=OWNER)
        assert "pairing code" in notice and "/start and the claim code" in notice and "gateway status" in notice
        assert not llm.requests  # held: nobody let them in yet

        claimed = await said_to(gateway, tg, OWNER, f"/start {code}", user_id=OWNER)
        assert "You are now this assistant's admin on Telegram" in claimed
        await settle(gateway, lambda: has_prompt(tg, OWNER))  # the held message is answered: its shell waits
        prompt = prompt_message(tg, OWNER)
        assert "shell" in prompt.text and "Nobody may approve" not in prompt.text
        tg.press(OWNER, prompt.message_id, button(prompt, "Approve"), user_id=OWNER, first_name="Olga")
        await settle(gateway, lambda: "Built." in texts(tg, OWNER))
        assert session_file(tmp_path / "ws", "built.txt").read_text() == "built\n"
        assert "Approved by Olga" in tg.messages[OWNER][prompt.message_id].text
        assert all(code not in text for chat in tg.messages for text in texts(tg, chat))  # only the terminal shows it

        status, listing = await cli(store, config, "access", "list")
        assert status == 0 and re.search(r"admin\s+telegram:42\s+admin Ann, claimed with the code", listing), listing
        assert "claim:" not in listing  # the channel has its admin: no code any more
        assert await current_claim_line(store, config) == ""
    trail = [(r.action, r.actor, r.via) for r in await store.audit.list_audit(kind="access")]
    assert ("admin_claimed", "telegram:42", "claim") in trail and ("pairing_approved", "telegram:42", "claim") in trail


async def test_a_tap_nobody_may_decide_says_how_to_claim_then_the_claimer_decides(
    store, llm, tg, tmp_path, caplog
) -> None:
    caplog.set_level(logging.INFO)
    config = first_hour_config(llm, tg, tmp_path, access={"dm_policy": "open"})  # let in: the prompt comes first
    llm.tool_call("shell", {"command": "echo hi > hi.txt"}, id="s1")
    llm.reply("Done.")
    async with running(store, config) as gateway:
        tg.private_message(OWNER, "say hi into a file", user_id=OWNER)
        await settle(gateway, lambda: has_prompt(tg, OWNER))
        prompt = prompt_message(tg, OWNER)
        assert "Nobody may approve this yet: telegram has no admin" in prompt.text
        tg.press(OWNER, prompt.message_id, button(prompt, "Approve"), user_id=OWNER)
        await until(lambda: len(answers(tg)) == 1)
        (why, alert), = answers(tg)
        assert alert and "You can't decide" not in why and "/start and the claim code" in why and len(why) <= 200
        assert not session_file(tmp_path / "ws", "hi.txt").exists()

        await said_to(gateway, tg, OWNER, f"/start {codes_logged(caplog)['telegram']}", user_id=OWNER)
        tg.press(OWNER, prompt.message_id, button(prompt, "Approve"), user_id=OWNER)  # the same prompt, now theirs
        await settle(gateway, lambda: "Done." in texts(tg, OWNER))
        assert session_file(tmp_path / "ws", "hi.txt").exists()


async def test_a_claimed_admin_counts_as_approvals_admins_does(store, llm, tg, tmp_path, caplog) -> None:
    """Deciding others' requests (a copy in the admin's DM) and stopping anyone's turn."""
    caplog.set_level(logging.INFO)
    config = first_hour_config(llm, tg, tmp_path, access={"dm_policy": "open", "group_policy": "open"})
    async with running(store, config) as gateway:
        await said_to(gateway, tg, OWNER, f"/start {codes_logged(caplog)['telegram']}", user_id=OWNER)
        llm.tool_call("shell", {"command": "echo x"}, id="s1")
        tg.group_message(GROUP, "@test_bot run it", user_id=MEMBER)
        await settle(gateway, lambda: has_prompt(tg, GROUP) and has_prompt(tg, OWNER))
        assert "An admin decides this request" in prompt_message(tg, GROUP).text
        copy = prompt_message(tg, OWNER)  # the claimed admin is asked in their DM
        assert "telegram:44" in copy.text
        prompt = prompt_message(tg, GROUP)
        tg.press(GROUP, prompt.message_id, button(prompt, "Approve"), user_id=STRANGER)
        await until(lambda: len(answers(tg)) == 1)
        assert answers(tg) == [(OTHERS_REQUEST, True)]  # an admin exists now: who decides, no claim hint

        refused = await said_to(gateway, tg, GROUP, "/stop", user_id=STRANGER)
        assert "only they or an admin can stop it" in refused
        tg.group_message(GROUP, "/stop", user_id=OWNER)
        await settle(gateway, lambda: "Stopped." in texts(tg, GROUP))
        assert not await store.prompts.pending(thread_key=f"telegram:{GROUP}:")


# ---- codes: wrong, reused, expired, locked out ------------------------------------------


async def test_a_wrong_or_reused_code_is_refused(store, llm, tg, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO)
    config = first_hour_config(llm, tg, tmp_path)
    async with running(store, config) as gateway:
        code = codes_logged(caplog)["telegram"]
        wrong = await said_to(gateway, tg, STRANGER, "/start ABCDE-FGHJK", user_id=STRANGER)
        assert "not this assistant's claim code" in wrong and f"{MAX_WRONG - 1} more wrong codes" in wrong
        assert await store.claims.admins() == {}

        await said_to(gateway, tg, OWNER, f"/start {code.lower()}", user_id=OWNER)  # typed loosely
        assert await store.claims.admins() == {"telegram": ["42"]}
        reused = await said_to(gateway, tg, STRANGER, f"/start {code}", user_id=STRANGER)
        assert "pairing code" in reused and "answer your /start then" in reused  # a stranger's /start: pairing
        assert await store.claims.admins() == {"telegram": ["42"]}

        status, said = await cli(store, config, "access", "revoke", "telegram:42")
        assert status == 0 and "revoked admin (claimed) telegram:42" in said
        status, listing = await cli(store, config, "access", "list")
        (line,) = [line for line in listing.splitlines() if line.startswith("claim: telegram")]
        fresh = CLAIM_LINE.search(line).group(2)
        assert fresh != code
        again = await said_to(gateway, tg, OWNER, f"/start {code}", user_id=OWNER)  # used once already
        assert "not this assistant's claim code" in again and await store.claims.admins() == {}
        claimed = await said_to(gateway, tg, OWNER, f"/start {fresh}", user_id=OWNER)
        assert "now this assistant's admin" in claimed and await store.claims.admins() == {"telegram": ["42"]}


async def test_codes_expire(store, llm, tg, tmp_path, caplog, clock) -> None:
    caplog.set_level(logging.INFO)
    config = first_hour_config(llm, tg, tmp_path)
    async with running(store, config, clock=clock) as gateway:
        code = codes_logged(caplog)["telegram"]
        clock.advance(CLAIM_TTL_S)
        expired = await said_to(gateway, tg, OWNER, f"/start {code}", user_id=OWNER)
        assert "has expired" in expired and "gateway status" in expired
        assert await store.claims.admins() == {}

        line = await current_claim_line(store, config, now=clock.now(), telegram_bot="test_bot")  # `gateway status`
        fresh = CLAIM_LINE.search(line).group(2)
        assert fresh != code and f"https://t.me/test_bot?start={fresh}" in line  # one tap sends the /start
        claimed = await said_to(gateway, tg, OWNER, f"/start {fresh}", user_id=OWNER)
        assert "now this assistant's admin" in claimed


async def test_wrong_codes_lock_their_sender_out_for_a_while(store, llm, tg, tmp_path, caplog, clock) -> None:
    caplog.set_level(logging.INFO)
    config = first_hour_config(llm, tg, tmp_path)
    async with running(store, config, clock=clock) as gateway:
        code = codes_logged(caplog)["telegram"]
        for n in range(1, MAX_WRONG + 1):
            reply = await said_to(gateway, tg, STRANGER, f"/start WRONG-{n:05d}", user_id=STRANGER)
        assert "Too many wrong claim codes: try again in 15 min" in reply
        locked = await said_to(gateway, tg, STRANGER, f"/start {code}", user_id=STRANGER)
        assert "Too many wrong claim codes" in locked and await store.claims.admins() == {}  # even the right one

        clock.advance(LOCKOUT_S)
        claimed = await said_to(gateway, tg, STRANGER, f"/start {code}", user_id=STRANGER)
        assert "now this assistant's admin" in claimed and await store.claims.admins() == {"telegram": ["43"]}
    refused = [r for r in await store.audit.list_audit(kind="access") if r.action == "claim_refused"]
    assert [r.outcome for r in refused] == ["locked"] + ["wrong"] * (MAX_WRONG - 1)  # newest first


async def test_the_code_sent_in_a_group_is_void(store, llm, tg, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO)
    config = first_hour_config(llm, tg, tmp_path)
    async with running(store, config) as gateway:
        code = codes_logged(caplog)["telegram"]
        voided = await said_to(gateway, tg, GROUP, f"/start {code}", user_id=OWNER)
        assert "works only in a direct message" in voided and "gateway status" in voided
        refused = await said_to(gateway, tg, OWNER, f"/start {code}", user_id=OWNER)
        assert "not this assistant's claim code" in refused and await store.claims.admins() == {}
        assert not llm.requests


async def test_words_shaped_like_a_code_are_a_message_not_a_wrong_code(store, llm, tg, tmp_path, caplog) -> None:
    """Two five-letter words ("fresh start") fit a code's letters: before the owner claimed, a
    person saying them was told "not this assistant's claim code" and counted toward a lock-out.
    Only the code as shown (the dash, with a digit or in capitals) or `/start CODE` is an attempt."""
    caplog.set_level(logging.INFO)
    llm.responder = echo
    config = first_hour_config(llm, tg, tmp_path)
    async with running(store, config) as gateway:
        said = await said_to(gateway, tg, OWNER, "fresh start", user_id=OWNER)
        assert "pairing code" in said and "not this assistant's claim code" not in said  # a stranger's message
        for words in ("sweet-dream", "Sweet Dream"):
            tg.private_message(OWNER, words, user_id=OWNER)  # held with the first until they are let in
        await gateway.inbox.wait_until_idle(10)
        assert "a wrong code" not in caplog.text and len(texts(tg, OWNER)) == 1
        wrong = await said_to(gateway, tg, OWNER, "NPQR2-STUV3", user_id=OWNER)  # as a code is shown: an attempt
        assert "not this assistant's claim code" in wrong


# ---- Slack: the code alone in a DM ------------------------------------------------------


async def test_slack_the_code_in_a_dm_claims_and_the_held_message_is_answered(
    store, llm, slack: FakeSlack, tmp_path, caplog
) -> None:
    caplog.set_level(logging.INFO)
    llm.responder = echo
    config = slack_config(llm, slack, tmp_path)
    config = Config.model_validate({  # the defaults of access and approvals, as a new user has them
        **{name: getattr(config, name).model_dump(exclude_unset=True) for name in config.model_fields_set},
        "access": {}, "approvals": {},
    })
    assert config.approvals.self_approve is False and config.access.dm_policy == "pairing"
    async with slack_running(store, config, slack) as side:
        code = codes_logged(caplog)["slack"]
        assert f"send `{code}` to the bot in a direct message" in caplog.text
        await side.dm("hello")
        await side.settle(lambda: len(slack_texts(slack, SLACK_DM)) == 1)
        assert "pairing code" in slack_texts(slack, SLACK_DM)[0] and "the claim code" in slack_texts(slack, SLACK_DM)[0]
        await side.dm("NPQR2-STUV3")  # code-shaped, wrong
        await side.settle(lambda: len(slack_texts(slack, SLACK_DM)) == 2)
        assert "not this assistant's claim code" in slack_texts(slack, SLACK_DM)[1]
        await side.dm(code)
        await side.settle(lambda: any("re: hello" in t for t in slack_texts(slack, SLACK_DM)))
        assert any("now this assistant's admin on Slack" in t for t in slack_texts(slack, SLACK_DM))
        assert await store.claims.admins() == {"slack": ["U1"]}
        assert [user_texts(r)[-1] for r in llm.requests] == ["hello"]  # never the code


# ---- /start ---------------------------------------------------------------------------


async def test_start_greets_and_a_strangers_start_is_answered_once_paired(store, llm, tg, tmp_path) -> None:
    config = tg_config(llm, tg, tmp_path, access={"dm_policy": "pairing"}, approvals={"admins": {"telegram": [7]}})
    async with running(store, config) as gateway:
        greeting = await said_to(gateway, tg, 7, "/start", user_id=7)
        assert greeting.startswith("👋 Hello, Ann!") and "You are an admin here" in greeting
        assert "Unknown command" not in greeting

        notice = await said_to(gateway, tg, STRANGER, "/start", user_id=STRANGER)
        assert "Your pairing code is" in notice and "answer your /start then" in notice
        assert "claim code" not in notice  # the channel has an admin: nothing to claim
        await settle(gateway, lambda: has_prompt(tg, 7))
        pairing = prompt_message(tg, 7)
        tg.press(7, pairing.message_id, button(pairing, "Approve"), user_id=7)
        await settle(gateway, lambda: len(texts(tg, STRANGER)) == 2)
        held = texts(tg, STRANGER)[1]
        assert held.startswith("👋 Hello") and "write to me here" in held and "admin" not in held
        assert not llm.requests  # /start is answered by the gateway, never by the model
