"""Which model a person's turn runs on, checked against their role each time a turn runs, not
only when `/model` switched it (docs/models.md).

The choice, most specific first: the person's own in a shared chat (`/model` in a group, a
topic, a Slack channel: each person there picks their own), the session's (a private chat's
`/model`, a scheduled job's `model`, a parent's for its sub-agents), then the default. The
first that the person's role allows (`access.roles.<role>.models`) is the one used, so a
switch made by someone else, or one the role allowed when it was made and no longer does,
never carries a turn to a model the person may not use. The default is allowed to every role:
a turn is never refused for its model. `llm.fallback` keeps only the models the role allows.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.access.policy import AccessPolicy
from gateway.config import DEFAULT_MODEL, LLMConfig
from gateway.store import SessionRecord


@dataclass(frozen=True)
class ModelChoice:
    name: str | None  # the name of llm.models the turn runs on; None: the default
    ref: str  # the name calls and runs know it by (LLMConfig.ref)
    fallback: tuple[str, ...]  # the models of llm.fallback the role allows, in order
    refused: str | None = None  # the choice the role does not allow, which `name` replaced
    own: bool = False  # `refused` was this person's own /model (forgotten once they are told)


def shared(session: SessionRecord) -> bool:
    """A chat several people talk in (a group, a topic, a Slack channel): `/model` there is per person."""
    return session.kind == "interactive" and not session.private


def own_choice(session: SessionRecord, person: str) -> str | None:
    """The person's `/model` in a shared session: a name of llm.models, "default", or None (none made)."""
    if not person or not shared(session):
        return None
    return (session.person_models or {}).get(str(person))


def chosen_model(
    llm: LLMConfig, access: AccessPolicy | None, session: SessionRecord, person: str, acting: tuple[str, str]
) -> ModelChoice:
    """The model for a turn `person` asked for, whose role is that of `acting` (channel, user id:
    the person, or the creator of the job the turn runs for)."""

    def allowed(name: str | None) -> bool:
        return name is None or access is None or access.model_allowed(*acting, name)

    own = own_choice(session, person)
    session_is_theirs = session.kind == "interactive" and session.private  # a private chat's is its person's
    if own is not None:
        candidates = [(_named(llm, own), True), (_named(llm, session.model), False)]
    else:
        candidates = [(_named(llm, session.model), session_is_theirs)]
    fallback = tuple(name for name in llm.fallback if allowed(name))
    wanted, wanted_own = candidates[0]
    name = next((name for name, _ in candidates if allowed(name)), None)
    if name == wanted:
        return ModelChoice(name, llm.ref(name), fallback)
    return ModelChoice(name, llm.ref(name), fallback, refused=wanted, own=wanted_own)


def _named(llm: LLMConfig, value: str | None) -> str | None:
    """A stored choice as a name of llm.models; None for the default (or a name no longer configured)."""
    return value if value and value != DEFAULT_MODEL and value in llm.models else None
