"""The tool registry (schemas, run_tool) and the clock, scratchpad and file built-ins."""

from __future__ import annotations

import asyncio
import os
from datetime import datetime, timedelta
from typing import Annotated, Literal
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel, Field
from tooling import call, make_ctx

from gateway.config import AgentConfig
from gateway.tools import (
    ToolContext,
    ToolError,
    ToolOutcome,
    ToolRegistry,
    ToolSpec,
    build_spec,
    default_registry,
    run_tool,
)
from gateway.tools.schema import parse_docstring

# --- schema derivation ---------------------------------------------------------------------


async def typed_tool(
    ctx: ToolContext,
    name: str,
    count: int,
    ratio: float = 0.5,
    loud: bool = False,
    tags: list[str] = [],  # noqa: B006 - the schema's default is read from this signature
    mode: Literal["fast", "slow"] = "fast",
    limit: int | None = None,
    level: Literal[1, 2] | None = None,
    extra: dict[str, int] | None = None,
    note: Annotated[str, "a note from the annotation"] = "",
) -> str:
    """Do a typed thing.

    Second line of the summary.

    Args:
        name: who to greet
        count: how many
            times, at least one
        ratio: a fraction
    """
    return f"{name}:{count}:{ratio}:{loud}:{tags}:{mode}:{limit}:{level}:{extra}:{note}"


def test_schema_from_signature_types_defaults_and_required():
    spec = build_spec(typed_tool)
    params = spec.parameters
    props = params["properties"]
    assert params["type"] == "object" and params["additionalProperties"] is False
    assert params["required"] == ["name", "count"]
    assert props["name"] == {"type": "string", "description": "who to greet"}
    assert props["count"] == {"type": "integer", "description": "how many times, at least one"}
    assert props["ratio"] == {"type": "number", "description": "a fraction", "default": 0.5}
    assert props["loud"] == {"type": "boolean", "default": False}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "default": []}
    assert props["mode"] == {"type": "string", "enum": ["fast", "slow"], "default": "fast"}
    assert props["limit"] == {"type": ["integer", "null"], "default": None}
    assert props["level"] == {"type": ["integer", "null"], "enum": [1, 2, None], "default": None}
    assert props["extra"] == {"type": ["object", "null"], "additionalProperties": {"type": "integer"}, "default": None}
    assert props["note"] == {"type": "string", "description": "a note from the annotation", "default": ""}
    assert spec.description == "Do a typed thing.\n\nSecond line of the summary."
    assert "ctx" not in props


def test_docstring_sections_after_args_are_not_parameters():
    summary, params = parse_docstring("Sum.\n\nArgs:\n    a: first\n    b: second\n\nReturns:\n    c: not a param\n")
    assert summary == "Sum."
    assert params == {"a": "first", "b": "second"}


class FetchArgs(BaseModel):
    """Fetch things described by a model."""

    url: str = Field(description="where")
    retries: int = 2
    title: str = "kept: a property named title"


async def model_tool(ctx: ToolContext, args: FetchArgs) -> str:
    return f"{args.url} x{args.retries}"


def test_schema_from_pydantic_model():
    spec = build_spec(model_tool)
    params = spec.parameters
    assert spec.description == "Fetch things described by a model."
    assert params["type"] == "object"
    assert params["required"] == ["url"]
    assert params["properties"]["url"] == {"type": "string", "description": "where"}
    assert params["properties"]["retries"] == {"type": "integer", "default": 2}
    assert "title" in params["properties"]  # a property called title survives title stripping
    assert "title" not in params


async def test_pydantic_tool_runs_and_reports_bad_arguments(tmp_path):
    spec = build_spec(model_tool)
    ctx = make_ctx(tmp_path)
    assert (await run_tool(spec, {"url": "http://x"}, ctx)).text == "http://x x2"
    bad = await run_tool(spec, {"url": "http://x", "retries": "many"}, ctx)
    assert bad.failed and "retries" in bad.text and "Fix the arguments" in bad.text


def test_unsupported_annotations_are_refused_at_registration():
    async def uses_set(ctx: ToolContext, items: set[str]) -> str:
        return ""

    async def untyped(ctx, items) -> str:  # type: ignore[no-untyped-def]
        return ""

    def not_async(ctx: ToolContext) -> str:
        return ""

    with pytest.raises(TypeError, match="items"):
        build_spec(uses_set)
    with pytest.raises(TypeError, match="annotation"):
        build_spec(untyped)
    with pytest.raises(TypeError, match="async"):
        build_spec(not_async)


