"""Apply migrations/NNNN_name.sql in order, each recorded once in servelens_migrations."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from clickhouse_connect.driver.client import Client

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS servelens_migrations (
    version UInt32,
    name String,
    applied_at DateTime64(3) DEFAULT now64(3)
) ENGINE = ReplacingMergeTree(applied_at) ORDER BY version
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    def statements(self) -> list[str]:
        return split_statements(self.path.read_text())


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.match(path.name)
        if not match:
            raise ValueError(f"migration file name must be NNNN_name.sql: {path.name}")
        found.append(Migration(int(match.group(1)), match.group(2), path))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ValueError(f"duplicate migration numbers in {directory}")
    return found


def split_statements(sql: str) -> list[str]:
    """Statements end with ';' at the end of a line; '--' comment lines are dropped."""
    statements, current = [], []
    for line in sql.splitlines():
        if line.strip().startswith("--"):
            continue
        current.append(line)
        if line.rstrip().endswith(";"):
            statements.append("\n".join(current).strip().rstrip(";"))
            current = []
    tail = "\n".join(current).strip()
    if tail:
        statements.append(tail)
    return [s for s in statements if s]


def applied(client: Client) -> set[int]:
    client.command(_LEDGER_DDL)
    return {row[0] for row in client.query("SELECT DISTINCT version FROM servelens_migrations").result_rows}


def migrate(client: Client, directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Apply the missing migrations; returns those applied now (empty when up to date).

    Statements are idempotent (IF NOT EXISTS), so a run cut short between a statement
    and its ledger row is finished safely by the next run.
    """
    done = applied(client)
    ran = []
    for migration in discover(directory):
        if migration.version in done:
            continue
        for statement in migration.statements():
            client.command(statement)
        client.insert("servelens_migrations", [[migration.version, migration.name]], column_names=["version", "name"])
        log.info("applied migration %04d_%s", migration.version, migration.name)
        ran.append(migration)
    return ran
