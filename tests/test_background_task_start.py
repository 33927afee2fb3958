"""A background task's inbox item is done in the write that starts its child's run: a crash
(or a lost lease) between the two left the item done and the task never started."""

from __future__ import annotations

import pytest

from gateway.store import ChildSession, Fence, LeaseLost, NewTask
from gateway.store.items import started_task

CHILD = ChildSession(source="telegram", interactive=True, started_by="telegram:7", max_rounds=None, max_tokens=None)


async def background_task(store):  # noqa: ANN001, ANN201
    parent = await store.sessions.open("telegram:7:", source="telegram")
    run = await store.runs.start(parent.id, "telegram:7:")
    [task] = await store.delegations.create(
        parent_session_id=parent.id, parent_run_id=run.id, parent_tool_call_id=1, thread_key="telegram:7:",
        tasks=[NewTask("lookup", "Look it up.", ())], depth=1, background=True, child=CHILD,
    )
    [item] = await store.inbox.pending(task.task_thread, limit=5)
    return task, item


async def test_starting_the_run_is_what_marks_the_task_item_done(store) -> None:
    task, item = await background_task(store)
    lease = await store.inbox.acquire(f"thread:{task.task_thread}", "worker", 30)
    fence = Fence(lease.name, lease.owner, lease.fence)
    run, _row = await store.delegations.begin(task, model="m", fence=fence, item_id=started_task(item).item_id)
    assert await store.inbox.pending(task.task_thread, limit=5) == []
    assert (await store.delegations.get(task.id)).child_run_id == run.id


async def test_a_start_that_fails_leaves_the_item_to_start_the_task_again(store) -> None:
    task, item = await background_task(store)
    stale = Fence(f"thread:{task.task_thread}", "worker", 99)  # another holder's turn now
    with pytest.raises(LeaseLost):
        await store.delegations.begin(task, model="m", fence=stale, item_id=item.id)
    assert [i.id for i in await store.inbox.pending(task.task_thread, limit=5)] == [item.id]
    assert (await store.delegations.get(task.id)).child_run_id is None
