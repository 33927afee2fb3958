"""What every settings section shares: strict models, durations, the configuration error."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


class ConfigError(Exception):
    """A configuration problem, worded for the person who edits the file."""


def parse_duration(value: Any) -> float:
    """`90`, `"90s"`, `"15m"`, `"2h"`, `"1d"` -> seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 30s, 15m or 2h, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"expected a duration like 30s, 15m or 2h, got {value!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)
