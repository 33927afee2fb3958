"""The agent's turn: the loop, its tool calls, LLM rounds, guards and argument checks."""
