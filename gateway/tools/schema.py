"""JSON schema for a tool's parameters, derived from a typed async function.

Supported parameter types: str, int, float, bool, Any, list[X], tuple[X, ...], dict[str, X],
Literal[...], Optional[X] / X | None, unions, Annotated[X, "description"] and pydantic models.
A tool may also take a single pydantic model parameter: its schema then describes the call.
Descriptions come from the docstring: the text before an `Args:` section describes the tool,
`name: text` lines inside it describe the parameters.
"""

from __future__ import annotations

import inspect
import json
import re
import types
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ValidationError

_PRIMITIVES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")
_PARAM_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")

Invoker = Callable[[Any, dict[str, Any]], Awaitable[Any]]


class ArgumentError(Exception):
    """The arguments cannot be passed to the function (unknown or missing names)."""


@dataclass(frozen=True)
class DerivedTool:
    description: str
    parameters: dict[str, Any]
    invoke: Invoker  # invoke(ctx, args) calls the function with the arguments spread out


def derive(func: Callable[..., Awaitable[Any]], where: str) -> DerivedTool:
    """Schema and invoker for `async def f(ctx, a: int, b: str = "x")` or `f(ctx, args: Model)`."""
    if not inspect.iscoroutinefunction(func):
        raise TypeError(f"{where}: a tool must be an async function")
    try:
        hints = get_type_hints(func, include_extras=True)
    except NameError as exc:
        raise TypeError(f"{where}: cannot resolve a type annotation ({exc}); define the type at module level") from None
    params = _tool_params(func, where)
    summary, param_docs = parse_docstring(inspect.getdoc(func) or "")
    if len(params) == 1 and _is_model(_unwrap_annotated(hints.get(params[0].name))):
        model = _unwrap_annotated(hints[params[0].name])
        return DerivedTool(summary or _model_doc(model), model_schema(model), _model_invoker(func, model))
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in params:
        if param.name not in hints:
            raise TypeError(f"{where}: parameter {param.name!r} needs a type annotation")
        schema = type_schema(hints[param.name], f"{where}.{param.name}")
        if param.name in param_docs and "description" not in schema:
            schema["description"] = param_docs[param.name]
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        elif _json_safe(param.default):
            schema["default"] = json.loads(json.dumps(param.default))  # tuples become lists
        properties[param.name] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        parameters["required"] = required
    return DerivedTool(summary, parameters, _kwargs_invoker(func, [p.name for p in params], required))


