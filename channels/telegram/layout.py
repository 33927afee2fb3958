"""How approval and question prompts look in Telegram (text + entities)."""

from __future__ import annotations

from channels.telegram.render import Rendered, TextBuilder, render_markdown
from gateway.events import Prompt

ARGUMENTS_PREVIEW_CHARS = 1500


def approval_body(prompt: Prompt) -> tuple[Rendered, tuple[str, str] | None]:
    """The prompt text and, when the arguments were cut, the full arguments as a document."""
    head = TextBuilder()
    head.styled("bold", "🔐 Approval required")
    head.text("\n")
    body = head.build() + render_markdown(prompt.text)
    tail = TextBuilder()
    if prompt.tool_name:
        tail.text("\n\nTool: ")
        tail.styled("code", prompt.tool_name)
    document = None
    if prompt.arguments:
        shown, hidden = _truncate(prompt.arguments)
        tail.text("\n")
        tail.styled("pre", shown, language="json")
        if hidden:
            tail.text("\n")
            tail.styled("italic", f"{hidden} more characters not shown in the middle (full arguments attached)")
            document = (f"{prompt.tool_name or 'arguments'}.json", prompt.arguments)
    return body + tail.build(), document


def question_body(prompt: Prompt) -> Rendered:
    head = TextBuilder()
    head.text("❓ ")
    body = head.build() + render_markdown(prompt.text)
    if prompt.hint:
        tail = TextBuilder()
        tail.text("\n\n")
        tail.styled("italic", prompt.hint)
        body = body + tail.build()
    return body


def outcome_line(text: str, outcome: str) -> str:
    return f"{text}\n\n{outcome}" if text else outcome


def _truncate(arguments: str) -> tuple[str, int]:
    """The head and the tail of long arguments (what hides at the end of a long command is what
    the decider must see), and how many characters are left out between them."""
    if len(arguments) <= ARGUMENTS_PREVIEW_CHARS:
        return arguments, 0
    head_chars = ARGUMENTS_PREVIEW_CHARS * 2 // 3
    tail_chars = ARGUMENTS_PREVIEW_CHARS - head_chars
    cut = arguments.rfind("\n", 0, head_chars)
    cut = cut if cut > head_chars // 2 else head_chars
    tail = arguments[-tail_chars:]
    hidden = len(arguments) - cut - len(tail)
    return f"{arguments[:cut]}\n… {hidden} characters …\n{tail}", hidden
