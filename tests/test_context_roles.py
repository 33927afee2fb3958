"""The role order of every built context is one that strict chat templates accept."""

from __future__ import annotations

from fakes.llm_rules import conversation_problem, template_problem
from test_context_support import build, builder, exchange, history_of, reply, user

from gateway.context.render import OPENING


async def open_session(store):
    return await store.sessions.open("console:local:", source="console")


def accepted(messages: list[dict]) -> None:
    body = {"model": "m", "stream": True, "messages": messages}
    assert conversation_problem(messages) is None and template_problem(body) is None, messages


async def test_the_context_note_joins_the_last_user_message_at_its_end(store):
    session = await open_session(store)
    await user(store, session, "first")
    await reply(store, session, "answer")
    await user(store, session, "second")
    messages = (await build(builder(store), session, turn=3)).messages
    accepted(messages)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[-1]["content"].startswith("second\n\n[context] Current date and time: Wednesday 2026-12-02 13:00")
    assert messages[-1]["content"].endswith("Working directory: /srv/work")


async def test_after_tool_results_the_context_note_is_the_next_user_message(store):
    session = await open_session(store)
    await user(store, session, "look")
    await exchange(store, session, ("read_file", "contents"), ("clock", "noon"))
    messages = (await build(builder(store), session, turn=1)).messages
    accepted(messages)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert messages[-1]["content"].startswith("[context] ")


async def test_consecutive_assistant_texts_are_merged(store):
    session = await open_session(store)
    await user(store, session, "hi")
    await reply(store, session, "part one")
    await reply(store, session, "part two")
    await exchange(store, session, ("clock", "noon"))
    await reply(store, session, "done")
    await user(store, session, "next")
    messages = (await build(builder(store), session, turn=6)).messages
    accepted(messages)
    history = history_of(messages)
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "user"]
    assert (
        history[1]["content"] == "part one\n\npart two" and history[1]["tool_calls"][0]["function"]["name"] == "clock"
    )


async def test_a_history_that_starts_with_the_assistant_gets_an_opening_user_message(store):
    session = await open_session(store)
    first = await user(store, session, "old request")
    await reply(store, session, "old answer")
    await user(store, session, "new request")
    b = builder(store)
    await store.sessions.mark_failed([first.id])  # as if its start were gone
    messages = (await build(b, session, turn=3)).messages
    accepted(messages)
    assert messages[1] == OPENING and messages[2] == {"role": "assistant", "content": "old answer"}


async def test_tool_call_content_null_is_sent_only_when_configured(store):
    session = await open_session(store)
    await user(store, session, "look")
    await exchange(store, session, ("clock", "noon"))
    default = (await build(builder(store), session, turn=1)).messages
    null = (await build(builder(store, tool_call_content="null"), session, turn=1)).messages
    assert default[2]["content"] == "" and null[2]["content"] is None


def test_the_fake_refuses_what_strict_templates_refuse():
    system, hi, answer = (
        {"role": "system", "content": "s"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "a"},
    )

    def problem(*messages: dict, **body) -> str | None:
        return template_problem({"model": "m", "stream": True, "messages": list(messages), **body})

    assert "second user message in a row" in problem(system, hi, hi)
    assert "second assistant message in a row" in problem(hi, answer, answer, hi)
    assert "only accepted first" in problem(hi, system)
    assert "must be from the user" in problem(system, answer, hi)
    assert "last message is the assistant's" in problem(hi, answer)
    assert problem(hi, answer, continue_final_message=True) is None
    assert "content must be a string" in problem({"role": "user", "content": None})
