"""Approvals in a group that only the deciders see (`telegram.group_approvals: private`, Bot
API 10.2 ephemeral messages): the group is told the request waits, each admin in it gets a card
only they see, plus the copy in their DM; a tap on the card decides, and the card then shows the
outcome. Ephemeral delivery is not guaranteed, so with no admin reached the card is posted in
the group as before (`shared`, the default)."""

from __future__ import annotations

from helpers import until
from security_support import written
from test_telegram_e2e import answers, button, has_prompt, prompt_message, running, settle, texts, tg_config

MEMBER, ADMIN, OTHER_ADMIN = 43, 7, 8
GROUP = -100200300


def config(llm, tg, tmp_path, admins=(ADMIN,), **telegram):  # noqa: ANN001, ANN003, ANN201
    approvals = {"self_approve": False, "admins": {"telegram": list(admins)}}
    return tg_config(llm, tg, tmp_path, telegram={"group_approvals": "private", **telegram}, approvals=approvals)


def ask_to_write(llm, tg, name: str = "made.txt") -> None:  # noqa: ANN001
    llm.tool_call("write_file", {"path": name, "content": "x"}, id="w1")
    llm.reply("Written.")
    tg.group_message(GROUP, "@test_bot write it", user_id=MEMBER, first_name="Mel")


async def test_the_group_sees_it_waits_and_only_the_admin_sees_the_card(store, llm, tg, tmp_path) -> None:
    ask_to_write(llm, tg)
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await settle(gateway, lambda: bool(tg.ephemeral_of(GROUP, ADMIN)) and has_prompt(tg, ADMIN))
        assert not has_prompt(tg, GROUP)  # no button anyone in the group can see
        assert "needs an admin's approval" in texts(tg, GROUP)[0]
        assert tg.ephemeral_of(GROUP, MEMBER) == []
        card = tg.ephemeral_of(GROUP, ADMIN)[0]
        assert "write_file" in card.text and card.message_id == 0  # not in the chat's history
        assert [b["style"] for b in card.buttons[0]] == ["success", "danger"]

        tg.ephemeral_press(GROUP, card.ephemeral_id or 0, button(card, "Approve"), first_name="Ada")
        await settle(gateway, lambda: "Written." in texts(tg, GROUP))
        assert written(tmp_path, "made.txt")
        assert not answers(tg)[-1][1]  # the tap is answered, not with an alert
        assert card.buttons == [] and card.text.startswith("✅ Approved by Ada")  # the card became the outcome
        dm_copy = tg.bot_messages(ADMIN)[0]
        assert dm_copy.buttons == [] and "Approved by Ada" in dm_copy.text  # and its DM copy too


async def test_a_tap_on_the_card_by_someone_who_may_not_decide_is_refused(store, llm, tg, tmp_path) -> None:
    """The card's token is the prompt's: a member who got hold of it (a forged tap) decides nothing."""
    ask_to_write(llm, tg)
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await settle(gateway, lambda: bool(tg.ephemeral_of(GROUP, ADMIN)))
        card = tg.ephemeral_of(GROUP, ADMIN)[0]
        card.receiver = MEMBER  # as if Telegram had shown it to the member
        tg.ephemeral_press(GROUP, card.ephemeral_id or 0, button(card, "Approve"), first_name="Mel")
        await until(lambda: len(answers(tg)) == 1)
        await gateway.inbox.wait_until_idle(10)
        assert answers(tg)[0][1] is True and "admin" in answers(tg)[0][0]  # an alert saying who decides
        assert not written(tmp_path, "made.txt")


async def test_each_admin_gets_a_card_and_the_first_tap_closes_both(store, llm, tg, tmp_path) -> None:
    ask_to_write(llm, tg)
    async with running(store, config(llm, tg, tmp_path, admins=(ADMIN, OTHER_ADMIN))) as gateway:
        await settle(gateway, lambda: bool(tg.ephemeral_of(GROUP, ADMIN)) and bool(tg.ephemeral_of(GROUP, OTHER_ADMIN)))
        mine, theirs = tg.ephemeral_of(GROUP, ADMIN)[0], tg.ephemeral_of(GROUP, OTHER_ADMIN)[0]
        approve = button(mine, "Approve")
        tg.ephemeral_press(GROUP, theirs.ephemeral_id or 0, button(theirs, "Deny"), first_name="Otto")
        await settle(gateway, lambda: mine.buttons == [] and theirs.buttons == [])
        assert mine.text.startswith("❌ Denied by Otto") and theirs.text.startswith("❌ Denied by Otto")
        tg.ephemeral_press(GROUP, mine.ephemeral_id or 0, approve)  # Telegram never got the edit to them
        await until(lambda: len(answers(tg)) == 2)
        assert answers(tg)[1] == ("This request is no longer pending.", True)  # a card left standing: stale
        assert not written(tmp_path, "made.txt")


