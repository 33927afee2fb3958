"""The process's log: the gateway's own lines at `logging.level`, other libraries' warnings and
errors only (their INFO chatter, like alembic's plugin lines before every start, says nothing
an operator needs) unless the level is `debug`. A line written while a traced run is being
worked on ends with its trace id, to find the trace from the log and the log from the trace.
A database whose disk refuses writes is said once, by the store; what it then fails is not said
again (`SaidOnce`)."""

from __future__ import annotations

import logging

from gateway.events import StoreUnwritable
from gateway.telemetry import current_trace_id

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
OURS = ("gateway", "channels", "scheduler")


class TraceIds(logging.Filter):
    """Gives each record the trace id of the run being worked on (`record.trace_id`, or None)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "trace_id", None) is None:
            record.trace_id = current_trace_id()
        return True


class SaidOnce(logging.Filter):
    """The database refusing writes (a full or read-only disk) is one line with its fix, said by
    the store (gateway/store/disk.py). What it then fails, each loop and task that tries again
    by itself (a turn, the dispatcher, a trace's record, a lease's release), would say it again
    with a traceback every time: those records stay out of the log unless the level is debug."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        seen = 0
        while error is not None and seen < 20:
            if isinstance(error, StoreUnwritable):
                return False
            error, seen = error.__cause__ or error.__context__, seen + 1
        return True


class TraceFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        trace = getattr(record, "trace_id", None)
        return f"{text} trace_id={trace}" if trace else text


def configure(level: str) -> None:
    """`level`: debug | info | warning | error."""
    handler = logging.StreamHandler()
    handler.setFormatter(TraceFormatter(FORMAT))
    handler.addFilter(TraceIds())
    if level != "debug":
        handler.addFilter(SaidOnce())
    ours = getattr(logging, level.upper())
    others = logging.DEBUG if level == "debug" else max(ours, logging.WARNING)
    logging.basicConfig(level=others, handlers=[handler])
    for name in OURS:
        logging.getLogger(name).setLevel(ours)
