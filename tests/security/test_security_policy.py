"""Explicit policy wins (docs/security.md, "Who may run what" 5): with `telegram.allowed_users`
(or Slack's) and an explicit `access.dm_policy: pairing`, the listed people are answered and
everyone else is paired, not refused by the channel's fixed list. An explicit
`access.group_policy: allowlist` decides groups the same way: a listed person's mention in a
group nobody approved is not answered there (item 11)."""

from __future__ import annotations

import logging
import re

from fakes.llm import FakeLLM
from helpers import echo
from test_slack_e2e import DM as SLACK_DM
from test_slack_e2e import bot_messages as slack_bot_messages
from test_slack_e2e import buttons as slack_buttons
from test_slack_e2e import running as slack_running
from test_slack_e2e import slack_config
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import button, has_prompt, running, settle, texts, tg_config

LISTED, STRANGER, ADMIN = 44, 43, 7
GROUP = -100400500  # a group nobody listed or approved
CODE = re.compile(r"pairing code is ([A-Z0-9]{4}-[A-Z0-9]{4})")


def explicit_pairing(llm: FakeLLM, tg, tmp_path):  # noqa: ANN001, ANN201
    return tg_config(
        llm, tg, tmp_path, telegram={"allowed_users": [str(LISTED)]},
        access={"dm_policy": "pairing", "group_policy": "allowlist"}, approvals={"admins": {"telegram": [ADMIN]}},
    )


async def test_an_explicit_pairing_policy_pairs_people_not_on_allowed_users(store, llm, tg, tmp_path, caplog) -> None:
    llm.responder = echo
    caplog.set_level(logging.INFO)
    async with running(store, explicit_pairing(llm, tg, tmp_path)) as gateway:
        tg.private_message(LISTED, "hi", user_id=LISTED)
        tg.private_message(STRANGER, "let me in", user_id=STRANGER, first_name="Sam")
        await settle(gateway, lambda: bool(texts(tg, LISTED)) and bool(texts(tg, STRANGER)) and has_prompt(tg, ADMIN))
        assert texts(tg, LISTED) == ["re: hi"]
        assert CODE.search(texts(tg, STRANGER)[0]), texts(tg, STRANGER)  # paired, not "ask its owner"
        assert [r.subject for r in await store.access.pending()] == [str(STRANGER)]
        assert [r for r in llm.requests if "let me in" in str(r)] == []
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "telegram: allowed_users are answered; anyone else's direct message gets a pairing code" in said


async def test_without_the_explicit_key_the_fixed_list_still_refuses(store, llm, tg, tmp_path, caplog) -> None:
    """Upgrading: the list alone keeps refusing strangers, and the start log says how to pair them."""
    caplog.set_level(logging.INFO)
    config = tg_config(llm, tg, tmp_path, telegram={"allowed_users": [str(LISTED)]})
    config = config.model_copy(update={"access": type(config.access)()})  # no access section
    async with running(store, config) as gateway:
        tg.private_message(STRANGER, "let me in", user_id=STRANGER)
        await settle(gateway, lambda: bool(texts(tg, STRANGER)))
        assert "Your Telegram id is 43" in texts(tg, STRANGER)[0] and not await store.access.pending()
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "telegram: only allowed_users are answered" in said and "access.dm_policy: pairing" in said


async def test_slack_an_explicit_pairing_policy_pairs_people_not_on_allowed_users(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    config = slack_config(
        llm, slack, tmp_path, {"allowed_users": ["U9"]},
        access={"dm_policy": "pairing", "group_policy": "allowlist"}, approvals={"admins": {"slack": ["U2"]}},
    )
    async with slack_running(store, config, slack) as side:
        await side.dm("hello from slack")  # from U1, not listed
        await side.settle(lambda: bool(slack_texts(slack, SLACK_DM))
                          and any(slack_buttons(m) for m in slack_bot_messages(slack, "D2")))
        assert CODE.search(slack_texts(slack, SLACK_DM)[0]) and not llm.requests


async def test_an_explicit_group_allowlist_keeps_a_listed_person_from_opening_a_group(store, llm, tg, tmp_path, caplog):
    """The attack: a listed person adds the bot to a group of their choosing and mentions it; the
    bot would answer there (and read the others' chatter). With the explicit key the group waits
    for an admin like any group; approved, the held mention is answered."""
    llm.responder = echo
    caplog.set_level(logging.INFO)
    async with running(store, explicit_pairing(llm, tg, tmp_path)) as gateway:
        tg.group_message(GROUP, "@test_bot summarise this group", user_id=LISTED, first_name="Lis")
        await settle(gateway, lambda: has_prompt(tg, ADMIN))
        assert texts(tg, GROUP) == [] and llm.requests == []
        assert [(r.kind, r.subject) for r in await store.access.pending()] == [("chat", str(GROUP))]
        prompt = next(m for m in tg.bot_messages(ADMIN) if m.buttons)
        tg.press(ADMIN, prompt.message_id, button(prompt, "Approve"), user_id=ADMIN)
        await settle(gateway, lambda: bool(texts(tg, GROUP)))
        assert texts(tg, GROUP) == ["re: summarise this group"]
        tg.private_message(LISTED, "and in private?", user_id=LISTED)  # the list still lets them in there
        await settle(gateway, lambda: bool(texts(tg, LISTED)))
        assert texts(tg, LISTED) == ["re: and in private?"]
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "in groups only allowed_chats and groups an admin approved are answered" in said


async def test_without_the_group_key_a_listed_person_is_answered_in_any_group(store, llm, tg, tmp_path, caplog):
    """Upgrading: `allowed_users` alone keeps answering its people wherever they mention the bot,
    and the start log says which key changes that."""
    llm.responder = echo
    caplog.set_level(logging.INFO)
    config = tg_config(
        llm, tg, tmp_path, telegram={"allowed_users": [str(LISTED)]}, approvals={"admins": {"telegram": [ADMIN]}}
    )
    config = config.model_copy(update={"access": type(config.access)(dm_policy="pairing")})  # no group key
    async with running(store, config) as gateway:
        tg.group_message(GROUP, "@test_bot hello group", user_id=LISTED)
        await settle(gateway, lambda: bool(texts(tg, GROUP)))
        assert texts(tg, GROUP) == ["re: hello group"]
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "set access.group_policy: allowlist" in said


async def test_slack_an_explicit_group_allowlist_keeps_a_listed_person_from_opening_a_channel(
    store, llm, slack, tmp_path
) -> None:
    llm.responder = echo
    config = slack_config(
        llm, slack, tmp_path, {"allowed_users": ["U1"]},
        access={"dm_policy": "pairing", "group_policy": "allowlist"}, approvals={"admins": {"slack": ["U2"]}},
    )
    async with slack_running(store, config, slack) as side:
        await side.mention("summarise this channel")  # U1, listed, in a channel nobody approved
        await side.settle(lambda: any(slack_buttons(m) for m in slack_bot_messages(slack, "D2")))
        assert not llm.requests
        assert [r.kind for r in await store.access.pending()] == ["chat"]