async def test_an_admin_out_of_reach_in_the_group_still_gets_the_dm_copy(store, llm, tg, tmp_path) -> None:
    tg.non_members.add(ADMIN)  # Telegram refuses the ephemeral card (USER_NOT_PARTICIPANT)
    ask_to_write(llm, tg)
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await settle(gateway, lambda: has_prompt(tg, ADMIN))
        assert not has_prompt(tg, GROUP) and tg.ephemeral_of(GROUP, ADMIN) == []
        copy = prompt_message(tg, ADMIN)
        tg.press(ADMIN, copy.message_id, button(copy, "Approve"), user_id=ADMIN, first_name="Ada")
        await settle(gateway, lambda: "Written." in texts(tg, GROUP))


async def test_with_no_admin_reached_the_card_is_posted_in_the_group(store, llm, tg, tmp_path) -> None:
    """Not a member of the group, never opened a DM with the bot: the card the option would
    hide is posted in the group after all, so the request does not wait for nobody."""
    tg.non_members.add(ADMIN)
    tg.never_started.add(ADMIN)
    ask_to_write(llm, tg)
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await settle(gateway, lambda: has_prompt(tg, GROUP))
        waiting, card = tg.bot_messages(GROUP)
        assert "needs an admin's approval" in waiting.text and "An admin decides" in card.text
        tg.press(GROUP, card.message_id, button(card, "Approve"), user_id=ADMIN, first_name="Ada")
        await settle(gateway, lambda: "Written." in texts(tg, GROUP))
        assert tg.messages[GROUP][card.message_id].buttons == []


async def test_shared_is_the_default_and_posts_the_card_in_the_group(store, llm, tg, tmp_path) -> None:
    ask_to_write(llm, tg)
    async with running(store, config(llm, tg, tmp_path, group_approvals="shared")) as gateway:
        await settle(gateway, lambda: has_prompt(tg, GROUP) and has_prompt(tg, ADMIN))
        assert tg.ephemeral == {}
        assert tg_config(llm, tg, tmp_path).telegram.group_approvals == "shared"


async def test_a_card_refused_once_by_a_server_error_is_sent_again_and_noted(store, llm, tg, tmp_path) -> None:
    """The outbox retries the card like any send, and the prompt notes whose card it is."""
    ask_to_write(llm, tg)
    tg.fail_next("sendMessage", "500", after=1)  # the waiting text goes; the card's first send fails
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await settle(gateway, lambda: bool(tg.ephemeral_of(GROUP, ADMIN)) and has_prompt(tg, ADMIN))
        (pending,) = await store.prompts.pending(thread_key=f"telegram:{GROUP}:")
        receivers = [c[2] for c in pending.payload["copies"] if len(c) > 2 and c[2]]
        assert receivers == [str(ADMIN)]


async def test_a_server_older_than_the_parameter_posts_the_card_and_it_still_closes(store, llm, tg, tmp_path) -> None:
    """Telegram passes over parameters it does not know: the card comes back an ordinary message,
    which is then kept (and closed) as one, with a warning that names the setting."""
    tg.before_ephemeral = True
    ask_to_write(llm, tg)
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await settle(gateway, lambda: has_prompt(tg, GROUP) and has_prompt(tg, ADMIN))
        card = prompt_message(tg, GROUP)
        tg.press(GROUP, card.message_id, button(card, "Approve"), user_id=ADMIN, first_name="Ada")
        await settle(gateway, lambda: "Written." in texts(tg, GROUP))
        assert tg.messages[GROUP][card.message_id].buttons == []
        assert "Approved by Ada" in tg.messages[GROUP][card.message_id].text


async def test_in_a_forum_topic_the_card_and_the_waiting_line_stay_in_the_topic(store, llm, tg, tmp_path) -> None:
    llm.tool_call("write_file", {"path": "t.txt", "content": "x"}, id="w1")
    llm.reply("Written.")
    tg.topic_message(GROUP, 9, "@test_bot write it", user_id=MEMBER, first_name="Mel")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await settle(gateway, lambda: bool(tg.ephemeral_of(GROUP, ADMIN)))
        (card,) = tg.ephemeral_of(GROUP, ADMIN)
        assert card.thread_id == 9 and tg.bot_messages(GROUP)[0].thread_id == 9
        tg.ephemeral_press(GROUP, card.ephemeral_id or 0, button(card, "Approve"), first_name="Ada")
        await settle(gateway, lambda: "Written." in texts(tg, GROUP))
        assert tg.bot_messages(GROUP)[-1].thread_id == 9


async def test_a_card_gone_before_the_decision_does_not_stop_the_rest_closing(store, llm, tg, tmp_path) -> None:
    """Telegram never delivered it, or the person dismissed it: its edit is refused, which is
    noted and passed over; the DM copy still shows the outcome."""
    ask_to_write(llm, tg)
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await settle(gateway, lambda: bool(tg.ephemeral_of(GROUP, ADMIN)) and has_prompt(tg, ADMIN))
        tg.ephemeral.clear()
        copy = prompt_message(tg, ADMIN)
        tg.press(ADMIN, copy.message_id, button(copy, "Approve"), user_id=ADMIN, first_name="Ada")
        await settle(gateway, lambda: "Written." in texts(tg, GROUP))
        assert "Approved by Ada" in tg.messages[ADMIN][copy.message_id].text
        edits = tg.calls_to("editEphemeralMessageText")
        assert len(edits) == 1  # tried once: a 400 is not retried
