"""The `ask_user` tool as the model sees it (its answers are prompts: gateway/approvals/prompts.py)."""

from __future__ import annotations

from gateway.tools import ToolError, ToolSpec

ASK_USER_DESCRIPTION = (
    "Ask the user a clarifying question and wait for the answer. Give `choices` for a quick "
    "pick (shown as buttons); the user can also type an answer unless allow_free_text is false."
)


def ask_user_spec() -> ToolSpec:
    """The `ask_user` tool as offered to the model; the turn parks on it instead of running it."""

    async def never_run(ctx, args):  # noqa: ANN001, ANN202
        raise ToolError("ask_user is answered through the chat, not run directly")

    return ToolSpec(
        name="ask_user",
        description=ASK_USER_DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {
                "question": {"type": "string", "description": "The question to ask."},
                "choices": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Answers to offer as buttons.",
                },
                "allow_free_text": {
                    "type": "boolean",
                    "description": "Whether a typed answer is accepted.",
                    "default": True,
                },
            },
            "required": ["question"],
            "additionalProperties": False,
        },
        func=never_run,
    )
