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
FEEDBACK = Counter("gateway_reply_feedback", "Thumbs up / down put on (or taken off) the agent's replies.",
                   ["channel", "feedback", "change"], registry=REGISTRY)
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
COST = Counter("gateway_llm_cost_usd", "What the LLM calls of turns cost, in USD (llm.prices), by model.", ["model"],
               registry=REGISTRY)
OUTBOX_RETRIES = Counter("gateway_outbox_retries", "Failed delivery attempts tried again, by why.",
                         ["channel", "reason"], registry=REGISTRY)  # backoff | retry_after | ambiguous
OUTBOX_AMBIGUOUS = Counter("gateway_outbox_ambiguous", "Sends that failed ambiguously (may be in the chat).",
                           ["channel", "decision"], registry=REGISTRY)  # resent | gave_up
OUTBOX_RETRYING = Gauge("gateway_outbox_retrying", "Sends pending after at least one failed attempt.",
                        registry=REGISTRY)
OUTBOX_STUCK = Gauge("gateway_outbox_stuck", "Sends pending longer than outbox.sweep_after_s that nobody is sending.",
                     registry=REGISTRY)
RATE_LIMIT_WAITS = Counter("gateway_rate_limit_waits", "Sends that waited for a chat's pacing or retry_after hold.",
                           ["channel"], registry=REGISTRY)
RATE_LIMIT_SECONDS = Counter("gateway_rate_limit_wait_seconds", "Time sends spent waiting for a chat's pacing or hold.",
                             ["channel"], registry=REGISTRY)
LEASE_TAKEOVERS = Counter("gateway_lease_takeovers", "Leases taken over after their holder let them expire.", ["lease"],
                          registry=REGISTRY)  # thread | leader
LEADER_CHANGES = Counter("gateway_leader_changes", "This instance became the leader or lost leadership.", ["event"],
                         registry=REGISTRY)  # acquired | lost
IS_LEADER = Gauge("gateway_leader", "1 while this instance is the leader.", registry=REGISTRY)
SCHEDULER_FIRINGS = Counter("gateway_scheduler_firings", "Scheduled job runs recorded, by status.", ["status"],
                            registry=REGISTRY)  # running | success | failed | canceled | skipped | missed
BUDGET_SPENT = Counter("gateway_budget_spent_usd", "Spend settled against the spend caps, by payer kind.", ["scope"],
                       registry=REGISTRY)  # user | chat | job | global
BUDGET_USE = Gauge("gateway_budget_use_ratio",
                   "The highest share of its cap a payer of this kind used this period (as this instance settled it).",
                   ["scope", "period"], registry=REGISTRY)
INBOX_DEPTH = Gauge("gateway_inbox_pending", "Inbox items waiting to be processed.", registry=REGISTRY)
INBOX_OLDEST = Gauge("gateway_inbox_oldest_pending_age_seconds",
                     "Age of the oldest pending inbox item (0 when the inbox is empty).", registry=REGISTRY)


def render() -> bytes:
    return generate_latest(REGISTRY)
