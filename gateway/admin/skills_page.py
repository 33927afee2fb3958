"""The console's Skills page: every pinned skill and every folder of skills.dirs not added yet,
with its state (offered, changed and what changed, disabled, missing), origin and hash.
Changes are approved at the terminal (`gateway skills approve NAME`), where the files are."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.admin.keys import OPS, render
from gateway.skills.catalog import SkillCatalog


async def skills(request: web.Request) -> web.Response:
    ops = request.app[OPS]
    catalog = SkillCatalog(ops.config.skills, ops.store)
    rows: list[dict[str, Any]] = []
    for state in await catalog.states():
        pin = state.pin
        rows.append({
            "name": state.name,
            "status": state.status,
            "description": state.description,
            "origin": state.origin or state.path,
            "path": state.path,
            "digest": state.digest[:16],
            "change": state.change.lines(),
            "summary": state.change.summary() if state.change else "",
            "problem": state.problem,
            "forced": (pin.forced or []) if pin is not None else [],
            "approved_by": pin.approved_by if pin is not None else "",
            "approved_at": pin.approved_at if pin is not None else None,
        })
    dirs = [str(d) for d in catalog.dirs]
    return render(request, "skills.html", page="skills", rows=rows, dirs=dirs)
