"""CPU cost of a 2-span (or --rows) INSERT INTO otel_traces on the embedded engine (chDB), per store
variant: what an insert's fixed cost is made of (BENCHMARKS.md, "What an insert costs").

    .venv/bin/python -m bench.insert_cost [-n 20] [--rows 2] [--shape calls|agent] [--variants base,new,noview,fixedonly,nodownstream]
        [--base-upto 25] [--setting name=value ...] [--explain]

Variants (each a database in one fresh chDB directory under a temp dir):
  base   : the migrations up to --base-upto (25: the view as migration 0021 renders it)
  new    : all migrations
  noview : base, then DROP VIEW llm_requests_mv (its share)
  render : base, then the view re-created from the current dialects.py rendering
           (to try a renderer change before writing the migration)
  fixedonly: base, the view writing the same rows with only dialects.FIXED_COLUMNS (the
           cost of the llm_requests write and the views on llm_requests, without the
           dialect expressions)
  nodownstream: fixedonly, and the views that read llm_requests dropped
  nochained: new, less the views that read another view's table (a rollup's coarser tiers)
  norollups: new, less every view that reads llm_requests (the dialect view kept)
  store@setting=value: that store's inserts with a setting (e.g. base@compile_expressions=0)
Rounds are interleaved (one insert per variant per round) so that load from other
processes hits every variant alike. CPU is time.process_time() (all of the process'
threads: chDB runs in-process). EXPLAIN: `EXPLAIN QUERY TREE` / `EXPLAIN PLAN` of the view's
SELECT alone, on the same data.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from servelens.collector.mapping import dialects
from servelens.core.migrate import MIGRATIONS_DIR, migrate
from servelens.core.store import Store

INSERT = """
INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                         ResourceAttributes, ScopeName, SpanAttributes, Duration, StatusCode)
SELECT now64(9), lower(hex(randomString(16))), lower(hex(randomString(8))), '', 'chat gpt-4o',
       'SPAN_KIND_CLIENT', 'bench-svc', map('service.name', 'bench-svc', 'app.team', 'infra'), 'bench',
       map('gen_ai.operation.name', 'chat', 'gen_ai.request.model', 'gpt-4o',
           'gen_ai.response.model', 'gpt-4o-2024-08-06', 'gen_ai.usage.input_tokens', toString(100 + number),
           'gen_ai.usage.output_tokens', '20', 'app.tenant', 'acme'),
       1500000000, 'STATUS_CODE_UNSET'
FROM numbers({rows})
"""


# --shape agent: traces as the Vercel AI SDK 7 writes an agent's model call, three spans each
# (invoke_agent > step > chat), the tenant, user and session on the first two only, so that
# every request takes them from its trace (migration 0045's trace context).
AGENT_INSERT = """
INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                         ResourceAttributes, ScopeName, SpanAttributes, Duration, StatusCode)
SELECT now64(9), concat(toString(randConstant()), '-', toString(intDiv(number, 3))),
       concat(toString(randConstant()), '-', toString(number)),
       if(number % 3 = 0, '', concat(toString(randConstant()), '-', toString(number - 1))),
       ['invoke_agent gpt-4o', 'step 1', 'chat gpt-4o'][number % 3 + 1],
       ['SPAN_KIND_INTERNAL', 'SPAN_KIND_INTERNAL', 'SPAN_KIND_CLIENT'][number % 3 + 1], 'bench-svc',
       map('service.name', 'bench-svc'), 'gen_ai',
       if(number % 3 = 2,
          map('gen_ai.operation.name', 'chat', 'gen_ai.request.model', 'gpt-4o',
              'gen_ai.response.model', 'gpt-4o-2024-08-06', 'gen_ai.usage.input_tokens', toString(100 + number),
              'gen_ai.usage.output_tokens', '20'),
          map('gen_ai.operation.name', if(number % 3 = 0, 'invoke_agent', 'agent_step'),
              'ai.settings.context.tenant', concat('t', toString(intDiv(number, 3) % 50)),
              'ai.settings.context.userId', 'u-1', 'ai.settings.context.sessionId', 's-1')),
       1500000000, 'STATUS_CODE_UNSET'
