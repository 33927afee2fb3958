"""The durable per-thread inbox: submit, dispatcher, one thread's worker, slash commands."""
