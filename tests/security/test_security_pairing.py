"""Pairing cannot be jammed, and its prompts cannot mislead the admin (docs/security.md,
"Hostile input"): the per-channel cap counts people, a repeated message neither renews the code
nor gets another reply, and a display name shows as itself (no link, no formatting)."""

from __future__ import annotations

import re

from test_telegram_e2e import has_prompt, prompt_message, running, settle, texts, tg_config

STRANGER, ADMIN, FRIEND, OTHER = 43, 7, 44, 45
GROUPS = (-1001, -1002, -1003)
PAIRING = {"dm_policy": "pairing", "group_policy": "allowlist"}
CODE = re.compile(r"pairing code is ([A-Z0-9]{4}-[A-Z0-9]{4})")


def paired(llm, tg, tmp_path, **access):  # noqa: ANN001, ANN003, ANN201
    return tg_config(llm, tg, tmp_path, access={**PAIRING, **access}, approvals={"admins": {"telegram": [ADMIN]}})


async def test_one_person_adding_the_bot_to_many_groups_does_not_fill_the_cap(store, llm, tg, tmp_path) -> None:
    async with running(store, paired(llm, tg, tmp_path, max_pending_per_channel=2)) as gateway:
        for group in GROUPS:  # one person, three groups: one request, one of the two places
            tg.group_message(group, "@test_bot hi", user_id=FRIEND)
        await settle(gateway, lambda: has_prompt(tg, ADMIN))
        tg.private_message(STRANGER, "me too", user_id=STRANGER)
        await settle(gateway, lambda: bool(texts(tg, STRANGER)))
        assert CODE.search(texts(tg, STRANGER)[0]), texts(tg, STRANGER)
        assert sorted(r.kind for r in await store.access.pending()) == ["chat", "user"]


async def test_a_repeated_message_gets_one_reply_and_keeps_its_code(store, llm, tg, tmp_path) -> None:
    async with running(store, paired(llm, tg, tmp_path)) as gateway:
        tg.private_message(STRANGER, "one", user_id=STRANGER)
        await settle(gateway, lambda: bool(texts(tg, STRANGER)) and has_prompt(tg, ADMIN))
        (first,) = await store.access.pending()
        for n in range(5):
            tg.private_message(STRANGER, f"again {n}", user_id=STRANGER)
        await settle(gateway, lambda: len(tg.calls_to("getUpdates")) > 3)
        await gateway.inbox.wait_until_idle(10)
        (still,) = await store.access.pending()
        assert (still.code, still.expires_at) == (first.code, first.expires_at)
        assert len(texts(tg, STRANGER)) == 1  # one reply per code lifetime, not one per message
        assert len([m for m in tg.bot_messages(ADMIN) if m.buttons]) == 1


async def test_the_try_later_reply_is_sent_once(store, llm, tg, tmp_path) -> None:
    async with running(store, paired(llm, tg, tmp_path, max_pending_per_channel=1)) as gateway:
        tg.private_message(OTHER, "first", user_id=OTHER)
        await settle(gateway, lambda: bool(texts(tg, OTHER)))
        for n in range(4):
            tg.private_message(STRANGER, f"knock {n}", user_id=STRANGER)
        await settle(gateway, lambda: bool(texts(tg, STRANGER)))
        await gateway.inbox.wait_until_idle(10)
        assert len(texts(tg, STRANGER)) == 1 and "too many requests" in texts(tg, STRANGER)[0]


async def test_a_display_name_cannot_put_a_link_or_formatting_in_the_admins_prompt(store, llm, tg, tmp_path) -> None:
    name = "[✅ Verified admin](https://evil.example) *urgent*\u202egnp.exe"
    async with running(store, paired(llm, tg, tmp_path)) as gateway:
        tg.private_message(STRANGER, "hello", user_id=STRANGER, first_name=name)
        await settle(gateway, lambda: has_prompt(tg, ADMIN))
        prompt = prompt_message(tg, ADMIN)
        assert not [e for e in prompt.entities if e["type"] in ("text_link", "bold", "italic", "url")], prompt.entities
        assert "[✅ Verified admin](https://evil.example) *urgent*" in prompt.text  # shown as typed
        assert "\u202e" not in prompt.text and "\\u202egnp.exe" in prompt.text
