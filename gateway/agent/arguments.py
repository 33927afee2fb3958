"""Tool-call argument checks: the model gets a "fix and call again" answer, never an exception.

Checks run in a fixed order: cut off -> malformed JSON -> not an object -> schema mismatch.
Whatever the verdict, `stored_arguments` is valid JSON (an object) so persisted history stays
well-formed for strict providers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

INVALID_KEY = "_invalid_arguments"
_MAX_PROBLEMS = 5
_JSON_TYPES: dict[str, str] = {
    "dict": "object", "list": "array", "str": "string", "bool": "boolean",
    "int": "integer", "float": "number", "NoneType": "null",
}


@dataclass(frozen=True)
class ArgumentsOk:
    args: dict[str, Any]
    stored_arguments: str
    kind: Literal["ok"] = "ok"


@dataclass(frozen=True)
class ArgumentsProblem:
    message_for_model: str
    stored_arguments: str
    problem: Literal["cut_off", "malformed", "not_object", "schema"]
    kind: Literal["problem"] = "problem"


def check_arguments(
    raw: str, schema: dict[str, Any], *, cut_off: bool, tool_name: str = "the tool"
) -> ArgumentsOk | ArgumentsProblem:
    """Check a call's raw argument text against the tool's JSON schema.

    Empty text means no arguments (`{}`): many models send that for parameterless tools."""
    if cut_off:
        return ArgumentsProblem(
            f"Your call to {tool_name} was cut off after {len(raw)} characters of arguments "
            "because the reply reached the output length limit, so the tool was not run. "
            f"Call {tool_name} again with shorter arguments (split large content over several "
            "calls).",
            _wrap(raw), "cut_off",
        )
    try:
        value = json.loads(raw, parse_constant=_reject_constant) if raw.strip() else {}
    except ValueError as exc:
        return ArgumentsProblem(
            f"The arguments of your call to {tool_name} are malformed JSON ({_describe(exc)}), "
            f"so the tool was not run. Call {tool_name} again with the arguments as one valid "
            "JSON object.",
            _wrap(raw), "malformed",
        )
    if not isinstance(value, dict):
        return ArgumentsProblem(
            f"The arguments of your call to {tool_name} must be a JSON object with named "
            f"parameters, but got {_type_name(value)}. Call {tool_name} again with an object, "
            'e.g. {"name": value}.',
            _wrap(raw), "not_object",
        )
    problems = schema_problems(value, schema)
    if problems:
        listed = "; ".join(problems[:_MAX_PROBLEMS])
        return ArgumentsProblem(
            f"INVALID arguments for {tool_name}: {listed}. The tool was not run. Fix the "
            f"arguments and call {tool_name} again.",
            raw if raw.strip() else "{}", "schema",
        )
    return ArgumentsOk(value, raw if raw.strip() else "{}")


def schema_problems(value: Any, schema: dict[str, Any]) -> list[str]:
    """Problems of `value` against the subset of JSON Schema that tool schemas use: type,
    required, properties, additionalProperties, enum, const, items, anyOf/oneOf, local $ref."""
    return _Checker(schema).check(value, schema, "")


class _Checker:
    def __init__(self, root: dict[str, Any]) -> None:
        self._root = root

    def check(self, value: Any, schema: dict[str, Any], path: str) -> list[str]:
        schema = self._resolve(schema)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._check_any(value, schema[key], path)
        type_problem = _type_problem(value, schema.get("type"), path)
        if type_problem:
            return [type_problem]
        problems = _value_problems(value, schema, path)
        if isinstance(value, dict):
            problems += self._object_problems(value, schema, path)
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                problems += self.check(item, schema["items"], f"{path}[{i}]")
        return problems

    def _check_any(self, value: Any, options: list[dict[str, Any]], path: str) -> list[str]:
        results = [self.check(value, option, path) for option in options]
        if any(not r for r in results):
            return []
        types = [self._resolve(option).get("type") for option in options]
        if all(isinstance(t, str) for t in types):
            # Optional[int] and friends: one message naming every accepted type.
            type_problem = _type_problem(value, types, path)
            if type_problem:
                return [type_problem]
        return min(results, key=len)

    def _object_problems(self, value: dict[str, Any], schema: dict[str, Any],
                         path: str) -> list[str]:
        properties: dict[str, Any] = schema.get("properties", {})
        problems = [
            f"missing required parameter {_where(path, key)}"
            for key in schema.get("required", []) if key not in value
        ]
        for key, item in value.items():
            if key in properties:
                problems += self.check(item, properties[key], _join(path, key))
            elif schema.get("additionalProperties") is False:
                allowed = ", ".join(properties) or "none"
                problems.append(f"unknown parameter {_where(path, key)} (allowed: {allowed})")
        return problems

    def _resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        ref = schema.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        node: Any = self._root
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return node if isinstance(node, dict) else {}


def _type_problem(value: Any, expected: Any, path: str) -> str | None:
    if expected is None:
        return None
    allowed = [expected] if isinstance(expected, str) else list(expected)
    if any(_is_type(value, t) for t in allowed):
        return None
    return (f"parameter {_where(path)} must be {' or '.join(allowed)}, "
            f"got {_type_name(value)} {_preview(value)}")


def _is_type(value: Any, expected: str) -> bool:
    if expected == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if expected == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return _type_name(value) == expected


def _value_problems(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(json.dumps(v) for v in schema["enum"])
        return [f"parameter {_where(path)} must be one of {choices}, got {_preview(value)}"]
    if "const" in schema and value != schema["const"]:
        return [f"parameter {_where(path)} must be {json.dumps(schema['const'])}, "
                f"got {_preview(value)}"]
    return []


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are accepted by Python but are not JSON; strict providers reject them.
    raise ValueError(f"{name} is not valid JSON")


def _wrap(raw: str) -> str:
    return json.dumps({INVALID_KEY: raw}, ensure_ascii=False)


def _describe(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return str(exc)


def _type_name(value: Any) -> str:
    return _JSON_TYPES.get(type(value).__name__, type(value).__name__)


def _preview(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _where(path: str, key: str | None = None) -> str:
    full = _join(path, key) if key is not None else path
    return f'"{full}"' if full else "(the arguments)"