def test_registry_lookup_globs_order_and_openai_shape():
    registry = default_registry(AgentConfig())
    assert registry.get("shell") is not None and registry.get("nope") is None
    assert [s.name for s in registry.specs(["scratchpad_*", "clock"])] == ["clock", "scratchpad_set", "scratchpad_get"]
    tools = registry.openai_tools(["read_file"])
    assert tools == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": registry.get("read_file").description,
                "parameters": registry.get("read_file").parameters,
            },
        }
    ]
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.get("clock"))


def test_default_registry_filters_by_agent_tools_globs():
    registry = default_registry(AgentConfig(tools=["clock", "*_file"]))
    assert registry.names() == ["clock", "read_file", "write_file", "send_file"]


def test_builtins_declare_side_effects_classes_and_lod():
    registry = default_registry(AgentConfig())
    table = {s.name: (s.side_effects, set(s.classes), s.lod) for s in registry.specs()}
    assert table["write_file"] == (True, {"fs_write"}, "head")
    assert table["shell"] == (True, {"exec"}, "tail")
    assert table["web_fetch"][1] == {"network"}
    assert table["read_file"] == (False, {"fs_read"}, "head")
    assert not table["clock"][0] and not table["scratchpad_set"][0]


def test_decorator_registers_and_invalid_names_are_refused():
    registry = ToolRegistry()

    @registry.tool(side_effects=True, classes={"exec"}, lod="tail")
    async def deploy(ctx: ToolContext, target: str) -> str:
        """Deploy."""
        return target

    spec = registry.get("deploy")
    assert spec is not None and spec.side_effects and spec.lod == "tail"
    with pytest.raises(ValueError, match="tool name"):
        build_spec(deploy, name="has space")
    with pytest.raises(ValueError, match="lod"):
        build_spec(deploy, name="ok", lod="middle")  # type: ignore[arg-type]


# --- run_tool ------------------------------------------------------------------------------


async def test_run_tool_turns_failures_into_outcomes(tmp_path):
    registry = ToolRegistry()

    @registry.tool()
    async def explode(ctx: ToolContext, kind: str) -> str:
        if kind == "tool":
            raise ToolError("the disk is full")
        if kind == "bug":
            raise KeyError("missing")
        return {"ok": kind}  # type: ignore[return-value]

    ctx = make_ctx(tmp_path)
    spec = registry.get("explode")
    assert await run_tool(spec, {"kind": "tool"}, ctx) == ToolOutcome("the disk is full", failed=True)
    bug = await run_tool(spec, {"kind": "bug"}, ctx)
    assert bug.failed and "KeyError" in bug.text and "missing" in bug.text
    ok = await run_tool(spec, {"kind": "x"}, ctx)
    assert not ok.failed and ok.text == '{"ok": "x"}'
    unknown = await run_tool(spec, {"kind": "x", "force": True}, ctx)
    assert unknown.failed and "unknown argument(s): force" in unknown.text
    missing = await run_tool(spec, {}, ctx)
    assert missing.failed and "missing required argument(s): kind" in missing.text


async def test_run_tool_lets_cancellation_propagate(tmp_path):
    registry = ToolRegistry()
    started = asyncio.Event()

    @registry.tool()
    async def wait_forever(ctx: ToolContext) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(run_tool(registry.get("wait_forever"), {}, make_ctx(tmp_path)))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# --- clock and scratchpad ------------------------------------------------------------------


async def test_clock_reports_now_in_the_configured_zone(tmp_path):
    zone = "Asia/Kolkata"  # a +05:30 offset nobody's machine runs in by accident
    before = datetime.now(ZoneInfo(zone)).replace(microsecond=0)
    outcome = await call(make_ctx(tmp_path, timezone=zone), "clock")
    after = datetime.now(ZoneInfo(zone))
    stamp, weekday, shown_zone = outcome.text.split(" ")
    moment = datetime.fromisoformat(stamp)
    assert moment.utcoffset() == timedelta(hours=5, minutes=30)
    assert before <= moment <= after
    assert weekday == moment.strftime("%A") and shown_zone == f"({zone})"


