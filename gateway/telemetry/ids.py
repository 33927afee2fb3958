"""Trace and span ids as W3C Trace Context and OTLP spell them (lower-case hex), made without
OpenTelemetry: every run gets its ids when it starts, exported or not."""

from __future__ import annotations

import os


def new_trace_ids() -> tuple[str, str]:
    """A random trace id (32 hex digits) and span id (16), neither all zeros."""
    while True:
        raw = os.urandom(24)
        if any(raw[:16]) and any(raw[16:]):
            return raw[:16].hex(), raw[16:].hex()
