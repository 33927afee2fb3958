"""`gateway approvals list | approve ID | deny ID [--reason]`: the pending approval requests, and
deciding one from the shell through the same compare-and-set as a button (recorded as "cli")."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from gateway.store import Action, Store
from gateway.store.items import resume_item


async def run(args: argparse.Namespace, store: Store, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    if args.action == "list":
        pending = await store.prompts.pending(kind="approval")
        for prompt in pending:
            print(
                f"{prompt.id:>6}  {prompt.thread_key:<40} {prompt.payload.get('tool', '')}"
                f"  expires {prompt.expires_at:%Y-%m-%d %H:%M}",
                file=out,
            )
        if not pending:
            print("no pending approvals", file=out)
        return 0
    asked = await store.prompts.get(args.id)
    if asked is None or asked.kind != "approval":
        print(f"no approval request {args.id}", file=err)
        return 1
    status = "approved" if args.action == "approve" else "rejected"
    decision = await store.prompts.decide(
        asked.id, status=status, decision=Action.APPROVE if status == "approved" else Action.DENY, decided_by="cli",
        decided_by_name="operator", answer=args.reason or None, resume=resume_item,
    )
    print(f"request {asked.id}: {decision.outcome}", file=out)
    return 0 if decision.outcome == "decided" else 1
