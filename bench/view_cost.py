"""CPU of each materialized view that reads llm_requests, and of the views chained on them,
on one block of request rows (what one insert of the collector pushes through them).

    .venv/bin/python -m bench.view_cost --dir DIR [--rows 32000] [-n 5] [--from '2026-12-03 14:00:00']

DIR is a store of bench/fleet_data.py (its servelens.yaml). --rows of its llm_requests rows
from --from on are copied into a Memory table with their timestamps packed 3 ms apart (a
busy fleet's insert: a minute and a half of traffic, not hours); each view's SELECT then
runs on that block, as the engine runs it on an insert, into an empty copy of its target
table (same engine and sort key), and each view chained on that target runs on the rows the
first produced, and so on down the chain. CPU is time.process_time() of this process (the
engine runs in it), median of -n runs. The copies live in a scratch database, dropped at
the end; the store's own tables are only read.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from typing import Any

from servelens.core import config
from servelens.core.store import Store

SCRATCH = "view_cost_scratch"


def _views(client: Any, database: str) -> dict[str, tuple[str, str, str]]:
    """name -> (target table, source table, SELECT) of every materialized view in `database`."""
    out = {}
    for name, create in client.query(
            "SELECT name, create_table_query FROM system.tables "
            "WHERE database = {db:String} AND engine = 'MaterializedView'", parameters={"db": database}).result_rows:
        to = re.search(r" TO (\S+)", create)
        select = create[create.index(" AS ", to.end()) + 4:]
        source = re.search(r"FROM (\S+)", select).group(1)
        out[name] = (to.group(1).split(".")[-1].strip("`"), source.split(".")[-1].strip("`"), select)
    return out


def _on(select: str, source: str, table: str) -> str:
    """The view's SELECT reading `table` in place of its source (aliased, as the stored
    SELECT names its columns by the source table)."""
    return re.sub(r"FROM (\S*\.)?`?" + re.escape(source) + r"`?(?=\s|$)", f"FROM {table} AS {source}", select, count=1)


def _cpu(client: Any, sql: str, runs: int) -> float:
    used = []
    for _ in range(runs):
        started = time.process_time()
        client.command(sql, settings={"insert_deduplicate": 0})
        used.append(time.process_time() - started)
    return statistics.median(used)


def measure(client: Any, database: str, rows: int, since: str, runs: int) -> list[tuple[str, float]]:
    views = _views(client, database)
    client.command(f"DROP DATABASE IF EXISTS {SCRATCH}")
    client.command(f"CREATE DATABASE {SCRATCH}")
    try:
        client.command(f"""CREATE TABLE {SCRATCH}.src ENGINE = Memory AS
            SELECT * REPLACE (toDateTime64({{since:String}}, 9) + toIntervalNanosecond(rowNumberInAllBlocks() * 3000000)
                              AS Timestamp)
            FROM (SELECT * FROM {database}.llm_requests WHERE Timestamp >= {{since:String}} ORDER BY Timestamp LIMIT {rows})""",
                       parameters={"since": since})
        client.command(f"CREATE TABLE {SCRATCH}.t_llm_requests AS {database}.llm_requests")
        out = [("llm_requests itself (the rows written, no view)",
                _cpu(client, f"INSERT INTO {SCRATCH}.t_llm_requests SELECT * FROM {SCRATCH}.src", runs))]

        def chain(source: str, block: str, depth: int) -> None:
            for name, (target, src, select) in sorted(views.items()):
                if src != source:
                    continue
                query = _on(select, src, block)
                client.command(f"CREATE TABLE IF NOT EXISTS {SCRATCH}.t_{target} AS {database}.{target}")
                out.append(("  " * depth + name, _cpu(client, f"INSERT INTO {SCRATCH}.t_{target} {query}", runs)))
                produced = f"{SCRATCH}.o_{name}"
                client.command(f"CREATE TABLE {produced} ENGINE = Memory AS {query}")
                chain(target, produced, depth + 1)

        chain("llm_requests", f"{SCRATCH}.src", 0)
        return out
    finally:
        client.command(f"DROP DATABASE IF EXISTS {SCRATCH}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.view_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="a bench/fleet_data.py directory")
    parser.add_argument("--rows", type=int, default=32_000)
    parser.add_argument("--from", dest="since", default="2026-12-03 14:00:00", help="UTC; the first row's time")
    parser.add_argument("-n", type=int, default=5)
    args = parser.parse_args(argv)
    settings = config.load(f"{args.dir}/servelens.yaml")
    client = Store(settings.store_url, settings.store.database).client()
    found = measure(client, settings.store.database, args.rows, args.since, args.n)
    print(f"{args.rows:,} request rows, CPU ms, median of {args.n}")
    print("| view (indented: chained on the one above) | CPU ms |\n|---|---:|")
    for name, seconds in found:
        print(f"| {name.replace('  ', '&nbsp;&nbsp;')} | {seconds * 1000:,.1f} |")
    print(f"| every view | {sum(s for n, s in found[1:]) * 1000:,.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
