"""Apply migrations/NNNN_name.sql in order, each recorded once in servelens_migrations."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from clickhouse_connect.driver.client import Client

from servelens.core import cluster_ddl

log = logging.getLogger(__name__)

# Package data: an installed wheel is unpacked, so the resource is a directory on disk.
MIGRATIONS_DIR = Path(str(resources.files("servelens.core") / "migrations"))
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


def ledger_ddl(cluster: str | None = None, database: str = "") -> list[str]:
    """What creates the ledger; on a cluster, the database on every node first."""
    if cluster is None:
        return [_LEDGER_DDL]
    return [cluster_ddl.create_database(cluster, database), *cluster_ddl.render(_LEDGER_DDL, cluster, database)]


def applied(client: Client, cluster: str | None = None, database: str = "") -> set[int]:
    for statement in ledger_ddl(cluster, database):
        client.command(statement)
    return recorded(client)


def recorded(client: Client) -> set[int]:
    """The versions the ledger (which must exist) records as applied."""
    return {row[0] for row in client.query("SELECT DISTINCT version FROM servelens_migrations").result_rows}


def planned(directory: Path = MIGRATIONS_DIR, cluster: str | None = None,
            database: str = "") -> list[tuple[Migration, list[str]]]:
    """Every migration with the statements it runs: as written, or rendered for `cluster`.

    On a cluster every file is rendered from the first, applied or not: a statement's
    rendering depends on the tables earlier ones made (cluster_ddl.render_all).
    """
    migrations = discover(directory)
    if cluster is None:
        return [(m, m.statements()) for m in migrations]
    return list(zip(migrations, cluster_ddl.render_all([m.statements() for m in migrations], cluster, database)))


def ddl_script(cluster: str | None, database: str, directory: Path = MIGRATIONS_DIR) -> str:
    """`servelens migrate --print-ddl`: everything migrate() would run on an empty store."""
    target = f"cluster {cluster}" if cluster else "one server (store.cluster is not set)"
    parts = [f"-- servelens schema for {target}, database {database}"]
    parts += [f"{s.strip()};" for s in ledger_ddl(cluster, database)]
    for migration, statements in planned(directory, cluster, database):
        parts.append(f"-- {migration.version:04d}_{migration.name}")
        parts += [f"{s.strip()};" for s in statements]
    return "\n\n".join(parts) + "\n"


def migrate(client: Client, directory: Path = MIGRATIONS_DIR, cluster: str | None = None) -> list[Migration]:
    """Apply the missing migrations; returns those applied now (empty when up to date).

    Statements are idempotent (IF NOT EXISTS), so a run cut short between a statement
    and its ledger row is finished safely by the next run. With `cluster` (store.cluster)
    they are rendered for it (servelens.cluster_ddl) and run from this one connection.
    """
    database = ""
    if cluster:
        if not client.command(f"SELECT count() FROM system.clusters WHERE cluster = '{cluster}'"):
            raise ValueError(f"store.cluster {cluster!r}: the server's remote_servers has no such cluster")
        database = client.command("SELECT currentDatabase()")
    # On a cluster an INSERT ... SELECT (a backfill) runs as written, on this node, through
    # the Distributed tables (not rewritten per shard onto the _local tables, where
    # `table.Column` references no longer resolve), and returns once every shard holds its
    # rows, so the ledger never records a migration whose rows are still in flight.
    extra = {"settings": {"insert_distributed_sync": 1, "parallel_distributed_insert_select": 0}} if cluster else {}
    done = applied(client, cluster, database)
    ran = []
    for migration, statements in planned(directory, cluster, database):
        if migration.version in done:
            continue
        for statement in statements:
            client.command(statement, **extra)
        client.insert("servelens_migrations", [[migration.version, migration.name]], column_names=["version", "name"],
                      **extra)
        log.info("applied migration %04d_%s", migration.version, migration.name)
        ran.append(migration)
    return ran
