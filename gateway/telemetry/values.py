"""What spans carry, and the clocks they are timed by: no OpenTelemetry here (the exporter's
module and the instrumented code share these)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

Attributes = Mapping[str, Any]  # str, int, float, bool; None is left out


def now_ns() -> int:
    return time.time_ns()


def ns_of(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def usd(nano_usd: int | None) -> float | None:
    return None if nano_usd is None else nano_usd / 1_000_000_000


def clean(attributes: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """Attributes as OTLP carries them: None left out, anything else not a scalar as text."""
    out: dict[str, str | int | float | bool] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, (str, int, float, bool)) else str(value)
    return out
