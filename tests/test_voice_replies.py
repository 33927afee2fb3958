"""Voice replies: `/voice on` in a chat, and its answers also come as a voice note (Telegram
sendVoice, a Slack audio file in the thread) spoken by `llm.speech_model`, priced by the
character, counted on the run and refused at a spend cap before the call; the text answer is
always there. End to end through Telegram and Slack on SQLite and PostgreSQL; one test speaks
through a real engine (espeak-ng behind an OpenAI-compatible shim) and reads the audio back."""

from __future__ import annotations

from typing import Any

import pytest
from fakes.audio import audio_kind, opus_seconds
from fakes.llm import Reply
from fakes.llm_speech import CHARS_PER_SECOND
from speech_shim import EspeakSpeech, missing
from test_costs import with_llm
from test_slack_e2e import DM, slack_config
from test_slack_e2e import running as slack_running
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import BOB, GROUP, PRIVATE, running, settle, texts, tg_config

from gateway.config import Config
from gateway.voice import speakable
from gateway.voice.command import NO_MODEL
from gateway.voice.replies import SPEECH_FAILED
from gateway.voice.speakable import CODE_NOTE, CUT_NOTE, TABLE_NOTE

ANSWER = "The **meeting** is at 10:00 in room `B2`. Bring the [agenda](https://example.com/a)."
SPOKEN = "The meeting is at 10:00 in room B2. Bring the agenda."
SPEECH = {"speech_model": "gpt-4o-mini-tts", "prices": {"gpt-4o-mini-tts": {"per_million_chars": 15}}}
VOICE_ON = "Voice notes are on: answers here also come as a voice note (the text stays). /voice off stops them."


def spoken(config: Config, **llm: Any) -> Config:
    return with_llm(config, {**SPEECH, **llm})


def voice_notes(tg, chat: int) -> list[Any]:  # noqa: ANN001
    return [c for c in tg.calls_to("sendVoice") if int(c.params["chat_id"]) == chat]


# ---- what is spoken -------------------------------------------------------------------------


def test_markdown_is_spoken_as_words_not_symbols() -> None:
    assert speakable(ANSWER, 1500) == SPOKEN
    answer = "# Plan\n- first step\n- second step\n\n```python\nprint('x')\n```\n| a | b |\n|---|---|\n| 1 | 2 |\nDone."
    assert speakable(answer, 1500) == f"Plan. first step. second step. {CODE_NOTE} {TABLE_NOTE} Done."
    assert speakable("See https://example.com/x?y=1 now.", 1500) == "See a link now."


def test_a_long_answer_is_cut_at_a_sentence_and_says_the_rest_is_in_the_text() -> None:
    answer = " ".join(f"Sentence number {n} says something." for n in range(100))
    said = speakable(answer, 200)
    assert len(said) <= 200 and said.endswith("says something." + CUT_NOTE)
    one_long = "word " * 200
    assert speakable(one_long, 100).endswith("…" + CUT_NOTE) and len(speakable(one_long, 100)) <= 100


# ---- Telegram -------------------------------------------------------------------------------


async def test_voice_on_sends_the_answer_as_a_voice_note_priced_and_counted_through_telegram(
    store, llm, tg, tmp_path
) -> None:
    config = spoken(tg_config(llm, tg, tmp_path, agent={"tools": []}))
    async with running(store, config) as gateway:
        tg.private_message(PRIVATE, "hello")
        await settle(gateway, lambda: "ok" in texts(tg, PRIVATE))
        assert voice_notes(tg, PRIVATE) == [] and llm.speech.requests == []  # voice.default: off
        tg.private_message(PRIVATE, "/voice on")
        await settle(gateway, lambda: VOICE_ON in texts(tg, PRIVATE))
        llm.reply(ANSWER)
        tg.private_message(PRIVATE, "when is the meeting?")
        await settle(gateway, lambda: len(voice_notes(tg, PRIVATE)) == 1)
    (asked,) = llm.speech.requests
    assert asked == {"model": "gpt-4o-mini-tts", "input": SPOKEN, "voice": "alloy", "response_format": "opus"}
    (note,) = [m for m in tg.bot_messages(PRIVATE) if m.document and m.document["file_id"].startswith("voice")]
    assert opus_seconds(note.document["content"]) == pytest.approx(len(SPOKEN) / CHARS_PER_SECOND, abs=0.02)
    assert "The meeting is at 10:00" in texts(tg, PRIVATE)[-1]  # the text answer is there too
    run = max(await store.runs.list(), key=lambda r: r.id)
    (speech,) = [e for e in await store.runs.events(run.id) if e.kind == "SPEECH"]
    cost = len(SPOKEN) * 15 * 1000  # $15 per million characters, in nano-USD
    assert speech.payload == {"model": "gpt-4o-mini-tts", "chars": len(SPOKEN), "bytes": len(note.document["content"]),
                              "cost_nano_usd": cost}
    assert run.llm_calls == 2 and run.cost_nano_usd is not None and run.cost_nano_usd >= cost


