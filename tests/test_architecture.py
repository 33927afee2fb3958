"""The import rules of the design: who may import whom, and where each SDK lives."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ("gateway", "channels", "scheduler")


def modules(package: str, root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (root / package).rglob("*.py") if "versions" not in p.parts)


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def project_imports(path: Path) -> set[str]:
    return {name for name in imports_of(path) if name.split(".")[0] in PROJECT}


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_events_import_nothing_from_the_project():
    assert project_imports(ROOT / "gateway" / "events.py") == set()


@pytest.mark.parametrize("path", modules("channels"), ids=rel)
def test_channels_import_only_the_vocabulary_and_their_config(path):
    allowed = {"gateway.events", "gateway.config"}
    bad = {name for name in project_imports(path) if name not in allowed and not name.startswith("channels")}
    assert not bad, f"{rel(path)} imports {bad}: channels know nothing of the core"


# The scheduler's agent tools use the tool registry's types; that is their one way into the core.
SCHEDULER_EXCEPTIONS = {
    "scheduler/tools.py": {"gateway.tools.registry"},
    "scheduler/checklist_tool.py": {"gateway.tools.registry"},
}


@pytest.mark.parametrize("path", modules("scheduler"), ids=rel)
def test_scheduler_imports_events_store_and_config_only(path):
    allowed = {"gateway.events", "gateway.config", "gateway.store"} | SCHEDULER_EXCEPTIONS.get(rel(path), set())
    bad = {
        name for name in project_imports(path)
        if not name.startswith("scheduler") and not any(name == a or name.startswith(a + ".") for a in allowed)
    }
    assert not bad, f"{rel(path)} imports {bad}"


def test_only_the_composition_root_wires_channels_and_the_scheduler():
    wiring = {"gateway/app.py", "gateway/__main__.py"}
    offenders = {
        rel(path)
        for path in modules("gateway")
        if rel(path) not in wiring and any(n.split(".")[0] in ("channels", "scheduler") for n in project_imports(path))
    }
    assert offenders == set()


SDK_HOMES = {
    "telegram": ("channels/telegram/",),
    "telegram.error": ("channels/telegram/api.py",),  # the SDK's errors become ChannelErrors there
    "slack_bolt": ("channels/slack/",),
    "slack_sdk": ("channels/slack/",),
    "apscheduler": ("scheduler/",),
    "markdown_it": ("channels/markdown.py",),
    "jinja2": ("gateway/admin/",),
    "trafilatura": ("gateway/tools/readable.py",),
    "aiohttp": ("gateway/serving/http.py", "gateway/admin/", "channels/"),
    "sqlalchemy": ("gateway/store/", "gateway/migrations/"),
    "alembic": ("gateway/store/", "gateway/migrations/"),
    "mcp": ("gateway/mcp/sdk.py",),
    "mcp_types": ("gateway/mcp/sdk.py",),
    "httpx2": ("gateway/mcp/sdk.py",),
    "opentelemetry": ("gateway/telemetry/otlp.py",),
}


@pytest.mark.parametrize("sdk", sorted(SDK_HOMES))
def test_each_sdk_is_imported_in_its_own_place(sdk):
    offenders = {
        rel(path)
        for package in PROJECT
        for path in modules(package)
        if any(name == sdk or name.startswith(sdk + ".") for name in imports_of(path))
        and not rel(path).startswith(SDK_HOMES[sdk])
    }
    assert offenders == set(), f"{sdk} imported outside {SDK_HOMES[sdk]}"


# The core's packages form layers, the flow of one message: the inbox runs the agent's turn, the
# turn asks approvals. A lower layer never imports a higher one.
LAYERS = ("gateway.inbox", "gateway.agent", "gateway.approvals")


@pytest.mark.parametrize("layer", LAYERS)
def test_core_packages_import_only_downwards(layer):
    higher = LAYERS[: LAYERS.index(layer)]
    offenders = {
        f"{rel(path)} imports {name}"
        for path in modules(layer.replace(".", "/"))
        for name in project_imports(path)
        if any(name == h or name.startswith(h + ".") for h in higher)
    }
    assert offenders == set()


# --- no import cycles ---------------------------------------------------------------------------
# Every import counts, those under TYPE_CHECKING and inside functions too: a cycle there is a
# module that needs to know the one that needs it (move the shared types down, or pass a protocol).


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports: `from a import b` is the module `a.b` when there is
    one, else `a`; relative imports are resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                found.add(submodule if submodule in known else module)
    return (found & known) - {name}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    paths = {module_name(path, root): path for package in PROJECT for path in modules(package, root)}
    known = set(paths)
    return {name: imported_modules(name, path, known) for name, path in paths.items()}


def reachable(graph: Mapping[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The groups of two or more modules that all reach each other, each sorted."""
    reach = {node: reachable(graph, node) for node in graph}
    groups = {
        tuple(sorted(other for other in reach[node] if node in reach.get(other, ())))
        for node in graph
        if node in reach[node]
    }
    return sorted(list(group) for group in groups if len(group) > 1)