FROM numbers({rows})
"""


def view_select(client) -> str:
    create = client.query("SELECT create_table_query FROM system.tables "
                          "WHERE database = currentDatabase() AND name = 'llm_requests_mv'").first_row[0]
    return create[create.index(" AS ", create.index("TO ")) + 4:]


def build(url: str, name: str, work: Path, base_upto: int) -> Store:
    store = Store(url, f"b_{name}")
    client = store.client()
    upto = work / f"migrations_{name}"
    upto.mkdir()
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        if name == "new" or int(path.name[:4]) <= base_upto:
            shutil.copy(path, upto / path.name)
    migrate(client, upto)
    if name == "noview":
        client.command("DROP VIEW llm_requests_mv")
    elif name == "noattrindex":
        for index in ("idx_res_attr_key", "idx_res_attr_value", "idx_span_attr_key", "idx_span_attr_value"):
            client.command(f"ALTER TABLE otel_traces DROP INDEX {index}")
    elif name in ("nochained", "norollups"):
        views = client.query("SELECT name, create_table_query FROM system.tables WHERE database = currentDatabase() "
                             "AND engine = 'MaterializedView'").result_rows
        for view, create in views:
            source = re.search(r"\bFROM\s+(?:\S+\.)?(\w+)", create[create.index(" AS ", create.index("TO ")):]).group(1)
            if (source not in ("otel_traces", "llm_requests")) if name == "nochained" else (source == "llm_requests"):
                client.command(f"DROP VIEW {view}")
    elif name in ("fixedonly", "nodownstream"):  # same rows into llm_requests, only the columns no dialect decides
        if name == "nodownstream":  # and no view on llm_requests (rollups, model aliases)
            for (view,) in client.query(
                    "SELECT name FROM system.tables WHERE database = currentDatabase() AND engine = 'MaterializedView' "
                    "AND match(create_table_query, {pattern:String})", parameters={"pattern": r"FROM \S*\bllm_requests(\s|$)"}).result_rows:
                if view != "llm_requests_mv":
                    client.command(f"DROP VIEW {view}")
        client.command("DROP VIEW llm_requests_mv")
        cols = ",\n    ".join(f"{e} AS {n}" for n, e in dialects.FIXED_COLUMNS.items())
        client.command("CREATE MATERIALIZED VIEW llm_requests_mv TO llm_requests AS WITH SpanAttributes AS a, "
                       f"ResourceAttributes AS r SELECT {cols} FROM otel_traces WHERE {dialects.sql_is_request()}")
    elif name == "render":
        client.command("DROP VIEW llm_requests_mv")
        client.command(dialects.llm_requests_view_sql().rstrip().rstrip(";"))
    return store


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=20)
    p.add_argument("--rows", type=int, default=2, help="spans per INSERT (the collector's blocks: up to 65536)")
    p.add_argument("--shape", choices=("calls", "agent"), default="calls",
                   help="calls: every span a request carrying its tenant; agent: see AGENT_INSERT")
    p.add_argument("--variants", default="base,new,noview")
    p.add_argument("--setting", action="append", default=[], help="name=value, on the INSERT")
    p.add_argument("--base-upto", type=int, default=25, help="the last migration of the base variant")
    p.add_argument("--explain", action="store_true")
    args = p.parse_args(argv)
    settings = dict(s.split("=", 1) for s in args.setting)
    work = Path(tempfile.mkdtemp(prefix="insert_cost_"))
    url = f"chdb://{work / 'engine'}"
    try:
        names = args.variants.split(",")
        # "store@name=value" runs that store's inserts with a setting (and the others with
        # its default value, so that a SET left by one variant does not leak into another)
        specs = {name: (name.split("@")[0], dict(kv.split("=", 1) for kv in name.split("@")[1:])) for name in names}
        stores = {}
        for store, _ in specs.values():
            if store not in stores:
                stores[store] = build(url, store, work, args.base_upto)
        first = stores[specs[names[0]][0]].client()
        defaults = {}
        for _, extra in specs.values():
            for key in extra:
                defaults[key] = first.command(f"SELECT value FROM system.settings WHERE name = '{key}'")
        print("engine", first.command("SELECT version()"), "| settings on insert:", settings or "none",
              "| defaults of the varied settings:", defaults or "none")

        def run(name):
            store, extra = specs[name]
            insert = AGENT_INSERT if args.shape == "agent" else INSERT
            stores[store].client().command(insert.format(rows=args.rows), settings={**settings, **defaults, **extra})

        cpu = {name: [] for name in names}
        wall = {name: [] for name in names}
        for name in names:  # warm-up
            run(name)
        for _ in range(args.n):
            for name in names:
                c0, w0 = time.process_time(), time.perf_counter()
                run(name)
                cpu[name].append((time.process_time() - c0) * 1e3)
                wall[name].append((time.perf_counter() - w0) * 1e3)
        q = lambda xs, f: sorted(xs)[round(f * (len(xs) - 1))]
        for name in names:
            client = stores[specs[name][0]].client()
            rows = client.command("SELECT count() FROM llm_requests") if specs[name][0] != "noview" else "-"
            print(f"{name:10s} insert CPU ms: median {statistics.median(cpu[name]):6.1f}  p25 {q(cpu[name], .25):6.1f}  "
                  f"p10 {q(cpu[name], .1):6.1f}  min {min(cpu[name]):6.1f}  max {max(cpu[name]):6.1f} | wall median "
                  f"{statistics.median(wall[name]):6.1f} | llm_requests rows {rows}")
        if "fixedonly" in names:
            print("the dialect expressions' share (variant - fixedonly), median / p25 / p10:")
            for name in names:
                if specs[name][0] in ("base", "new", "render"):
                    print(f"  {name:8s} " + " / ".join(f"{q(cpu[name], f) - q(cpu['fixedonly'], f):5.1f}"
                                                       for f in (.5, .25, .1)))
        if args.explain:
            for name in stores:
                if name == "noview":
                    continue
                client = stores[name].client()
                select = view_select(client)
                for kind in ("EXPLAIN QUERY TREE", "EXPLAIN PLAN"):
                    times = []
                    for _ in range(max(5, args.n // 2)):
                        c0 = time.process_time()
                        client.query(f"{kind} {select}", settings={**settings, **defaults})
                        times.append((time.process_time() - c0) * 1e3)
                    print(f"{name:8s} {kind:18s} CPU ms median {statistics.median(times):7.1f}  "
                          f"min {min(times):7.1f}  (SELECT: {len(select)} chars)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
