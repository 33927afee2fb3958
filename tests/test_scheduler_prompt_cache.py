"""Repeated firings of a job keep their request's prefix byte for byte (system, tools, the job's
prompt), so a provider that caches prefixes bills the repeats at its cached rate; what changes
from one firing to the next (the time, the session's directory) comes last. The run records the
cached tokens the provider reports."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fakes.channel import FakeChannel
from fakes.llm import Reply
from harness import make_config, running_gateway

from gateway.files.checklists import ChecklistFiles
from gateway.tools.sandbox import sandbox_status

CONTEXT_MARK = "[context] Current date and time:"


class PrefixCache:
    """A provider's prompt cache, as billed: a request reads from the cache the longest prefix
    (tools first, then the messages, as its template renders them) it shares with an earlier
    request; 4 characters a token."""

    def __init__(self, reply: str):
        self.reply = reply
        self.seen: list[str] = []
        self.cached: list[int] = []

    @staticmethod
    def rendered(request: dict[str, Any]) -> str:
        return json.dumps(request.get("tools") or []) + json.dumps(request["messages"])

    def respond(self, request: dict[str, Any]) -> Reply:
        text = self.rendered(request)
        shared = max((len(os.path.commonprefix([text, earlier])) for earlier in self.seen), default=0)
        self.seen.append(text)
        cached, prompt = shared // 4, len(text) // 4 + 1
        self.cached.append(cached)
        usage = {
            "prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        return Reply(self.reply, usage=usage)


def tick_config(llm, tmp_path, **job: Any):  # noqa: ANN001, ANN201
    tick = {
        "name": "watch", "kind": "tick", "every": "30m", "prompt": "Look at the build queue.",
        "deliver_to": "telegram:900", **job,
    }
    return make_config(llm.base_url, str(tmp_path / "ws"), scheduler={"enabled": True, "jobs": [tick]})


async def fire_twice(h) -> None:  # noqa: ANN001
    schedule = await h.store.schedules.by_name("watch")
    await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC) - timedelta(minutes=30), origin="manual")
    await h.idle()
    await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC), origin="manual")
    await h.idle()


async def test_two_firings_send_the_same_prefix_and_only_the_context_differs(store, llm, tmp_path):
    cache = PrefixCache("NOTHING_TO_REPORT")
    llm.responder = cache.respond
    async with running_gateway(store, tick_config(llm, tmp_path), FakeChannel(name="telegram")) as h:
        await fire_twice(h)
    first, second = llm.requests
    assert json.dumps(first["tools"]) == json.dumps(second["tools"]) and first["tools"]
    assert first["messages"][:-1] == second["messages"][:-1]  # the system message, byte for byte
    a, b = first["messages"][-1]["content"], second["messages"][-1]["content"]
    assert a.startswith("Look at the build queue.") and a != b
    # The two differ only inside the context block that closes the request (time, directory).
    differ_at = len(os.path.commonprefix([a, b]))
    assert a.index(CONTEXT_MARK) < differ_at
    assert a[: a.index(CONTEXT_MARK)] == b[: b.index(CONTEXT_MARK)]
    # The provider read all but that tail from its cache, and the run says so.
    rendered = PrefixCache.rendered(second)
    assert cache.cached[1] >= (len(rendered) - len(b) + b.index(CONTEXT_MARK)) // 4 - 1
    runs = sorted(await store.runs.list(), key=lambda r: r.id)
    assert [r.cached_tokens for r in runs] == cache.cached == [0, cache.cached[1]]
    assert runs[1].input_tokens > runs[1].cached_tokens > 0


needs_bwrap = pytest.mark.skipif(
    bool(sandbox_status("auto").problem), reason=f"bubblewrap cannot sandbox here: {sandbox_status('auto').problem}"
)


@needs_bwrap
async def test_a_checks_output_and_the_checklist_come_after_the_prompt_and_only_they_vary(store, llm, tmp_path):
    cache = PrefixCache("NOTHING_TO_REPORT")
    llm.responder = cache.respond
    config = tick_config(llm, tmp_path, check={"command": "cat news.txt"}, checklist="heartbeat.md")
    news = tmp_path / "ws" / "jobs" / "watch" / "news.txt"
    checklist = ChecklistFiles(tmp_path / "ws")
    checklist.write("heartbeat.md", "- [ ] tell me about failed builds\n")
    async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
        schedule = await h.store.schedules.by_name("watch")
        texts = []
        for n in range(3):
            news.parent.mkdir(parents=True, exist_ok=True)
            news.write_text(f"build {n} failed\n")
            await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC))  # each woken by the new output
            await h.idle()
            texts.append(llm.requests[-1]["messages"][-1]["content"])
    assert len(llm.requests) == 3
    first, second, third = texts
    head = first[: first.index("build 0 failed")]
    assert head.startswith("Look at the build queue.")  # the job's words, then the checklist, then the output
    assert head.index("NOTHING_TO_REPORT") < head.index("## Checklist") < head.index("Output of the job's check")
    assert second.startswith(head) and third.startswith(head)  # byte for byte up to the check's output
    # What the provider read from its cache reaches into the last message, past the checklist.
    shared = os.path.commonprefix([PrefixCache.rendered(r) for r in llm.requests[:2]])
    assert json.dumps(head)[1:-1] in shared and cache.cached[1] == len(shared) // 4
    runs = sorted(await store.runs.list(), key=lambda r: r.id)
    assert [r.cached_tokens for r in runs] == cache.cached and runs[2].cached_tokens > 0
