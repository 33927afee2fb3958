"""A whole gateway in a process of its own, for tests that kill it with SIGKILL.

    python tests/crash_target.py settings.json

The file holds {"config": <Config as JSON>, "url": <database URL>, "pg_schema": <schema or null>}.
The process prints "ready" once it takes events, then runs until it is killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.app import Gateway  # noqa: E402
from gateway.config import Config  # noqa: E402
from gateway.llm import LLMClient  # noqa: E402
from gateway.store import Store  # noqa: E402


async def main(path: str) -> None:
    settings = json.loads(Path(path).read_text())
    config = Config.model_validate(settings["config"])
    store = Store(settings["url"], pg_schema=settings.get("pg_schema"))
    gateway = Gateway(
        config, store=store, llm=LLMClient(config.llm, backoff_base_s=0.01), serve_http=bool(settings.get("http"))
    )
    if "telegram" in gateway.channels:
        gateway.channels["telegram"].poll_backoff_s = 0.05  # type: ignore[attr-defined]
    await gateway.start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
