"""Spend caps enforced before every LLM call (see docs/budgets.md)."""

from gateway.budgets.caps import Caps, Payer, current_payer, usd_text
from gateway.budgets.gate import SpendGate
from gateway.budgets.report import budgets_report, cost_lines

__all__ = ["Caps", "Payer", "SpendGate", "budgets_report", "cost_lines", "current_payer", "usd_text"]
