"""Migrations a rolling upgrade survives: while instances of the previous release serve on the
newer schema (docs/operations.md, "A rolling upgrade"), each migration since that release only
adds. A dropped or renamed table or column, or a new column the old code would have to fill
(NOT NULL without a server default), would break the instances still on the release; such a
change needs two releases (add now, remove once nothing reads it). `bench/chaos.py
--upgrade-from` drills a real one; this catches the shape of a breaking migration before that."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

VERSIONS = Path(__file__).resolve().parents[1] / "gateway" / "migrations" / "versions"
ROLLING_SINCE = "0022"  # the first release whose instances are upgraded one at a time beside newer ones
BREAKING = {"drop_column", "drop_table", "rename_table", "alter_column", "drop_constraint"}


def upgrade_calls(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text())
    [upgrade] = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "upgrade"]
    return sorted((node for node in ast.walk(upgrade) if isinstance(node, ast.Call)), key=lambda c: c.lineno)


def name_of(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def problems(path: Path) -> list[str]:
    found = []
    for call in upgrade_calls(path):
        if name_of(call) in BREAKING:
            found.append(f"{name_of(call)} at line {call.lineno}")
        if name_of(call) == "add_column":
            column = next((a for a in call.args if isinstance(a, ast.Call) and name_of(a) == "Column"), None)
            required = column is not None and isinstance(keyword(column, "nullable"), ast.Constant) and (
                keyword(column, "nullable").value is False  # type: ignore[union-attr]
            )
            if required and keyword(column, "server_default") is None:  # type: ignore[arg-type]
                found.append(f"a NOT NULL column without a server default at line {call.lineno}")
    return found


MIGRATIONS = sorted(p for p in VERSIONS.glob("[0-9][0-9][0-9][0-9]_*.py") if p.name[:4] > ROLLING_SINCE)


@pytest.mark.parametrize("path", MIGRATIONS, ids=lambda p: p.name)
def test_a_migration_since_the_release_only_adds(path: Path) -> None:
    assert problems(path) == [], f"{path.name} would break instances still on the release during a rolling upgrade"


def test_the_check_finds_what_breaks_a_rolling_upgrade(tmp_path: Path) -> None:
    migration = tmp_path / "0099_example.py"
    migration.write_text(
        "import sqlalchemy as sa\nfrom alembic import op\n\n\ndef upgrade():\n"
        "    with op.batch_alter_table('messages') as batch:\n"
        "        batch.add_column(sa.Column('kept', sa.JSON(), nullable=True))\n"
        "        batch.add_column(sa.Column('filled', sa.Integer(), nullable=False, server_default='0'))\n"
        "        batch.add_column(sa.Column('required', sa.Integer(), nullable=False))\n"
        "        batch.drop_column('text')\n"
        "    op.rename_table('skills', 'abilities')\n\n\n"
        "def downgrade():\n    op.drop_table('abilities')\n"
    )
    assert problems(migration) == [
        "a NOT NULL column without a server default at line 9",
        "drop_column at line 10",
        "rename_table at line 11",
    ]
