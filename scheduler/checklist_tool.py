"""The agent's `checklist` tool: show or change the checklist of a tick that reports here.

Offered only in conversations with a person, and refused in any other session even if offered
by mistake: a tick's own run must not rewrite its checklist (to keep itself waking, or to
silence it), nor another job's. Changing a checklist needs an approval like any write; showing
it does not. Only ticks that deliver to this conversation are reachable from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.store import Store
from gateway.store.schedules import ScheduleRecord
from gateway.tools.registry import ToolContext, ToolError, ToolSpec
from scheduler.checklist import CHECKLISTS_DIR, ChecklistNameError, check_name, open_items
from scheduler.definitions import DefinitionError, deliver_to_text

WriteChecklist = Callable[[str, str], None]
ReadChecklist = Callable[[str], str | None]

NOT_HERE = (
    "The checklist tool works only in a conversation with a person; scheduled runs cannot change a checklist."
)
DESCRIPTION = (
    "Show or change the checklist of a tick job that reports in this conversation. The tick calls the model only "
    "when its checklist has open items not yet answered: lines like '- [ ] water the plants'; checked items "
    "('- [x] ...'), headings and <!-- comments --> are not open. Actions: show; add (one open item); write "
    "(replace the whole checklist)."
)
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["show", "add", "write"], "description": "what to do"},
        "job": {"type": "string", "description": "the tick's name (optional when only one tick reports here)"},
        "item": {"type": "string", "description": "the item to add, e.g. 'check the mail for the invoice' (add)"},
        "content": {"type": "string", "description": "the whole new checklist, Markdown (write)"},
    },
    "required": ["action"],
    "additionalProperties": False,
}


def changes_a_checklist(args: Mapping[str, Any]) -> str | None:
    """Showing is free; adding or writing changes what a tick does, so a person approves it."""
    return None if args.get("action") == "show" else "it changes a tick's checklist"


def checklist_tool(store: Store, read: ReadChecklist, write: WriteChecklist) -> ToolSpec:
    tool = _ChecklistTool(store, read, write)
    return ToolSpec(
        name="checklist", description=DESCRIPTION, parameters=PARAMETERS, func=tool,
        classes=frozenset({"fs_write", "interactive_only"}), needs_approval=changes_a_checklist,
    )


class _ChecklistTool:
    def __init__(self, store: Store, read: ReadChecklist, write: WriteChecklist):
        self.repo, self.read, self.write = store.schedules, read, write

    async def __call__(self, ctx: ToolContext, args: dict[str, Any]) -> str:
        if not ctx.interactive or ctx.source in ("cron", "tick"):
            raise ToolError(NOT_HERE)
        job = await self._job(ctx, str(args.get("job") or ""))
        try:
            name = check_name(job.checklist or "")
        except ChecklistNameError as exc:
            raise ToolError(str(exc)) from None
        action = args.get("action")
        if action == "show":
            return self._show(job, name)
        if action == "add":
            return self._add(job, name, str(args.get("item") or ""))
        if action == "write":
            if "content" not in args:
                raise ToolError("write needs `content`: the whole new checklist")
            return self._write(job, name, str(args["content"]))
        raise ToolError(f"action must be show, add or write, got {action!r}")

    async def _job(self, ctx: ToolContext, wanted: str) -> ScheduleRecord:
        try:
            here = deliver_to_text(ctx.thread)
        except DefinitionError as exc:
            raise ToolError(str(exc)) from None
        ticks = [j for j in await self.repo.list(deliver_to=here) if j.kind == "tick" and j.checklist]
        if wanted:
            found = [j for j in ticks if j.name == wanted]
            if not found:
                names = ", ".join(j.name for j in ticks) or "none"
                raise ToolError(
                    f"no tick named {wanted!r} with a checklist reports in this conversation (those that do: {names})"
                )
            return found[0]
        if len(ticks) != 1:
            names = ", ".join(j.name for j in ticks)
            none = "no tick with a checklist reports in this conversation"
            raise ToolError(f"name the tick with `job`: {names}" if ticks else none)
        return ticks[0]

    def _show(self, job: ScheduleRecord, name: str) -> str:
        text = self.read(name)
        if text is None:
            return f"The checklist of {job.name} ({CHECKLISTS_DIR}/{name}) does not exist yet: it is empty."
        items = open_items(text)
        return (
            f"The checklist of {job.name} ({CHECKLISTS_DIR}/{name}), {len(items)} open item(s):\n{text.rstrip()}"
        )

    def _add(self, job: ScheduleRecord, name: str, item: str) -> str:
        line = " ".join(item.split()).removeprefix("- [ ]").strip()
        if not line:
            raise ToolError("add needs `item`: the text of the open item")
        text = self.read(name) or ""
        entry = f"- [ ] {line}"
        if entry in open_items(text):
            return f"{job.name}'s checklist already has the open item {entry!r}."
        self._save(name, (text.rstrip("\n") + "\n" if text.strip() else "") + entry + "\n")
        return f"Added {entry!r} to {job.name}'s checklist; the tick works on it at its next firing."

    def _write(self, job: ScheduleRecord, name: str, content: str) -> str:
        self._save(name, content if content.endswith("\n") or not content else content + "\n")
        count = len(open_items(content))
        then = "it works on them at its next firing" if count else "it will not call the model until an item is added"
        return f"Wrote {job.name}'s checklist: {count} open item(s); {then}."

    def _save(self, name: str, text: str) -> None:
        try:
            self.write(name, text)
        except (OSError, ValueError) as exc:
            raise ToolError(f"could not write the checklist: {exc}") from None
