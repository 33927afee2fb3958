"""An MCP server's elicitation as a clarifying question in the chat, and the answer back.

A schema with one enum field becomes buttons; any other field (or several) is answered by
typing: one value for a single field, `name: value` lines (or a JSON object) for several.
A "Decline" button is always offered; an expired or canceled question is a `cancel`. A
URL-mode question (the server sends the person to a page: a sign-in, a payment) shows the
page's address with an Open link and Done / Decline: Done accepts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.mcp.sdk import ElicitAnswer, Elicitation

DECLINE = "Decline"
DONE = "Done"
OPEN = "Open"


@dataclass(frozen=True)
class Question:
    text: str
    choices: list[str]
    allow_free_text: bool
    link: tuple[str, str] | None = None  # (label, url) of a link button, for URL mode


def question(server: str, request: Elicitation) -> Question:
    if request.url:
        text = f"🔌 {server} asks you to open a page: {request.message}\n{request.url}\n"
        text += f"Choose {DONE} once you are through."
        return Question(text, [DONE, DECLINE], allow_free_text=False, link=(OPEN, request.url))
    fields = _fields(request.schema)
    text = f"🔌 {server} asks: {request.message}"
    if len(fields) == 1:
        name, spec = fields[0]
        enum = _enum(spec)
        if enum:
            return Question(text, [*enum, DECLINE], allow_free_text=False)
        if spec.get("type") == "boolean":
            return Question(text, ["yes", "no", DECLINE], allow_free_text=False)
        return Question(text, [DECLINE], allow_free_text=True)
    if not fields:
        return Question(text, ["OK", DECLINE], allow_free_text=False)
    hint = "\n".join(
        f"• {name}: {spec.get('description') or spec.get('title') or spec.get('type', 'value')}"
        for name, spec in fields
    )
    return Question(f"{text}\nReply with one line per field, `name: value`:\n{hint}", [DECLINE], allow_free_text=True)


def answer(request: Elicitation, status: str, text: str | None) -> ElicitAnswer:
    """The response to the server for a question that ended with `status` (and `text`)."""
    if status != "answered":
        return ElicitAnswer("cancel")  # expired, canceled or superseded: nobody answered
    text = (text or "").strip()
    if text == DECLINE:
        return ElicitAnswer("decline")
    if request.url:
        return ElicitAnswer("accept") if text == DONE else ElicitAnswer("decline")
    fields = _fields(request.schema)
    if not fields:
        return ElicitAnswer("accept", {})
    if len(fields) == 1:
        name, spec = fields[0]
        value = _coerce(text, spec)
        return ElicitAnswer("accept", {name: value}) if value is not None else ElicitAnswer("decline")
    values = _parse_lines(text)
    content = {}
    for name, spec in fields:
        if name in values:
            value = _coerce(str(values[name]), spec)
            if value is not None:
                content[name] = value
    required = set(request.schema.get("required") or [])
    if not required <= set(content):
        return ElicitAnswer("decline")
    return ElicitAnswer("accept", content)


def _fields(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    properties = schema.get("properties") or {}
    return [(name, spec if isinstance(spec, dict) else {}) for name, spec in properties.items()]


def _enum(spec: dict[str, Any]) -> list[str]:
    if isinstance(spec.get("enum"), list):
        return [str(v) for v in spec["enum"]]
    options = spec.get("oneOf") or spec.get("anyOf") or []
    return [str(o["const"]) for o in options if isinstance(o, dict) and "const" in o]


def _coerce(text: str, spec: dict[str, Any]) -> Any:
    kind = spec.get("type")
    enum = _enum(spec)
    if enum:
        return text if text in enum else None
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
    except ValueError:
        return None
    if kind == "array":  # a multiple choice: comma-separated
        items = spec.get("items")
        allowed = _enum(items) if isinstance(items, dict) else []
        values = [v.strip() for v in text.split(",") if v.strip()]
        return values if values and (not allowed or set(values) <= set(allowed)) else None
    if kind == "boolean":
        lowered = text.lower()
        return True if lowered in ("yes", "true", "y", "1") else False if lowered in ("no", "false", "n", "0") else None
    return text


def _parse_lines(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
        if isinstance(value, dict):
            return value
    except ValueError:
        pass
    values: dict[str, Any] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            values[name.strip()] = value.strip()
    return values
