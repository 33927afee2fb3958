"""Runs the peer, nanobot-ai, against the benchmark's fake Bot API (run by bench/peer.py with
the peer's own interpreter, never imported by the project).

nanobot builds its python-telegram-bot Application for api.telegram.org and has no setting for
another Bot API server, so the one thing changed here is the builder's base URL; everything
else is the peer as installed: `nanobot gateway --config FILE`.
"""

from __future__ import annotations

import os
import sys

from telegram.ext import ApplicationBuilder

BASE = os.environ["BENCH_TELEGRAM_URL"]
_build = ApplicationBuilder.build


def _build_against_the_fake(self: ApplicationBuilder) -> object:
    self.base_url(f"{BASE}/bot")
    self.base_file_url(f"{BASE}/file/bot")
    return _build(self)


ApplicationBuilder.build = _build_against_the_fake  # type: ignore[method-assign]

from nanobot.cli.commands import app  # noqa: E402

sys.argv = ["nanobot", "gateway", "--config", sys.argv[1]]
app()
