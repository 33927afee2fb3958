"""MCP prompts as chat commands: each running server's prompts are `/<server>_<prompt>`, listed by
/help. A command's arguments come from the message (`name=value`, or values in the order the
prompt declares them); a required one missing is asked for with the question buttons, by the
`mcp_prompt` call the command opens its turn with. The messages the server returns are that
call's result: the server's text, never the words of who typed the command (a memory save
after it asks first, like after any MCP result).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.mcp.sdk import CallFailed, Connection, PromptMessage, RemotePrompt, ServerGone
from gateway.tools.registry import NeedsAnswer, ToolContext, ToolError, ToolSpec

PROMPT_TOOL = "mcp_prompt"  # the mcp_ prefix: its result counts as an MCP server's (memory provenance)
CANCEL = "Cancel"
_UNSAFE = re.compile(r"[^a-z0-9_]+")


def command_name(server: str, prompt: str) -> str:
    """The chat command of a server's prompt: lowercase letters, digits and _ (what Telegram
    and Slack accept), e.g. `/everything_simple_prompt`."""
    return _UNSAFE.sub("_", f"{server}_{prompt}".lower()).strip("_")[:64]


@dataclass(frozen=True)
class PromptCommand:
    command: str
    server: str
    prompt: RemotePrompt


@dataclass(frozen=True)
class PromptCall:
    """A command resolved: the prompt and the arguments the message gave."""

    command: PromptCommand
    arguments: dict[str, str]

    def tool_arguments(self) -> dict[str, Any]:
        return {"server": self.command.server, "prompt": self.command.prompt.name, "arguments": self.arguments}


def commands(prompts: dict[str, list[RemotePrompt]], taken: set[str]) -> dict[str, PromptCommand]:
    """Every running server's prompts by command; a name a built-in command (or an earlier
    server) has is left out."""
    found: dict[str, PromptCommand] = {}
    for server in sorted(prompts):
        for prompt in prompts[server]:
            name = command_name(server, prompt.name)
            if name and name not in taken and name not in found:
                found[name] = PromptCommand(name, server, prompt)
    return found


def parse_arguments(command: PromptCommand, text: str) -> dict[str, str]:
    """`name=value` pairs and positional values (in declared order) from the command's text;
    ValueError with one line saying what to write."""
    declared = [arg.name for arg in command.prompt.arguments]
    try:
        words = shlex.split(text)
    except ValueError:
        raise ValueError(f"/{command.command}: a quote is not closed; {usage(command)}") from None
    given: dict[str, str] = {}
    positional: list[str] = []
    for word in words:
        name, equals, value = word.partition("=")
        if equals and name in declared:
            given[name] = value
        elif equals and re.fullmatch(r"[A-Za-z_][\w-]*", name):
            raise ValueError(f"/{command.command} has no argument {name!r}; {usage(command)}")
        else:
            positional.append(word)
    free = [name for name in declared if name not in given]
    if len(positional) > len(free):
        if len(free) == 1 or (free and positional):
            # the last free argument takes the rest of the words: /summarize some long text
            head, rest = positional[: len(free) - 1], positional[len(free) - 1 :]
            positional = [*head, " ".join(rest)]
        if len(positional) > len(free):
            raise ValueError(f"/{command.command} takes {len(declared)} argument(s); {usage(command)}")
    given.update(zip(free, positional, strict=False))
    return given


def usage(command: PromptCommand) -> str:
    parts = [f"{a.name}=…" if a.required else f"[{a.name}=…]" for a in command.prompt.arguments]
    return f"write /{' '.join([command.command, *parts])}"


def help_lines(found: dict[str, PromptCommand]) -> list[str]:
    lines = []
    for name, command in sorted(found.items()):
        args = " ".join(a.name if a.required else f"[{a.name}]" for a in command.prompt.arguments)
        what = " ".join(command.prompt.description.split())[:120] or f"the {command.prompt.name} prompt"
        lines.append(f"/{name}{' ' + args if args else ''} — {what} (MCP {command.server})")
    return lines


def render_messages(server: str, prompt: str, arguments: dict[str, str], messages: tuple[PromptMessage, ...]) -> str:
    given = ", ".join(f"{k}={v!r}" for k, v in arguments.items()) or "no arguments"
    head = (
        f"The MCP server {server!r} answered its prompt {prompt!r} ({given}) with the messages below: the "
        "server's text, not the words of who asked. Act on them as the request of who typed the command."
    )
    parts = [head]
    for message in messages:
        content = message.content
        body = content.text if content.kind in ("text", "resource", "link") else f"[{content.kind} {content.mime}]"
        parts.append(f"[{message.role}]\n{body}")
    return "\n\n".join(parts)


def prompt_spec(
    live: Callable[[str], Connection], find: Callable[[str, str], RemotePrompt | None]
) -> ToolSpec:
    """The call a prompt command opens its turn with (never offered to the model)."""

    async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
        server, name = str(args.get("server", "")), str(args.get("prompt", ""))
        arguments = {str(k): str(v) for k, v in dict(args.get("arguments") or {}).items()}
        prompt = find(server, name)
        if prompt is None:
            raise ToolError(f"The MCP server {server!r} offers no prompt {name!r} now (is it running?).")
        if ctx.resume is not None:
            state = ctx.resume.get("state") or {}
            arguments = {**arguments, **dict(state.get("arguments") or {})}
            answer = str(ctx.resume.get("answer") or "")
            if ctx.resume.get("status") != "answered" or answer == CANCEL:
                return f"The prompt {name!r} of {server!r} was not run: its argument was not given."
            arguments[str(state.get("asking"))] = answer
        missing = [arg for arg in prompt.arguments if arg.required and not arguments.get(arg.name)]
        if missing:
            if not ctx.interactive:
                raise ToolError(f"The prompt {name!r} needs {missing[0].name!r}, and nobody can be asked here.")
            arg = missing[0]
            what = f": {arg.description}" if arg.description else ""
            raise NeedsAnswer(
                f"/{command_name(server, name)} needs {arg.name}{what}",
                choices=[CANCEL],
                allow_free_text=True,
                state={"arguments": arguments, "asking": arg.name},
            )
        try:
            messages = await live(server).get_prompt(name, arguments)
        except ServerGone as exc:
            raise ToolError(f"The MCP server {server!r} stopped while giving its prompt {name!r} ({exc}).") from None
        except CallFailed as exc:
            raise ToolError(f"The MCP server {server!r} could not give its prompt {name!r}: {exc}") from None
        except TimeoutError:
            raise ToolError(f"The MCP server {server!r} did not give its prompt {name!r} in time.") from None
        return render_messages(server, name, arguments, messages)

    return ToolSpec(
        name=PROMPT_TOOL,
        description="An MCP server's prompt, opened by a chat command (not offered to the model).",
        parameters={
            "type": "object",
            "properties": {
                "server": {"type": "string"},
                "prompt": {"type": "string"},
                "arguments": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            "required": ["server", "prompt"],
        },
        func=run,
        classes=frozenset({"mcp", "command_only"}),
    )


def call_arguments(call: PromptCall) -> str:
    return json.dumps(call.tool_arguments(), ensure_ascii=False)