async def test_voice_off_and_the_default_on_through_telegram(store, llm, tg, tmp_path) -> None:
    config = spoken(tg_config(llm, tg, tmp_path, agent={"tools": []}, voice={"default": True}))  # YAML's bare `on`
    async with running(store, config) as gateway:
        tg.private_message(PRIVATE, "/voice")
        await settle(gateway, lambda: "Voice notes are on in this chat: /voice off stops them." in texts(tg, PRIVATE))
        tg.private_message(PRIVATE, "hello")
        await settle(gateway, lambda: len(voice_notes(tg, PRIVATE)) == 1)
        tg.private_message(PRIVATE, "/voice off")
        await settle(gateway, lambda: "Voice notes are off: answers here come as text only." in texts(tg, PRIVATE))
        tg.private_message(PRIVATE, "again")
        await settle(gateway, lambda: texts(tg, PRIVATE).count("ok") == 2)
    assert len(voice_notes(tg, PRIVATE)) == 1 and len(llm.speech.requests) == 1


async def test_in_a_group_only_an_admin_switches_voice_notes(store, llm, tg, tmp_path) -> None:
    admins = {"admins": {"telegram": [str(PRIVATE)]}}
    config = spoken(tg_config(llm, tg, tmp_path, agent={"tools": []}, approvals=admins))
    async with running(store, config) as gateway:
        tg.group_message(GROUP, "/voice@test_bot on", user_id=BOB, first_name="Bob", username="bob")
        await settle(gateway, lambda: any("Only an admin" in t for t in texts(tg, GROUP)))
        assert await store.preferences.voice(f"telegram:{GROUP}") is None
        tg.group_message(GROUP, "/voice@test_bot on")  # Ann, the admin
        await settle(gateway, lambda: VOICE_ON in texts(tg, GROUP))
        tg.group_message(GROUP, "@test_bot hello", user_id=BOB, first_name="Bob", username="bob")
        await settle(gateway, lambda: len(voice_notes(tg, GROUP)) == 1)
    assert await store.preferences.voice(f"telegram:{GROUP}") is True
    (note,) = [m for m in tg.bot_messages(GROUP) if m.document and m.document["file_id"].startswith("voice")]
    assert note.reply_to is not None  # in a group it quotes the question it answers, like the text
    (entry,) = await store.audit.list_audit(kind="preference")
    assert (entry.action, entry.actor) == ("voice_on", f"telegram:{PRIVATE}")


async def test_without_a_speech_model_voice_on_says_what_to_set(store, llm, tg, tmp_path) -> None:
    config = tg_config(llm, tg, tmp_path, agent={"tools": []})
    async with running(store, config) as gateway:
        tg.private_message(PRIVATE, "/voice on")
        await settle(gateway, lambda: NO_MODEL in texts(tg, PRIVATE))
    assert await store.preferences.voice(f"telegram:{PRIVATE}") is None


async def test_a_spend_cap_refuses_the_voice_note_before_the_call_and_keeps_the_text(
    store, llm, tg, tmp_path
) -> None:
    long_answer = " ".join(f"Point {n}: the figures of week {n} are in the report." for n in range(25))
    cap = {"caps": [{"scope": "user", "period": "day", "usd": 0.005}]}
    config = spoken(
        tg_config(llm, tg, tmp_path, agent={"tools": []}, budgets=cap, voice={"default": "on", "max_chars": 1500}),
        prices={"gpt-4o-mini-tts": {"per_million_chars": 15}, "test-model": {"input": 0.01, "output": 0.01}},
    )
    llm.responder = lambda request: Reply(long_answer)  # ~1,200 characters at $15 per million: $0.018 > $0.005
    async with running(store, config) as gateway:
        tg.private_message(PRIVATE, "tell me everything")
        await settle(gateway, lambda: any(t.startswith("🔇 No voice note:") for t in texts(tg, PRIVATE)))
    assert llm.speech.requests == [] and voice_notes(tg, PRIVATE) == []
    refusal = texts(tg, PRIVATE)[-1]
    assert refusal.startswith("🔇 No voice note: Daily budget for you reached ($0.005)")
    assert texts(tg, PRIVATE)[0].startswith("Point 0: the figures")


