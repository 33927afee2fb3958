"""Scheduled work's checks: the probes (a command, a URL, a read-only MCP tool) run before a
model is called."""