def test_the_cycle_finder_finds_cycles_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set(), "f": {"f", "e"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"x": {"y"}, "y": set()}) == []
    assert cycles({"x": {"y"}, "y": {"x"}, "z": {"w"}, "w": {"z"}}) == [["w", "z"], ["x", "y"]]


def test_the_import_graph_sees_type_checking_relative_and_submodule_imports(tmp_path):
    package = tmp_path / "gateway"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("from . import leaf\n")
    (package / "inner" / "leaf.py").write_text("def f():\n    from gateway import top\n")
    (package / "top.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.inner.leaf import f\n"
    )
    graph = import_graph(tmp_path)
    assert graph == {
        "gateway": set(),
        "gateway.inner": {"gateway.inner.leaf"},
        "gateway.inner.leaf": {"gateway.top"},
        "gateway.top": {"gateway.inner.leaf"},
    }
    assert cycles(graph) == [["gateway.inner.leaf", "gateway.top"]]


def test_there_is_no_import_cycle():
    assert cycles(import_graph()) == []


# The web console reads through the store and acts through the paths the chat and the CLI use
# (a decision is a button press submitted to the inbox); the running gateway reaches it only
# through the Operations protocol the composition root provides.
ADMIN_ALLOWED = (
    "gateway.admin", "gateway.store", "gateway.config", "gateway.events", "gateway.approvals.prompts",
    "gateway.budgets", "gateway.cli.reports", "gateway.traces.runs", "gateway.access.cli", "gateway.access.policy",
    "gateway.serving.guesses",  # the limit on wrong admin tokens, shared with /metrics (standard library only)
    "gateway.skills.catalog",  # the skills' pins and what changed on disk since (it only reads)
)


@pytest.mark.parametrize("path", modules("gateway/admin"), ids=rel)
def test_the_console_reads_through_the_store_and_acts_through_the_inbox(path):
    bad = {
        name for name in project_imports(path)
        if not any(name == a or name.startswith(a + ".") for a in ADMIN_ALLOWED)
    }
    assert not bad, f"{rel(path)} imports {bad}"


def test_only_the_composition_root_and_the_http_server_know_the_console():
    users = {rel(p) for p in modules("gateway") if any(n.startswith("gateway.admin") for n in project_imports(p))}
    assert users - {"gateway/app.py"} == {r for r in users if r.startswith("gateway/admin/")}


def test_a_runs_stage_is_written_by_run_trace():
    """`RunTrace` (gateway/traces/runs.py) is the one writer of a run's stage; the reply stream writes
    only the `FinalStage` RunTrace gave it, inside the write that marks the reply sent, and the
    store's own transactions use `set_stage_in`."""
    writers = {
        rel(p)
        for package in PROJECT
        for p in modules(package)
        if ".set_stage(" in p.read_text(encoding="utf-8")
    }
    assert writers == {"gateway/traces/runs.py"}


def test_thread_keys_are_written_and_read_by_thread_key():
    """`ThreadKey` (gateway/events.py) owns the key's format: no module splits a thread key by hand."""
    hand_split = (
        'thread_key.split(":"', 'thread_key.partition(":"', 'thread_key.startswith("task:',
        'thread_key.rpartition(":"', 'thread_key.rsplit(":"',
    )
    offenders = {
        rel(p)
        for package in PROJECT
        for p in modules(package)
        if any(pattern in p.read_text(encoding="utf-8") for pattern in hand_split)
    }
    assert not offenders
