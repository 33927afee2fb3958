""""Did you mean": for an unknown key, the closest key the configuration accepts at that place
(`agent.max_round` -> `max_rounds`, a section `agnet` -> `agent`)."""

from __future__ import annotations

import difflib
import types
from collections.abc import Mapping, Sequence
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel


def closest_key(model: type[BaseModel], loc: Sequence[str | int]) -> str | None:
    """The accepted key nearest to `loc`'s last part, among the keys of the place `loc` ends in."""
    node: Any = model
    for part in loc[:-1]:
        node = _step(_unwrap(node), part)
        if node is None:
            return None
    node = _unwrap(node)
    if not _is_model(node):
        return None
    keys = [field.alias or name for name, field in node.model_fields.items()]
    found = difflib.get_close_matches(str(loc[-1]), keys, n=1, cutoff=0.6) if loc else []
    return found[0] if found else None


def _step(node: Any, part: str | int) -> Any:
    if _is_model(node):
        for name, field in node.model_fields.items():
            if part in (name, field.alias):
                return field.annotation
        return None
    origin = get_origin(node)
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return get_args(node)[1]
    if isinstance(origin, type) and issubclass(origin, Sequence):
        return get_args(node)[0]
    return None


def _unwrap(node: Any) -> Any:
    """`X | None` and `str | list[Section]` -> the member that holds keys, if one does."""
    if get_origin(node) not in (Union, types.UnionType):
        return node
    members = [arg for arg in get_args(node) if arg is not type(None)]
    nested = [arg for arg in members if get_origin(arg) is not None or _is_model(arg)]
    return (nested or members)[0]


def _is_model(node: Any) -> bool:
    return isinstance(node, type) and issubclass(node, BaseModel)