async def test_clock_with_unknown_zone_fails_clearly(tmp_path):
    outcome = await call(make_ctx(tmp_path, timezone="Mars/Olympus"), "clock")
    assert outcome.failed and "Mars/Olympus" in outcome.text


async def test_scratchpad_set_get_and_remove(tmp_path):
    ctx = make_ctx(tmp_path)
    assert (await call(ctx, "scratchpad_get")).text == "The scratchpad is empty."
    assert not (await call(ctx, "scratchpad_set", key="plan", value="ship it")).failed
    await call(ctx, "scratchpad_set", key="owner", value="ann")
    assert await ctx.notes.get_notes(1) == {"plan": "ship it", "owner": "ann"}
    assert (await call(ctx, "scratchpad_get", key="plan")).text == "ship it"
    assert (await call(ctx, "scratchpad_get")).text == "owner: ann\nplan: ship it"
    missing = await call(ctx, "scratchpad_get", key="nope")
    assert "No note named 'nope'" in missing.text and "owner, plan" in missing.text
    assert (await call(ctx, "scratchpad_set", key="plan", value="")).text == "Removed note 'plan'."
    assert await ctx.notes.get_notes(1) == {"owner": "ann"}
    assert await ctx.notes.get_notes(2) == {}  # notes are per session


async def test_scratchpad_rejects_bad_keys_and_oversized_values(tmp_path):
    ctx = make_ctx(tmp_path)
    bad_key = await call(ctx, "scratchpad_set", key="a/b\n", value="x")
    assert bad_key.failed and "key must be" in bad_key.text
    too_long = await call(ctx, "scratchpad_set", key="k", value="x" * 2001)
    assert too_long.failed and "2001" in too_long.text
    assert await ctx.notes.get_notes(1) == {}


async def test_scratchpad_caps_the_number_of_notes(tmp_path):
    ctx = make_ctx(tmp_path)
    for i in range(32):
        assert not (await call(ctx, "scratchpad_set", key=f"k{i}", value="v")).failed
    full = await call(ctx, "scratchpad_set", key="one-more", value="v")
    assert full.failed and "remove one" in full.text
    assert not (await call(ctx, "scratchpad_set", key="k0", value="replaced")).failed


# --- files ---------------------------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    (root / "secrets").mkdir()
    (root / "secrets" / "token").write_text("hunter2")
    (tmp_path / "outside.txt").write_text("private")
    return root


async def test_read_file_whole_and_windowed(workspace):
    ctx = make_ctx(workspace)
    assert (await call(ctx, "read_file", path="notes.txt")).text.startswith("line 1\nline 2\n")
    window = (await call(ctx, "read_file", path="notes.txt", offset=3, limit=2)).text
    assert window == "line 4\nline 5\n[lines 4-5 of 10; call again with offset=5 for more]"
    past = await call(ctx, "read_file", path="notes.txt", offset=50)
    assert "past the end" in past.text and "10 lines" in past.text


async def test_read_file_refuses_bad_windows_directories_missing_and_binary(workspace):
    ctx = make_ctx(workspace)
    (workspace / "blob.bin").write_bytes(b"\x00\x01\x02")
    assert "offset" in (await call(ctx, "read_file", path="notes.txt", offset=-1)).text
    assert (await call(ctx, "read_file", path="notes.txt", limit=0)).failed
    assert "list_dir" in (await call(ctx, "read_file", path=".")).text
    missing = await call(ctx, "read_file", path="nope.txt")
    assert missing.failed and "no such file: nope.txt" in missing.text
    assert "binary file" in (await call(ctx, "read_file", path="blob.bin")).text


@pytest.mark.parametrize("tool", ["read_file", "list_dir"])
async def test_escape_via_dotdot_and_absolute_path_is_refused(workspace, tool):
    ctx = make_ctx(workspace)
    for path in ("../outside.txt", str(workspace.parent / "outside.txt"), "sub/../../outside.txt"):
        outcome = await call(ctx, tool, path=path)
        assert outcome.failed and "outside the workspace" in outcome.text
        assert "private" not in outcome.text