async def test_an_unpriced_speech_model_under_a_usd_cap_is_refused_with_the_setting_named(
    store, llm, tg, tmp_path
) -> None:
    cap = {"caps": [{"scope": "global", "period": "month", "usd": 10}]}
    config = spoken(
        tg_config(llm, tg, tmp_path, agent={"tools": []}, budgets=cap, voice={"default": "on"}),
        prices={"test-model": {"input": 0.01, "output": 0.01}},
    )
    async with running(store, config) as gateway:
        tg.private_message(PRIVATE, "hello")
        await settle(gateway, lambda: any(t.startswith("🔇") for t in texts(tg, PRIVATE)))
    assert texts(tg, PRIVATE)[-1] == (
        "🔇 No voice note: the speech model gpt-4o-mini-tts has no llm.prices.gpt-4o-mini-tts.per_million_chars, "
        "so the USD budget cannot be kept"
    )
    assert llm.speech.requests == []


async def test_a_failing_speech_server_costs_one_line_and_nothing_else(store, llm, tg, tmp_path) -> None:
    llm.speech.failures = 5
    config = spoken(tg_config(llm, tg, tmp_path, agent={"tools": []}, voice={"default": "on"}))
    async with running(store, config) as gateway:
        tg.private_message(PRIVATE, "hello")
        await settle(gateway, lambda: any(t.startswith("🔇") for t in texts(tg, PRIVATE)))
    assert texts(tg, PRIVATE) == ["ok", SPEECH_FAILED]
    assert len(llm.speech.requests) == 1  # not retried into a loop
    run = max(await store.runs.list(), key=lambda r: r.id)
    assert not [e for e in await store.runs.events(run.id) if e.kind == "SPEECH"] and run.llm_calls == 1


async def test_a_person_who_forbids_voice_notes_gets_the_audio_as_a_file(store, llm, tg, tmp_path) -> None:
    tg.voice_forbidden.add(PRIVATE)  # Telegram's privacy setting: VOICE_MESSAGES_FORBIDDEN
    config = spoken(tg_config(llm, tg, tmp_path, agent={"tools": []}, voice={"default": "on"}))
    async with running(store, config) as gateway:
        tg.private_message(PRIVATE, "hello")
        await settle(gateway, lambda: len(tg.calls_to("sendDocument")) == 1)
    (document,) = [m for m in tg.bot_messages(PRIVATE) if m.document]
    assert audio_kind(document.document["content"]) == "ogg" and document.document["file_name"].endswith(".ogg")


# ---- Slack ----------------------------------------------------------------------------------


async def test_voice_on_sends_an_audio_file_in_the_thread_through_slack(store, llm, slack, tmp_path) -> None:
    config = spoken(slack_config(llm, slack, tmp_path, agent={"tools": []}))
    async with slack_running(store, config, slack) as side:
        await side.dm("/voice on")
        await side.settle(lambda: VOICE_ON in slack_texts(slack, DM))
        llm.reply(ANSWER)
        await side.dm("when is the meeting?")
        await side.settle(lambda: any(f.get("shared") for f in slack.files.values()))
    (asked,) = llm.speech.requests
    assert asked["response_format"] == "mp3" and asked["input"] == SPOKEN
    (audio,) = [f for f in slack.files.values() if f.get("shared")]
    assert audio["channel"] == DM and audio["name"].endswith(".mp3") and audio_kind(audio["content"]) == "mp3"
    assert any("is at 10:00 in room" in t for t in slack_texts(slack, DM))  # the text answer too


# ---- a real speech engine -------------------------------------------------------------------


@pytest.mark.skipif(bool(missing()), reason=f"the real speech tier: {missing()}")
async def test_a_real_speech_engine_makes_a_voice_note_telegram_accepts(store, llm, tg, tmp_path) -> None:
    async with EspeakSpeech() as engine:
        config = tg_config(llm, tg, tmp_path, agent={"tools": []}, voice={"default": "on", "voice": "alloy"})
        # the speech server is its own; the chat model's fake stays the server of the turns
        config = with_llm(config, {"speech_model": "espeak-ng", "speech_base_url": engine.base_url})
        llm.reply("Good morning. The build passed and the release is ready.")
        async with running(store, config) as gateway:
            tg.private_message(PRIVATE, "status?")
            await settle(gateway, lambda: len(voice_notes(tg, PRIVATE)) == 1)
    (note,) = [m for m in tg.bot_messages(PRIVATE) if m.document and m.document["file_id"].startswith("voice")]
    seconds = opus_seconds(note.document["content"])  # every page's CRC checked, the length from the granules
    assert 2.0 < seconds < 10.0 and note.document["duration"] == round(seconds)
    assert engine.requests[0]["input"] == "Good morning. The build passed and the release is ready."