def type_schema(tp: Any, where: str) -> dict[str, Any]:
    """The JSON schema of one annotation; TypeError naming `where` when unsupported."""
    origin = get_origin(tp)
    if origin is Annotated:
        base, *extras = get_args(tp)
        schema = type_schema(base, where)
        text = next((e for e in extras if isinstance(e, str)), None)
        return {**schema, "description": text} if text else schema
    if tp is Any:
        return {}
    if tp in _PRIMITIVES:
        return {"type": _PRIMITIVES[tp]}
    if origin is Literal:
        return _literal_schema(get_args(tp), where)
    if origin in (Union, types.UnionType):
        return _union_schema(get_args(tp), where)
    if tp in (list, tuple) or origin in (list, tuple):
        return _array_schema(tp, where)
    if tp is dict or origin is dict:
        return _object_schema(tp, where)
    if _is_model(tp):
        return model_schema(tp)
    raise TypeError(f"{where}: unsupported parameter type {tp!r}")


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = _strip_titles(model.model_json_schema())
    schema.setdefault("type", "object")
    schema.pop("description", None)  # it describes the tool, not the argument object
    return schema


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(summary, {param: description}) from a Google-style docstring."""
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if _ARGS_HEADER.match(line)), len(lines))
    summary = "\n".join(lines[:start]).strip()
    body = [line for line in lines[start + 1 :] if line.strip()]
    base = _indent(body[0]) if body else 0
    params: dict[str, str] = {}
    current = ""
    for line in body:
        match = _PARAM_LINE.match(line)
        if match and _indent(line) == base:
            current = match.group(1)
            params[current] = match.group(2).strip()
        elif current and _indent(line) > base:
            params[current] = f"{params[current]} {line.strip()}".strip()
        else:
            break  # a new section (Returns:, Raises:) ends the parameters
    return summary, params


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _tool_params(func: Callable[..., Any], where: str) -> list[inspect.Parameter]:
    params = list(inspect.signature(func).parameters.values())
    if not params:
        raise TypeError(f"{where}: the first parameter must be the ToolContext")
    rest = params[1:]  # the first one is the ToolContext
    for param in rest:
        if param.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            raise TypeError(f"{where}: parameter {param.name!r} must be passable by keyword")
    return rest


def _literal_schema(values: tuple[Any, ...], where: str) -> dict[str, Any]:
    kinds = {_json_type(v, where) for v in values}
    schema: dict[str, Any] = {"enum": list(values)}
    if len(kinds) == 1:
        schema["type"] = kinds.pop()
    return schema


def _json_type(value: Any, where: str) -> str:
    if value is None:
        return "null"
    for py, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string")):
        if isinstance(value, py):
            return name
    raise TypeError(f"{where}: Literal values must be str, int, float, bool or None, got {value!r}")


def _union_schema(members: tuple[Any, ...], where: str) -> dict[str, Any]:
    present = [m for m in members if m is not type(None)]
    nullable = len(present) < len(members)
    if len(present) == 1:
        inner = type_schema(present[0], where)
        return _nullable(inner) if nullable else inner
    options = [type_schema(m, where) for m in present]
    return {"anyOf": options + ([{"type": "null"}] if nullable else [])}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if isinstance(schema.get("type"), str) and "anyOf" not in schema:
        result = {**schema, "type": [schema["type"], "null"]}
        if "enum" in schema:
            result["enum"] = [*schema["enum"], None]
        return result
    return {"anyOf": [schema, {"type": "null"}]}


def _array_schema(tp: Any, where: str) -> dict[str, Any]:
    args = [a for a in get_args(tp) if a is not Ellipsis]
    if get_origin(tp) is tuple and len(args) > 1 and len(set(args)) > 1:
        raise TypeError(f"{where}: only homogeneous tuples (tuple[X, ...]) are supported")
    return {"type": "array", "items": type_schema(args[0], where) if args else {}}


def _object_schema(tp: Any, where: str) -> dict[str, Any]:
    args = get_args(tp)
    if args and args[0] is not str:
        raise TypeError(f"{where}: dict keys must be str (JSON object keys)")
    return {"type": "object", "additionalProperties": type_schema(args[1], where) if args else {}}


def _is_model(tp: Any) -> bool:
    return inspect.isclass(tp) and issubclass(tp, BaseModel)


def _unwrap_annotated(tp: Any) -> Any:
    return get_args(tp)[0] if get_origin(tp) is Annotated else tp


def _model_doc(model: type[BaseModel]) -> str:
    doc = inspect.getdoc(model) or ""
    return "" if doc == inspect.getdoc(BaseModel) else doc


def _strip_titles(node: Any) -> Any:
    """Drop pydantic's "title" keywords (noise for the model), keeping properties named title."""
    if isinstance(node, list):
        return [_strip_titles(item) for item in node]
    if not isinstance(node, dict):
        return node
    result = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            result[key] = {name: _strip_titles(sub) for name, sub in value.items()}
        else:
            result[key] = _strip_titles(value)
    return result


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _kwargs_invoker(func: Callable[..., Awaitable[Any]], names: list[str], required: list[str]) -> Invoker:
    known = set(names)

    async def invoke(ctx: Any, args: dict[str, Any]) -> Any:
        unknown = sorted(set(args) - known)
        missing = [name for name in required if name not in args]
        if unknown or missing:
            raise ArgumentError(_argument_problem(unknown, missing, names))
        return await func(ctx, **args)

    return invoke


def _model_invoker(func: Callable[..., Awaitable[Any]], model: type[BaseModel]) -> Invoker:
    async def invoke(ctx: Any, args: dict[str, Any]) -> Any:
        try:
            value = model.model_validate(args)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}" for e in exc.errors()
            )
            raise ArgumentError(problems) from None
        return await func(ctx, value)

    return invoke


def _argument_problem(unknown: list[str], missing: list[str], names: list[str]) -> str:
    parts = []
    if unknown:
        parts.append(f"unknown argument(s): {', '.join(unknown)}")
    if missing:
        parts.append(f"missing required argument(s): {', '.join(missing)}")
    expected = ", ".join(names) or "none"
    return f"{'; '.join(parts)} (expected: {expected})"