async def test_escape_via_symlink_is_refused(workspace):
    (workspace / "link.txt").symlink_to(workspace.parent / "outside.txt")
    (workspace / "linkdir").symlink_to(workspace.parent)
    ctx = make_ctx(workspace)
    for path in ("link.txt", "linkdir/outside.txt"):
        outcome = await call(ctx, "read_file", path=path)
        assert outcome.failed and "outside the workspace" in outcome.text
    write = await call(ctx, "write_file", path="link.txt", content="overwritten")
    assert write.failed and (workspace.parent / "outside.txt").read_text() == "private"


async def test_secrets_directory_is_refused_for_every_file_tool(workspace):
    (workspace / "innocent").symlink_to(workspace / "secrets")
    ctx = make_ctx(workspace)
    attempts = [
        ("read_file", {"path": "secrets/token"}),
        ("read_file", {"path": "innocent/token"}),
        ("read_file", {"path": "Secrets/token"}),
        ("list_dir", {"path": "secrets"}),
        ("write_file", {"path": "secrets/new", "content": "x"}),
        ("write_file", {"path": "deep/secrets/new", "content": "x"}),
    ]
    for name, args in attempts:
        outcome = await call(ctx, name, **args)
        assert outcome.failed and "secrets/" in outcome.text, (name, args)
        assert "hunter2" not in outcome.text
    assert not (workspace / "secrets" / "new").exists() and not (workspace / "deep").exists()
    listing = (await call(ctx, "list_dir")).text.split("\n")
    assert "notes.txt  (71 bytes)" in listing and "secrets/" not in listing


async def test_write_file_creates_parents_and_replaces(workspace):
    ctx = make_ctx(workspace)
    outcome = await call(ctx, "write_file", path="out/report.md", content="héllo")
    assert outcome.text == "Wrote 6 bytes to out/report.md."
    assert (workspace / "out" / "report.md").read_text(encoding="utf-8") == "héllo"
    await call(ctx, "write_file", path="out/report.md", content="v2")
    assert (workspace / "out" / "report.md").read_text() == "v2"
    assert [p.name for p in (workspace / "out").iterdir()] == ["report.md"]  # no temp files left
    assert "directory" in (await call(ctx, "write_file", path="out", content="x")).text


async def test_list_dir_shows_dirs_files_and_links_but_not_secrets(workspace):
    (workspace / "sub").mkdir()
    (workspace / "link").symlink_to(workspace / "notes.txt")
    listing = (await call(make_ctx(workspace), "list_dir")).text.split("\n")
    assert listing == ["sub/", "link@", "notes.txt  (71 bytes)"]
    assert "is a file" in (await call(make_ctx(workspace), "list_dir", path="notes.txt")).text
    assert "no such directory" in (await call(make_ctx(workspace), "list_dir", path="ghost")).text


async def test_workspace_is_created_on_first_use(tmp_path):
    ctx = make_ctx(tmp_path / "fresh" / "ws")
    assert (await call(ctx, "list_dir")).text == "(. is empty)"
    assert os.path.isdir(tmp_path / "fresh" / "ws")


async def test_unions_tuples_and_literal_lists_in_schemas(tmp_path):
    async def mixed(
        ctx: ToolContext,
        either: int | str,
        modes: list[Literal["a", "b"]],
        pair: tuple[float, ...] = (),
        maybe_either: int | str | None = None,
    ) -> str:
        return f"{either}|{modes}|{pair}|{maybe_either}"

    props = build_spec(mixed).parameters["properties"]
    assert props["either"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert props["modes"] == {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}
    assert props["pair"] == {"type": "array", "items": {"type": "number"}, "default": []}
    assert props["maybe_either"]["anyOf"][-1] == {"type": "null"}
    outcome = await run_tool(build_spec(mixed), {"either": 3, "modes": ["a"]}, make_ctx(tmp_path))
    assert outcome.text == "3|['a']|()|None"


async def test_hand_written_spec_is_called_with_the_argument_dict(tmp_path):
    async def echo(ctx: ToolContext, args: dict) -> str:
        return f"{ctx.session_id}:{args['word']}"

    spec = ToolSpec("echo", "Echo a word.", {"type": "object", "properties": {"word": {"type": "string"}}}, echo)
    registry = ToolRegistry([spec])
    assert (await run_tool(registry.get("echo"), {"word": "hi"}, make_ctx(tmp_path))).text == "1:hi"
    with pytest.raises(ValueError, match="type object"):
        ToolSpec("bad", "", {"type": "string"}, echo)
