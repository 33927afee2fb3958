"""What the OpenAI Responses API refuses, as the fake Responses server checks it (400s with
OpenAI's messages): unknown parameters and item types, tools in the Chat Completions shape,
a `function_call_output` without its `function_call` (and a call left without its output),
state kept on the server (`previous_response_id`, item references, `store` not false), and
reasoning items that were not sent back as the server issued them when the turn needs them.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from fakes.llm import without_context

PARAMETERS = {
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "stream",
    "store",
    "include",
    "reasoning",
    "max_output_tokens",
    "temperature",
    "top_p",
    "prompt_cache_key",
    "metadata",
    "truncation",
    "text",
    "user",
    "service_tier",
    "safety_identifier",
    "previous_response_id",
    "background",
}
INCLUDES = {"reasoning.encrypted_content", "message.output_text.logprobs", "file_search_call.results"}
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
INPUT_PARTS = ("input_text", "input_image", "input_file")
OUTPUT_PARTS = ("output_text", "refusal")
SECRET = b"fake-responses"  # what "encrypts" reasoning: an item altered on the way back fails its check


def sealed(item_id: str, summary: str) -> str:
    """The encrypted content of a reasoning item the fake issues."""
    return "enc_" + hmac.new(SECRET, f"{item_id}\0{summary}".encode(), hashlib.sha256).hexdigest()


def request_problem(body: Any, issued: dict[str, dict[str, Any]], reasoned: dict[str, list[str]]) -> str | None:
    """`issued`: reasoning item id -> the item as the fake sent it; `reasoned`: call_id of a
    function call the fake issued -> the ids of the reasoning items that preceded it."""
    if not isinstance(body, dict):
        return "The request body must be a JSON object."
    unknown = sorted(set(body) - PARAMETERS)
    if unknown:
        return f"Unknown parameter: '{unknown[0]}'."
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "Missing required parameter: 'model'."
    if body.get("stream") is not True:
        return "stream: this server only streams; set stream: true"
    if body.get("store") is not False:
        return "store: this server keeps nothing; send store: false and carry reasoning items yourself"
    if body.get("previous_response_id") is not None:
        return "Previous response cannot be used with store: false."
    limit = body.get("max_output_tokens")
    if limit is not None and (not isinstance(limit, int) or limit < 16):
        return f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got {limit}."
    if problem := _include_problem(body.get("include")) or _tools_problem(body.get("tools")):
        return problem
    items = body.get("input")
    if not isinstance(items, list) or not items:
        return "Missing required parameter: 'input'."
    return _Items(issued, reasoned, _turn_start(items)).problem(items)


def _include_problem(include: Any) -> str | None:
    for value in include or ():
        if value not in INCLUDES:
            return f"Invalid value: '{value}'. Supported values are: {', '.join(sorted(INCLUDES))}."
    return None


def _tools_problem(tools: Any) -> str | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        return "Invalid type for 'tools': expected an array."
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            return f"Invalid value for 'tools[{i}].type'."
        if "function" in tool:
            return f"Unknown parameter: 'tools[{i}].function'."  # the Chat Completions shape
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            return f"Missing required parameter: 'tools[{i}].name'."
        if tool["name"] in names:
            return f"Duplicate function name: '{tool['name']}'."
        names.add(tool["name"])
        if not isinstance(tool.get("parameters"), dict):
            return f"Missing required parameter: 'tools[{i}].parameters'."
    return None


class _Items:
    """Walks the input items in order: every function_call_output after its function_call,
    every call answered before the next message, reasoning items as issued and where needed."""

    def __init__(self, issued: dict[str, dict[str, Any]], reasoned: dict[str, list[str]], turn_start: int) -> None:
        self.issued = issued
        self.reasoned = reasoned
        self.turn_start = turn_start
        self.open: list[str] = []  # call_ids waiting for their output
        self.answered: set[str] = set()
        self.reasoning: set[str] = set()

    def problem(self, items: list[Any]) -> str | None:
        for i, item in enumerate(items):
            where = f"input[{i}]"
            kind = item.get("type", "message" if "role" in item else None) if isinstance(item, dict) else None
            if kind not in ITEM_TYPES:
                return f"Invalid value: '{kind}'. Supported values are: {', '.join(ITEM_TYPES)} ({where}.type)."
            if problem := getattr(self, f"_{kind}")(i, where, item):
                return problem
            if kind == "reasoning" and not _followed(items, i):
                return f"Item '{item['id']}' of type 'reasoning' was provided without its required following item."
        return f"No tool output found for function call {self.open[0]}." if self.open else None

    def _message(self, i: int, where: str, item: dict[str, Any]) -> str | None:
        if self.open:
            return f"No tool output found for function call {self.open[0]}."
        return _message_problem(where, item)

    def _reasoning(self, i: int, where: str, item: dict[str, Any]) -> str | None:
        if problem := _reasoning_problem(where, item, self.issued):
            return problem
        self.reasoning.add(item["id"])
        return None

    def _function_call(self, i: int, where: str, item: dict[str, Any]) -> str | None:
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            return f"Missing required parameter: '{where}.call_id'."
        if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments"), str):
            return f"Missing required parameter: '{where}.name' or '{where}.arguments' (a string)."
        if call_id in self.open or call_id in self.answered:
            return f"Duplicate function call: '{call_id}'."
        needed = [r for r in self.reasoned.get(call_id, ()) if r not in self.reasoning]
        if needed and i >= self.turn_start:
            return (
                f"Item '{call_id}' of type 'function_call' was provided without its required "
                f"'reasoning' item: '{needed[0]}'."
            )
        self.open.append(call_id)
        return None

    def _function_call_output(self, i: int, where: str, item: dict[str, Any]) -> str | None:
        call_id = item.get("call_id")
        if call_id not in self.open:
            return f"No tool call found for function call output with call_id {call_id}."
        if not isinstance(item.get("output"), str):
            return f"Invalid type for '{where}.output': expected a string."
        self.open.remove(call_id)
        self.answered.add(call_id)
        return None


def _followed(items: list[Any], i: int) -> bool:
    """A reasoning item is followed by what the model produced after it: more reasoning, then a
    function call or an assistant message."""
    for item in items[i + 1 :]:
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "reasoning":
            continue
        return kind == "function_call" or (kind == "message" and item.get("role") == "assistant")
    return False


def _turn_start(items: list[Any]) -> int:
    """Where the current turn begins: the last message a person wrote (the gateway's context
    notes between tool rounds are not one). Reasoning is needed from there on."""
    start = 0
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("role") == "user" and without_context(message_text(item)):
            start = i
    return start


def _message_problem(where: str, item: dict[str, Any]) -> str | None:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        return f"Invalid value: '{role}' ({where}.role)."
    content = item.get("content")
    if isinstance(content, str):
        return None
    if not isinstance(content, list) or not content:
        return f"Invalid type for '{where}.content': expected a string or an array of parts."
    allowed = OUTPUT_PARTS if role == "assistant" else INPUT_PARTS
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in allowed:
            return f"Invalid value: '{kind}'. Supported values are: {', '.join(allowed)} ({where}.content[{j}])."
        if kind in ("input_text", "output_text") and not isinstance(part.get("text"), str):
            return f"Missing required parameter: '{where}.content[{j}].text'."
        if kind == "input_image" and not (part.get("image_url") or part.get("file_id")):
            return f"Missing required parameter: '{where}.content[{j}].image_url'."
    return None


def _reasoning_problem(where: str, item: dict[str, Any], issued: dict[str, dict[str, Any]]) -> str | None:
    item_id = item.get("id")
    if item_id not in issued:
        return f"Item with id '{item_id}' not found. Items are not persisted when `store` is set to false."
    if item.get("encrypted_content") != issued[item_id].get("encrypted_content"):
        return f"The encrypted content for item {item_id} could not be verified."
    if item != issued[item_id]:
        return f"Reasoning item {item_id} was altered ({where}): send it back as it was received."
    return None


def message_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "\n\n".join(p.get("text") or "" for p in content or () if isinstance(p, dict) and "text" in p)


def user_texts(body: dict[str, Any]) -> list[str]:
    """What people said in a Responses request (not the gateway's context notes)."""
    said = (
        without_context(message_text(item))
        for item in body.get("input") or ()
        if isinstance(item, dict) and item.get("role") == "user"
    )
    return [text for text in said if text]
