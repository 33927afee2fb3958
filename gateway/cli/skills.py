"""`gateway skills add PATH | list | approve NAME | disable NAME | enable NAME | remove NAME`:
Agent Skills pinned by the SHA-256 of every file (docs/skills.md).

`add` reads the folder, refuses what the door finds (each finding one line; `--force` adds it
anyway and records the reasons), copies a folder from outside `skills.dirs` into the first of
them (so the pinned copy is the one read) and pins it. `approve` shows what changed since the
pin, runs the door again and pins the files as they are now.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from gateway.config import Config
from gateway.skills import SkillCatalog, SkillFormatError, SkillState, digest_of, inspect, manifest, read_meta
from gateway.skills.catalog import CHANGED, DISABLED, INVALID, MISSING, NOT_ADDED, OFFERED, OUTSIDE
from gateway.skills.mcp_source import SkillSourceError, download
from gateway.store import Store

CLI = "cli"  # approved_by of a pin made here: the operator at the terminal
MCP_ORIGIN = "mcp:"  # `add mcp:<server>/<name>`: a skill an MCP server serves (gateway/skills/mcp_source.py)


def add_parser(subparsers: Any, *, parents: Sequence[argparse.ArgumentParser], handler: Callable[..., Any]) -> None:
    skills = subparsers.add_parser(
        "skills", parents=list(parents), help="Agent Skills: add, list, approve changes, disable, remove",
        description="Agent Skills pinned by the SHA-256 of every file: a skill whose files changed is not "
        "offered until approved (docs/skills.md).",
    )
    skills.set_defaults(handler=handler)
    actions = skills.add_subparsers(dest="skills_command", metavar="ACTION", required=True)
    add = actions.add_parser("add", parents=list(parents), help="check a skill folder and pin its files")
    add.add_argument("path", help="a skill folder (with a SKILL.md), or mcp:<server>/<name>: one an MCP server serves")
    add.add_argument("--force", action="store_true", help="add it although the checks found something (shown)")
    actions.add_parser("list", parents=list(parents), help="every skill: name, status, origin, hash")
    approve = actions.add_parser("approve", parents=list(parents), help="show what changed, then pin it as it is now")
    approve.add_argument("name")
    approve.add_argument("--force", action="store_true", help="approve although the checks found something")
    for action, what in (("disable", "stop offering a skill (kept pinned)"), ("enable", "offer a disabled skill again"),
                         ("remove", "forget a skill's pin (its folder stays on disk)")):
        actions.add_parser(action, parents=list(parents), help=what).add_argument("name")


async def run(args: argparse.Namespace, store: Store, config: Config, out: TextIO = sys.stdout) -> int:
    catalog = SkillCatalog(config.skills, store)
    command = args.skills_command
    if command == "add" and args.path.startswith(MCP_ORIGIN):
        return await add_from_mcp(catalog, config, args.path, force=args.force, out=out)
    if command == "add":
        return await add(catalog, Path(args.path), force=args.force, out=out)
    if command == "list":
        return await list_skills(catalog, out)
    if command == "approve":
        return await approve(catalog, args.name, force=args.force, out=out)
    pin = await store.skills.get(args.name)
    if pin is None:
        print(f"no skill named {args.name!r} is added; gateway skills list shows them", file=out)
        return 1
    if command == "remove":
        await store.skills.remove(args.name)
        print(f"removed {args.name}: no longer offered; its folder {pin.path} stays on disk", file=out)
    else:
        await store.skills.set_status(args.name, "disabled" if command == "disable" else "approved")
        print(f"{args.name}: {'disabled, not offered' if command == 'disable' else 'enabled'}", file=out)
    return 0


async def add_from_mcp(catalog: SkillCatalog, config: Config, source: str, *, force: bool, out: TextIO) -> int:
    """`mcp:<server>/<name>`: the skill a configured MCP server serves, downloaded, then added
    like a folder (checked, copied into skills.dirs, pinned)."""
    server, _, name = source[len(MCP_ORIGIN):].partition("/")
    settings = config.mcp.servers.get(server)
    if settings is None or not name:
        known = ", ".join(sorted(config.mcp.servers)) or "none in mcp.servers"
        print(f"not added: write mcp:<server>/<skill> with a server of mcp.servers ({known})", file=out)
        return 1
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / name
        try:
            await download(server, settings, name, folder)
        except SkillSourceError as exc:
            print(f"not added: {exc}", file=out)
            return 1
        return await add(catalog, folder, force=force, out=out, origin=source)


async def add(catalog: SkillCatalog, path: Path, *, force: bool, out: TextIO, origin: str = "") -> int:
    folder = path.expanduser().resolve()
    try:
        meta = read_meta(folder)
    except SkillFormatError as exc:
        print(f"not added: {exc}", file=out)
        return 1
    if await catalog.store.skills.get(meta.name) is not None:
        print(f"not added: a skill named {meta.name!r} is added already; gateway skills approve {meta.name} "
              "pins its files as they are now", file=out)
        return 1
    if folder.name != meta.name:
        print(f"not added: the folder {folder.name!r} must be named like the skill ({meta.name!r}); rename it",
              file=out)
        return 1
    if not _refused_or_forced(folder, force, out, verb="added"):
        return 1
    if not catalog.in_dirs(folder):
        if not catalog.dirs:
            print("not added: skills.dirs is empty, so no skill would be offered; set skills.dirs in config.yml "
                  "(a directory of skill folders)", file=out)
            return 1
        target = catalog.dirs[0] / meta.name
        if target.exists():
            print(f"not added: {target} exists already; remove it or add that folder", file=out)
            return 1
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(folder, target, symlinks=True)
        print(f"copied {origin or folder} to {target}", file=out)
        origin, folder = origin or str(path), target
    else:
        origin = origin or str(folder)
    files = manifest(folder)
    forced = [str(f) for f in inspect(folder)]
    await catalog.store.skills.pin(meta.name, origin=origin, path=str(folder), files=files,
                                   digest=digest_of(files), approved_by=CLI, forced=forced)
    print(f"added {meta.name}: {len(files)} files pinned, sha256 {digest_of(files)[:16]}", file=out)
    return 0


async def approve(catalog: SkillCatalog, name: str, *, force: bool, out: TextIO) -> int:
    pin = await catalog.store.skills.get(name)
    if pin is None:
        print(f"no skill named {name!r} is added; gateway skills add PATH adds one", file=out)
        return 1
    state = catalog.state_of(pin)
    if state.status in (MISSING, INVALID):
        print(f"not approved: {state.problem or f'{pin.path} has no SKILL.md'}", file=out)
        return 1
    folder = Path(pin.path)
    if state.change:
        print(f"{name} changed since it was pinned ({state.change.summary()}):", file=out)
        for line in state.change.lines():
            print(line, file=out)
    else:
        print(f"{name}: no file changed since it was pinned", file=out)
    if not _refused_or_forced(folder, force, out, verb="approved"):
        return 1
    files = manifest(folder)
    await catalog.store.skills.pin(name, origin=pin.origin, path=pin.path, files=files, digest=digest_of(files),
                                   approved_by=CLI, forced=[str(f) for f in inspect(folder)], status=pin.status)
    still = " (still disabled: gateway skills enable offers it)" if pin.status == DISABLED else ""
    print(f"approved {name}: {len(files)} files pinned, sha256 {digest_of(files)[:16]}{still}", file=out)
    return 0


async def list_skills(catalog: SkillCatalog, out: TextIO) -> int:
    states = await catalog.states()
    if not states:
        where = ", ".join(str(d) for d in catalog.dirs) or "no skills.dirs configured"
        print(f"no skills ({where}); gateway skills add PATH adds one", file=out)
        return 0
    for state in states:
        print(state_line(state), file=out)
    return 0


def state_line(state: SkillState) -> str:
    digest = state.digest[:16] if state.digest else "-"
    what = {
        OFFERED: "offered",
        CHANGED: f"changed ({state.change.summary()}): not offered until gateway skills approve {state.name}",
        DISABLED: "disabled",
        MISSING: f"missing: {state.path} is gone",
        NOT_ADDED: f"not added: gateway skills add {state.path}",
        OUTSIDE: "not offered: its folder is not in skills.dirs",
        INVALID: f"invalid: {state.problem}",
    }[state.status]
    origin = state.origin or state.path
    forced = " (added over the checks with --force)" if state.pin is not None and state.pin.forced else ""
    return f"{state.name:<24} {what}{forced}  origin {origin}  sha256 {digest}"


def _refused_or_forced(folder: Path, force: bool, out: TextIO, *, verb: str) -> bool:
    findings = inspect(folder)
    for finding in findings:
        print(f"{'forced' if force else 'refused'}: {finding}", file=out)
    if findings and not force:
        print(f"not {verb}: {len(findings)} finding(s) above; read the files, and add --force only if you trust them",
              file=out)
        return False
    return True
