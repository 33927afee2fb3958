"""Approvals and questions: the rules and who may decide, prompts, button tokens and verdicts."""
