"""The gateway's Prometheus metrics (prometheus_client), in one registry the /metrics handler renders.

Labels have low cardinality by design: a channel, a kind, a tool name, an outcome, never a chat
or user id. Counters move where their event happens; the inbox gauges are computed at scrape
time from one aggregate query, never by loading rows.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)

INBOUND = Counter("gateway_inbound_events", "Inbound events accepted, by kind.", ["channel", "kind"],
                  registry=REGISTRY)
DUPLICATES = Counter("gateway_inbound_duplicates", "Inbound events dropped as redeliveries.", ["channel"],
                     registry=REGISTRY)
TURNS = Counter("gateway_turns", "Turns ended, by final stage and end reason.", ["stage", "reason"],
                registry=REGISTRY)
TURN_SECONDS = Histogram("gateway_turn_duration_seconds", "Wall time of one turn (one worker pass).",
                         registry=REGISTRY, buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900))
LLM_FIRST_TOKEN = Histogram("gateway_llm_first_token_seconds",
                            "From sending an LLM request to its first streamed event.", registry=REGISTRY,
                            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60))
LLM_TOTAL = Histogram("gateway_llm_call_seconds", "Whole LLM call, from request to the stream's end.",
                      registry=REGISTRY, buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))
TOKENS = Counter("gateway_llm_tokens", "Tokens reported by the LLM (or estimated), by direction.",
                 ["direction"], registry=REGISTRY)
LLM_RETRIES = Counter("gateway_llm_retries", "LLM attempts retried or moved to a fallback model.", ["kind"],
                      registry=REGISTRY)
TOOL_CALLS = Counter("gateway_tool_calls", "Tool calls settled, by tool and outcome.", ["tool", "outcome"],
                     registry=REGISTRY)
APPROVALS = Counter("gateway_approvals", "Approval prompts: requested, auto-denied.", ["event"],
                    registry=REGISTRY)
OUTBOX = Counter("gateway_outbox_sends", "Outbox deliveries to a platform, by channel.", ["channel"],
                 registry=REGISTRY)
INBOX_DEPTH = Gauge("gateway_inbox_pending", "Inbox items waiting to be processed.", registry=REGISTRY)
INBOX_OLDEST = Gauge("gateway_inbox_oldest_pending_age_seconds",
                     "Age of the oldest pending inbox item (0 when the inbox is empty).", registry=REGISTRY)


def render() -> bytes:
    return generate_latest(REGISTRY)
