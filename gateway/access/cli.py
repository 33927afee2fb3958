"""`gateway pairing list|approve CODE|deny CODE` and `gateway access list|revoke ID`.

They work on the database directly: an approval queues the held messages again and the
serving gateway answers them at its next poll; a claimed admin removed here is no admin from
the gateway's next message or tap on.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from gateway.access.claim import claim_lines, refresh_admins
from gateway.access.pairing import describe
from gateway.access.policy import AccessPolicy
from gateway.config import Config
from gateway.store import Store
from gateway.store.claims import ADMIN_KIND, CLAIMED_BY


def add_parsers(subparsers: Any, *, parents: Sequence[argparse.ArgumentParser], handler: Callable[..., Any]) -> None:
    common = {"parents": list(parents)}
    pairing = subparsers.add_parser(
        "pairing", help="people and chats waiting for access: list, approve, deny", **common
    )
    pairing.set_defaults(handler=handler)
    actions = pairing.add_subparsers(dest="pairing_command", metavar="ACTION", required=True)
    actions.add_parser("list", help="pending pairing requests", **common)
    for name, text in (
        ("approve", "let the person (or chat) in; their held message is answered"),
        ("deny", "refuse the request"),
    ):
        actions.add_parser(name, help=text, **common).add_argument("code")

    access = subparsers.add_parser(
        "access", help="admins, approved people and chats: list (with the claim code while a channel has no admin), "
        "revoke", **common
    )
    access.set_defaults(handler=handler)
    access_actions = access.add_subparsers(dest="access_command", metavar="ACTION", required=True)
    access_actions.add_parser(
        "list", help="who may talk to the agent and who is admin, from the configuration, approvals and claims",
        **common,
    )
    access_actions.add_parser(
        "revoke", help="remove an approval or a claimed admin by id, or all of a person's or chat's "
        "(channel:user-or-chat id)", **common
    ).add_argument("id")


async def run(args: argparse.Namespace, store: Store, config: Config, out: TextIO = sys.stdout) -> int:
    if args.command == "pairing":
        return await _pairing(args, store, out)
    return await _access(args, store, config, out)


async def _pairing(args: argparse.Namespace, store: Store, out: TextIO) -> int:
    if args.pairing_command == "list":
        await store.access.expire_due()
        pending = await store.access.pending()
        for request in pending:
            print(
                f"{request.code}  {request.kind:<4}  {describe(request, markdown=False):<50} "
                f"expires {request.expires_at:%Y-%m-%d %H:%M} UTC",
                file=out,
            )
        if not pending:
            print("no pending pairing requests", file=out)
        return 0
    found = await store.access.find(code=args.code)
    if found is None:
        print(f"no pairing request with code {args.code}", file=sys.stderr)
        return 1
    request = found
    approve = args.pairing_command == "approve"
    result = await store.access.decide(request.id, approve=approve, decided_by="cli")
    if result.kind != "decided":
        what = describe(request, markdown=False)
        print(f"request {request.code} ({what}): {result.kind.replace('_', ' ')}", file=sys.stderr)
        return 1
    verb = "approved: their held messages will be answered" if approve else "denied"
    print(f"{request.code} {describe(request, markdown=False)} {verb}", file=out)
    return 0


async def _access(args: argparse.Namespace, store: Store, config: Config, out: TextIO) -> int:
    if args.access_command == "revoke":
        return await _revoke(args.id, store, out)
    policy = AccessPolicy(config)
    await refresh_admins(store, policy)
    print(f"dm_policy: {config.access.dm_policy}   group_policy: {config.access.group_policy}", file=out)
    for kind, who, where in configured(config, policy):
        print(f"   -  {kind:<4}  {who:<33} {where}", file=out)
    for grant in await store.access.grants():
        role = policy.role_name(grant.channel, grant.subject) if grant.kind != "chat" else ""
        name = f" {grant.name}" if grant.name else ""
        how = "claimed with the code" if grant.granted_by == CLAIMED_BY else f"approved by {grant.granted_by}"
        print(
            f"{grant.id:>4}  {grant.kind:<4}  {grant.channel}:{grant.subject:<24} {role}{name}, "
            f"{how} {grant.created_at:%Y-%m-%d %H:%M}",
            file=out,
        )
    for line in await claim_lines(store, config):
        print(line, file=out)
    return 0


async def _revoke(ident: str, store: Store, out: TextIO) -> int:
    """By id: that approval or claimed admin; by channel:id, every one of that person or chat."""
    revoked = []
    while (grant := await store.access.revoke(ident)) is not None:
        revoked.append(grant)
        if ident.isdigit():
            break
    if not revoked:
        print(f"no approval {ident} (see `gateway access list`)", file=sys.stderr)
        return 1
    for grant in revoked:
        what = "admin (claimed)" if grant.kind == ADMIN_KIND else grant.kind
        print(f"revoked {what} {grant.channel}:{grant.subject}", file=out)
    return 0


def configured(config: Config, policy: AccessPolicy) -> list[tuple[str, str, str]]:
    """People and chats the configuration lets in (kind, who, which key)."""
    found = [
        ("user", f"{channel}:{user}", "admin (approvals.admins)")
        for channel, ids in sorted(config.approvals.admins.items())
        for user in ids
    ]
    for person in sorted(config.access.users):
        channel, _, user = person.partition(":")
        found.append(("user", person, f"{policy.role_name(channel, user)} (access.users)"))
    for channel, users, chats in (
        ("telegram", config.telegram.allowed_users, config.telegram.allowed_chats),
        ("slack", config.slack.allowed_users, config.slack.allowed_channels),
    ):
        found += [("user", f"{channel}:{user}", f"{channel}.allowed_users") for user in users]
        found += [("chat", f"{channel}:{chat}", "in the configuration") for chat in chats]
    return found
