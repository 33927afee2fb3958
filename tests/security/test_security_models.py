"""Models belong to people (docs/security.md, "Who may run what"; docs/models.md): in a group
`/model` sets the model of the person who sent it, and every turn checks its model against
its requester's role when it runs. An admin's switch does not carry a member to a model their
role forbids; a member's switch does not move the admin's turns (their whole context) to
another server; a role narrowed in the configuration applies at the next turn, and a fallback
never moves a call to a model the role forbids. Through a real Telegram group (PTB against the
fake Bot API) and one scripted model server whose requests name the model they were sent for."""

from __future__ import annotations

from typing import Any

from fakes.llm import FakeLLM
from fakes.telegram import FakeTelegram
from helpers import echo
from test_costs import with_llm
from test_telegram_e2e import BOB, GROUP, running, settle, texts, tg_config

from gateway.app import Gateway
from gateway.config import Config

ANN = 42  # the admin
NAMED = {  # all on the scripted server: each request says which one it was sent for
    "cheap": {"model": "cheap-model"},
    "premium": {"model": "premium-model"},
    "other": {"model": "other-model"},
}


def group_config(llm: FakeLLM, tg: FakeTelegram, tmp_path, member_models: list[str], **llm_settings: Any) -> Config:
    access = {"dm_policy": "open", "group_policy": "open", "roles": {"member": {"models": member_models}}}
    config = tg_config(llm, tg, tmp_path, agent={"tools": []}, access=access,
                       approvals={"admins": {"telegram": [ANN]}})
    return with_llm(config, {"models": NAMED, **llm_settings})


TOLD = ("⚠️ Your role (member) may not use the model premium any more: your turns here use default (test-model). "
        "/model lists the models you may use.")


class Group:
    """Two people in one Telegram group: Ann (an admin) and Bob (a member)."""

    def __init__(self, gateway: Gateway, tg: FakeTelegram, llm: FakeLLM):
        self.gateway, self.tg, self.llm = gateway, tg, llm

    async def say(self, user: int, text: str, *, private: bool = False) -> str:
        """What the bot answered (its last message) once it has nothing left to do; `private`:
        in the person's private chat, not the group."""
        chat = user if private else GROUP
        count = len(texts(self.tg, chat))
        name = "Ann" if user == ANN else "Bob"
        send = self.tg.private_message if private else self.tg.group_message
        send(chat, text, user_id=user, first_name=name, username=name.lower())
        await settle(self.gateway, lambda: len(texts(self.tg, chat)) > count)
        return texts(self.tg, chat)[-1]

    async def turn(self, user: int, text: str, *, private: bool = False) -> str:
        """The model the turn's request was sent for."""
        asked = len(self.llm.requests)
        answer = await self.say(user, text if private else f"@test_bot {text}", private=private)
        assert answer == f"re: {text}"
        assert len(self.llm.requests) == asked + 1
        return str(self.llm.requests[-1]["model"])


async def test_an_admins_switch_does_not_carry_a_cheap_member_to_premium(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    async with running(store, group_config(llm, tg, tmp_path, ["cheap"])) as gateway:
        group = Group(gateway, tg, llm)
        assert "cheap" in await group.say(BOB, "/model cheap")
        assert "premium" in await group.say(ANN, "/model premium")
        assert await group.turn(BOB, "from bob") == "cheap-model"
        assert await group.turn(ANN, "from ann") == "premium-model"
        listing = await group.say(BOB, "/model")
        assert "✓ cheap (cheap-model)" in listing and "premium" not in listing


async def test_a_members_switch_does_not_move_the_admins_next_turn(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    async with running(store, group_config(llm, tg, tmp_path, ["cheap", "other"])) as gateway:
        group = Group(gateway, tg, llm)
        assert await group.turn(ANN, "first") == "test-model"
        assert "other" in await group.say(BOB, "/model other")
        assert await group.turn(ANN, "second") == "test-model"  # not another server, with Ann's context
        assert await group.turn(BOB, "mine") == "other-model"
        assert "✓ default (test-model)" in await group.say(ANN, "/model")
    session = await store.sessions.current(f"telegram:{GROUP}:")
    assert session is not None and session.model is None  # nobody's choice is the group's


async def test_a_role_narrowed_after_a_switch_applies_at_the_next_turn(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    async with running(store, group_config(llm, tg, tmp_path, ["cheap", "premium"])) as gateway:
        group = Group(gateway, tg, llm)
        assert "premium" in await group.say(BOB, "/model premium")
        assert await group.turn(BOB, "while allowed") == "premium-model"
        assert "premium" in await group.say(BOB, "/model premium", private=True)  # his private chat's session
    async with running(store, group_config(llm, tg, tmp_path, ["cheap"])) as gateway:
        group = Group(gateway, tg, llm)
        for chat, private in ((GROUP, False), (BOB, True)):
            before = len(texts(tg, chat))
            assert await group.turn(BOB, "after the change", private=private) == "test-model"
            assert texts(tg, chat)[before:] == [TOLD, "re: after the change"]
            before = len(texts(tg, chat))
            assert await group.turn(BOB, "again", private=private) == "test-model"
            assert texts(tg, chat)[before:] == ["re: again"]  # told once: the choice is forgotten
            assert "✓ default (test-model)" in await group.say(BOB, "/model", private=private)


async def test_a_fallback_skips_the_models_the_role_may_not_use(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    config = group_config(llm, tg, tmp_path, ["cheap"], fallback=["premium", "cheap"], max_retries=0)
    async with running(store, config) as gateway:
        group = Group(gateway, tg, llm)
        llm.error(500)
        asked = len(llm.requests)
        assert await group.say(BOB, "@test_bot hi") == "re: hi"
        assert [r["model"] for r in llm.requests[asked:]] == ["test-model", "cheap-model"]
        llm.error(500)
        asked = len(llm.requests)
        assert await group.say(ANN, "@test_bot hi") == "re: hi"
        assert [r["model"] for r in llm.requests[asked:]] == ["test-model", "premium-model"]
