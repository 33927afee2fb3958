"""Regenerate the initial migration from gateway/store/tables.py (before the first release only).

    .venv/bin/python -m gateway.migrations.regenerate
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from alembic import command

from gateway.store.db import MIGRATIONS_DIR, _alembic_config

INITIAL = MIGRATIONS_DIR / "versions" / "0001_initial.py"


def main() -> None:
    INITIAL.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _alembic_config(f"sqlite:///{Path(tmp) / 'empty.db'}")
        command.revision(cfg, message="initial schema", autogenerate=True, rev_id="0001")
    generated = next((MIGRATIONS_DIR / "versions").glob("0001_*.py"))
    text = generated.read_text().replace("gateway.store.tables.UTCDateTime(timezone=True)", "gateway.store.tables.UTCDateTime()")
    generated.unlink()
    INITIAL.write_text(text)
    print(f"wrote {INITIAL}")


if __name__ == "__main__":
    main()
