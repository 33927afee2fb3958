"""Files on disk: where each session's files live (written without following links, private to
the gateway's user), their pruning with their session, and ticks' checklist files."""
