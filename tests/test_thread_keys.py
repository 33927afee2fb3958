"""Thread keys are written and read by `ThreadKey` only."""

from __future__ import annotations

import pytest

from gateway.events import ThreadKey
from gateway.store.delegations import task_thread_key


@pytest.mark.parametrize(
    "key", [ThreadKey("telegram", "-1001", "7"), ThreadKey("slack", "C1", "1700000000.000100"), ThreadKey("fake", "c")]
)
def test_a_written_key_reads_back_as_itself(key):
    assert ThreadKey.parse(str(key)) == key
    assert str(key) == ThreadKey.format(key.channel, key.chat, key.thread)


def test_a_slack_thread_ts_keeps_everything_after_the_chat():
    assert ThreadKey.parse("slack:C1:1.0:x") == ThreadKey("slack", "C1", "1.0:x")


@pytest.mark.parametrize("text", ["", "telegram", "telegram:", ":42"])
def test_a_key_without_channel_or_chat_is_refused(text):
    with pytest.raises(ValueError, match="not a thread key"):
        ThreadKey.parse(text)


def test_the_channel_of_any_stored_key():
    assert ThreadKey.channel_of("telegram:42:") == "telegram"
    assert ThreadKey.channel_of("dana") == "dana"  # a session opened under a bare name


def test_a_background_tasks_thread():
    assert task_thread_key(12) == "task:12:"
    assert ThreadKey.parse(task_thread_key(12)) == ThreadKey("task", "12")
