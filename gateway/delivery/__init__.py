"""Delivery: every message, prompt and file that leaves for a platform, recorded in the outbox
(idempotent, retried, swept), paced per chat and platform hold, and fenced by the lease of the
work that sends it; what channels may keep (cursors, counters) backed by the store."""
