"""Block Kit for approval and question prompts, and the closed form shown after a decision.

Plain dictionaries (the JSON Slack takes), so this module needs no SDK. Limits from Block
Kit: section text <= 3,000, button text <= 75, action_id <= 255, value <= 2,000,
actions block <= 25 elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.events import Button, Prompt

from .render import escape, render_inline, truncate_escaped

SECTION_LIMIT = 3000
BUTTON_TEXT_LIMIT = 75
ACTIONS_PER_BLOCK = 25
ARGUMENTS_BUDGET = 2500  # characters of arguments shown inline; the rest goes to a snippet
ACTION_PREFIX = "gw:"
FEEDBACK_ACTION = "gw_feedback"  # not under ACTION_PREFIX: a rating is not a prompt's button
FEEDBACK_VALUES = {"up": "up", "down": "down"}  # the value a feedback button sends -> Reaction's
_OURS = ("gw_actions", "gw_hint", "gw_outcome")

Block = dict[str, Any]


@dataclass(frozen=True)
class RenderedPrompt:
    blocks: list[Block]
    text: str  # notification / fallback text
    omitted: int  # characters of the arguments left out of the message (0 = all shown)


def _mrkdwn(text: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": text}


def _section(text: str, block_id: str | None = None) -> Block:
    block: Block = {"type": "section", "text": _mrkdwn(_fit(text, SECTION_LIMIT))}
    if block_id:
        block["block_id"] = block_id
    return block


def _fit(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit - 1)
    cut = cut if cut > limit // 2 else limit - 1
    head = text[:cut]
    amp = head.rfind("&", max(0, cut - 5))
    if amp >= 0 and ";" not in head[amp:]:
        head = head[:amp]
    return head + "…"


def _button_style(prompt: Prompt, button: Button) -> str | None:
    """The button's tone (what pressing it means) as Slack's colour; without one, Approve-like
    buttons of an approval are primary and Deny-like ones danger."""
    if button.tone:
        return {"positive": "primary", "negative": "danger"}[button.tone]
    if prompt.kind != "approval":
        return None
    label = button.label.lower()
    if any(word in label for word in ("deny", "reject", "decline")):
        return "danger"
    if "approve" in label:
        return "primary"
    return None


def _button(prompt: Prompt, button: Button, row: int, column: int) -> Block:
    element: Block = {
        "type": "button",
        "text": {"type": "plain_text", "text": _fit(button.label, BUTTON_TEXT_LIMIT), "emoji": True},
        "action_id": f"{ACTION_PREFIX}{row}:{column}",
        "value": button.token,
    }
    if button.url:  # a link: Slack opens it; its click carries no value, so it is not a press
        element["url"] = button.url
        del element["value"]
    style = _button_style(prompt, button)
    if style:
        element["style"] = style
    return element


def _actions(prompt: Prompt) -> list[Block]:
    blocks: list[Block] = []
    for row_index, row in enumerate(prompt.buttons):
        elements = [_button(prompt, b, row_index, col) for col, b in enumerate(row)]
        for start in range(0, len(elements), ACTIONS_PER_BLOCK):
            block_id = f"gw_actions_{row_index}_{start}"
            blocks.append(
                {"type": "actions", "block_id": block_id, "elements": elements[start : start + ACTIONS_PER_BLOCK]}
            )
    return blocks


def _arguments_section(prompt: Prompt) -> tuple[Block, int]:
    tool = f"Tool: `{escape(prompt.tool_name)}`" if prompt.tool_name else "Arguments:"
    shown, omitted = _head_and_tail(prompt.arguments, ARGUMENTS_BUDGET)
    text = f"{tool}\n```\n{shown or ' '}\n```"
    if omitted:
        text += f"\n_… {omitted:,} more characters; the full arguments are attached in this thread._"
    return _section(text, "gw_arguments"), omitted


def _head_and_tail(raw: str, budget: int) -> tuple[str, int]:
    """Long arguments keep their head and their tail (what hides at the end of a long command
    is what the decider must see), escaped; and how many characters are left out between."""
    head, omitted = truncate_escaped(raw, budget * 2 // 3)
    if not omitted:
        return head, 0
    rest = raw[len(raw) - omitted :]
    # escaping is per character, so the tail is the escaped prefix of the reversed rest, reversed
    tail, hidden = truncate_escaped(rest[::-1], budget - len(head) - 40)
    return f"{head}\n…\n{tail[::-1]}", hidden


def approval_blocks(prompt: Prompt) -> RenderedPrompt:
    header = _section(f"*🔐 Approval required*\n{render_inline(prompt.text)}", "gw_summary")
    blocks = [header]
    omitted = 0
    if prompt.tool_name or prompt.arguments:
        arguments, omitted = _arguments_section(prompt)
        blocks.append(arguments)
    blocks.extend(_actions(prompt))
    fallback = _fit(escape(f"Approval required: {prompt.text}"), SECTION_LIMIT)
    return RenderedPrompt(blocks, fallback, omitted)


def question_blocks(prompt: Prompt) -> RenderedPrompt:
    blocks = [_section(f"*❓* {render_inline(prompt.text)}", "gw_question"), *_actions(prompt)]
    if prompt.hint:
        blocks.append(
            {"type": "context", "block_id": "gw_hint", "elements": [_mrkdwn(_fit(escape(prompt.hint), SECTION_LIMIT))]}
        )
    return RenderedPrompt(blocks, _fit(escape(prompt.text), SECTION_LIMIT), 0)


def prompt_blocks(prompt: Prompt) -> RenderedPrompt:
    return approval_blocks(prompt) if prompt.kind == "approval" else question_blocks(prompt)


def closed_blocks(original: list[Block] | None, outcome: str) -> list[Block]:
    """The prompt without its buttons (and hint), with the outcome as a context line."""
    kept = [b for b in (original or []) if not str(b.get("block_id", "")).startswith(_OURS)]
    outcome_block = {
        "type": "context",
        "block_id": "gw_outcome",
        "elements": [_mrkdwn(_fit(render_inline(outcome), SECTION_LIMIT))],
    }
    return [*kept, outcome_block]


def feedback_blocks() -> list[Block]:
    """👍 / 👎 under an answer: a `context_actions` block with a `feedback_buttons` element
    (docs.slack.dev/reference/block-kit/blocks/context-actions-block). A press is feedback on
    the run that sent the answer, like a 👍/👎 reaction."""
    return [
        {
            "type": "context_actions",
            "block_id": "gw_feedback",
            "elements": [
                {
                    "type": "feedback_buttons",
                    "action_id": FEEDBACK_ACTION,
                    "positive_button": {
                        "text": {"type": "plain_text", "text": "👍"},
                        "value": "up",
                        "accessibility_label": "Mark this answer as helpful",
                    },
                    "negative_button": {
                        "text": {"type": "plain_text", "text": "👎"},
                        "value": "down",
                        "accessibility_label": "Mark this answer as unhelpful",
                    },
                }
            ],
        }
    ]
