"""Helper run in its own process by bench.ingest: chDB admits one data directory per process.

    python -m bench.store_probe size DIR      OPTIMIZE ... FINAL, then rows/bytes per table (JSON)
    python -m bench.store_probe count DIR     rows per table from system.parts (JSON)
    python -m bench.store_probe insert DIR    the writer's insert alone, 512 and 8192 rows (JSON)

The collector that wrote DIR must have exited before `size`/`count` open it.
"""

from __future__ import annotations

import json
import re
import sys
import time

from servelens.core.store import Store

DATABASE = "otel"

_PARTS = """
SELECT table, sum(rows), sum(data_compressed_bytes), sum(data_uncompressed_bytes), sum(bytes_on_disk), count()
FROM system.parts WHERE database = %(db)s AND active GROUP BY table ORDER BY table
"""


def _parts(client) -> dict[str, dict[str, int]]:
    return {t: {"rows": int(r), "compressed": int(c), "uncompressed": int(u), "on_disk": int(d), "parts": int(n)}
            for t, r, c, u, d, n in client.query(_PARTS, parameters={"db": DATABASE}).result_rows}


def span_views(client) -> dict[str, str]:
    """Materialized views fed by otel_traces -> their target tables: every span insert
    also writes these, so they belong to the per-span cost and size."""
    rows = client.query("SELECT name, create_table_query FROM system.tables "
                        "WHERE database = %(db)s AND engine = 'MaterializedView'", parameters={"db": DATABASE}).result_rows
    views = {}
    for name, ddl in rows:
        source = re.search(r"\bFROM\s+(?:`?\w+`?\.)?`?(\w+)`?", ddl.split(" AS ", 1)[-1])
        target = re.search(r"\bTO\s+(?:`?\w+`?\.)?`?(\w+)`?", ddl)
        if source and target and source.group(1) == "otel_traces":
            views[name] = target.group(1)
    return views


def size(directory: str) -> dict:
    client = Store(f"chdb://{directory}", DATABASE).client()
    # Merge every table's parts first: right after ingest a table is many small parts,
    # which compress worse than the long-lived merged parts a running system keeps.
    for table in _parts(client):
        client.command(f"OPTIMIZE TABLE `{DATABASE}`.`{table}` FINAL")
    return {"tables": _parts(client), "span_views": span_views(client)}


def count(directory: str) -> dict:
    return {"tables": _parts(Store(f"chdb://{directory}", DATABASE).client())}


def insert(directory: str) -> dict:
    """The writer's insert alone (no HTTP, parse or mapping), same schema and materialized
    views as the collector: one request's 512 rows per insert (what a lightly loaded
    collector commits) and batch_size = 8192 rows (a saturated one). CPU is the whole
    process's, so the engine's own threads (pipeline, background merges) count too."""
    import uuid

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from bench.payloads import build_payloads
    from servelens.collector.mapping.spans import spans_to_rows
    from servelens.core.migrate import migrate

    store = Store(f"chdb://{directory}", DATABASE)
    client = store.client()
    migrate(client)
    batches = [spans_to_rows(ExportTraceServiceRequest.FromString(p)) for p in build_payloads(16, 512, seed=11)]
    columns = batches[0].columns
    result: dict = {"span_views": span_views(client)}
    for label, group, rounds in (("request", batches[:1], 12), ("batch", batches, 6)):
        data = [[v for b in group for v in b.data[i]] for i in range(len(columns))]
        rows = len(data[0])

        def commit(data: list[list] = data) -> None:
            # The call collector.writer.Writer._insert makes, deduplication token included.
            client.insert("otel_traces", data, column_names=list(columns), column_oriented=True,
                          settings={"insert_deduplication_token": uuid.uuid4().hex,
                                    "deduplicate_blocks_in_dependent_materialized_views": 1})

        commit()  # warms the engine's caches
        walls = []
        cpu = time.process_time()
        for _ in range(rounds):
            started = time.perf_counter()
            commit()
            walls.append(time.perf_counter() - started)
        result[label] = {"rows": rows, "inserts": rounds, "wall_median": sorted(walls)[rounds // 2],
                         "cpu_per_insert": (time.process_time() - cpu) / rounds}
        result[label]["serialize_cpu"] = _serialize_cpu(client, columns, data)
    return result


def _serialize_cpu(client, columns, data) -> float | None:
    """CPU seconds clickhouse-connect spends building the Native block in Python (it holds
    the GIL, unlike the engine). Uses the client's private transform: None if it moved."""
    try:
        spent = []
        for _ in range(3):  # the least of three: noise only ever adds
            # This thread's CPU only: process time would add the engine's background merges.
            started = time.thread_time()
            context = client.create_insert_context("otel_traces", column_names=list(columns), data=data,
                                                   column_oriented=True)
            for _ in client._transform.build_insert(context):
                pass
            spent.append(time.thread_time() - started)
        return min(spent)
    except Exception:  # noqa: BLE001 - a private API: report n/a rather than fail the bench
        return None


def main(argv: list[str]) -> int:
    command, directory = argv
    result = {"size": size, "count": count, "insert": insert}[command](directory)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
