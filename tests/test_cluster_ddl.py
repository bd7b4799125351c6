"""The migrations rendered for a ClickHouse cluster (servelens.cluster_ddl, store.cluster).

Every statement of every migration is rendered for the cluster `servelens`, then
- parsed by the embedded engine's own parser (formatQuerySingleLine), which also gives a
  normalized text to check the rewrite against (independent of the renderer's tokens);
- run, with only replication taken out (no Keeper here), on a one-shard cluster of the
  embedded engine: the Distributed tables, the _local tables and the views over them are
  the real ones, so spans inserted into the Distributed otel_traces must come out of the
  Distributed llm_requests, rollups, evaluations, GPU tables.
chDB admits one engine configuration per process: both run in a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from servelens.analytics import rollup_tiers
from servelens.app.cli import main
from servelens.core import cluster_ddl
from servelens.core.config import ConfigError, load
from servelens.core.migrate import _LEDGER_DDL, ddl_script, discover, ledger_ddl, migrate, planned

ROOT = Path(__file__).resolve().parent.parent
CLUSTER, DATABASE = "servelens", "otel"
ON = f" ON CLUSTER {CLUSTER}"

# Runs in a subprocess: {"path", "config", "parse", "execute", "checks"} on stdin.
ENGINE = textwrap.dedent(r"""
    import json, sys
    from chdb import session

    req = json.load(sys.stdin)
    s = session.Session(req["path"] + "?config-file=" + req["config"])

    def literal(q):  # a string literal: the statement's braces ({shard}) are no query parameters there
        return "'" + q.replace("\\", "\\\\").replace("'", "\\'") + "'"

    out = {"formatted": [], "errors": [], "checks": {}}
    for q in req["parse"]:
        try:
            r = s.query("SELECT formatQuerySingleLine(" + literal(q) + ")", "TabSeparatedRaw")
            out["formatted"].append(r.data().rstrip("\n"))
        except Exception as e:
            out["formatted"].append(None)
            out["errors"].append(["parse", q[:300], str(e)[:600]])
    for step in req["execute"]:
        if isinstance(step, dict):  # {"check": name, "sql": ...} between statements
            out["checks"][step["check"]] = json.loads(s.query(step["sql"], "JSONCompact").data())["data"]
            continue
        try:
            s.query(step)
        except Exception as e:
            out["errors"].append(["execute", step[:300], str(e)[:600]])
    for name, q in req["checks"].items():
        try:
            out["checks"][name] = json.loads(s.query(q, "JSONCompact").data())["data"]
        except Exception as e:
            out["checks"][name] = "error: " + str(e)[:300]
    s.close()
    json.dump(out, sys.stdout)
""")

# One shard, this engine itself (tcp_port makes localhost "local": no network involved).
ONE_SHARD = f"""<clickhouse>
  <tcp_port>9000</tcp_port>
  <remote_servers><{CLUSTER}><shard><internal_replication>true</internal_replication>
    <replica><host>localhost</host><port>9000</port></replica></shard></{CLUSTER}></remote_servers>
</clickhouse>"""


def run_engine(tmp: Path, config: str, parse: list[str] = (), execute: list[Any] = (),
               checks: dict[str, str] | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    (tmp / "config.xml").write_text(config)
    request = {"path": str(tmp / "db"), "config": str(tmp / "config.xml"), "parse": list(parse),
               "execute": list(execute), "checks": checks or {}}
    done = subprocess.run([sys.executable, "-c", ENGINE], input=json.dumps(request), capture_output=True,
                          text=True, timeout=280, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def single_node(statement: str) -> str:
    """A rendered statement as this one Keeper-less engine can run it: replication out."""
    statement = statement.replace(ON, "")
    return re.sub(r"Replicated(\w*MergeTree)\('[^']*', '\{replica\}'(?:, )?", r"\1(", statement)


@pytest.fixture(scope="module")
def rendered() -> list[str]:
    return ledger_ddl(CLUSTER, DATABASE) + [s for _, statements in planned(cluster=CLUSTER, database=DATABASE)
                                            for s in statements]


@pytest.fixture(scope="module")
def originals() -> list[str]:
    return [s for m in discover() for s in m.statements()] + [_LEDGER_DDL]


@pytest.fixture(scope="module")
def parsed(tmp_path_factory, originals, rendered) -> dict[str, Any]:
    """The engine's normalized text of every original and rendered statement."""
    out = run_engine(tmp_path_factory.mktemp("parse"), "<clickhouse/>", parse=originals + rendered)
    assert out["errors"] == []
    return {"originals": out["formatted"][:len(originals)], "rendered": out["formatted"][len(originals):]}


def mergetree_tables(formatted: list[str]) -> dict[str, tuple[str, bool]]:
    """Table -> (engine, rebuilt by CREATE OR REPLACE) of the MergeTree tables statements create."""
    found = {}
    for q in formatted:
        m = re.match(r"CREATE (OR REPLACE )?TABLE (?:IF NOT EXISTS )?(\w+) \(.*?\) ENGINE = (\w*MergeTree)\b", q)
        if m:
            found[m.group(2)] = (m.group(3), found.get(m.group(2), ("", False))[1] or bool(m.group(1)))
    return found


# --- single server: untouched ------------------------------------------------------------

def test_without_a_cluster_the_statements_are_the_files():
    assert [(m, s) for m, s in planned()] == [(m, m.statements()) for m in discover()]
    assert ledger_ddl() == [_LEDGER_DDL]
    for m in discover():
        for statement in m.statements():
            assert cluster_ddl.render(statement, None, DATABASE) == [statement]
    script = ddl_script(None, DATABASE)
    assert "ON CLUSTER" not in script and "Replicated" not in script and "Distributed" not in script


# --- (a) ClickHouse's parser accepts every rendered statement ------------------------------

@pytest.mark.integration
def test_every_rendered_statement_parses(parsed, rendered):
    assert len(parsed["rendered"]) == len(rendered) and all(parsed["rendered"])


# --- (b) what the rendering does -----------------------------------------------------------

@pytest.mark.integration
def test_every_mergetree_table_is_replicated_under_a_distributed_table_of_its_name(parsed):
    tables = mergetree_tables(parsed["originals"])
    assert {"otel_traces", "llm_requests", "gpu_samples", "analytics_leases", "servelens_migrations"} <= set(tables)
    text = "\n".join(parsed["rendered"])
    for table, (engine, rebuilt) in tables.items():
        local = f"{table}_local"
        path = f"'/clickhouse/tables/{{shard}}/{{database}}/{local}'"
        assert re.search(rf"CREATE TABLE IF NOT EXISTS {local}{ON} \(.*\) ENGINE = Replicated{engine}\({re.escape(path)}, "
                         r"'\{replica\}'", text), table
        assert re.search(rf"CREATE TABLE IF NOT EXISTS {table}{ON} AS {local} ENGINE = Distributed\("
                         rf"'{CLUSTER}', '{DATABASE}', '{local}', ", text), table
        if rebuilt:  # built beside the old table under a Keeper path of its own, copied once, swapped
            staging = f"{local}_rebuild"
            assert re.search(rf"CREATE TABLE {staging}{ON} \(.*\) ENGINE = Replicated{engine}\("
                             rf"'/clickhouse/tables/{{shard}}/{{database}}/{local}_{{uuid}}'", text), table
            assert f"EXCHANGE TABLES {local} AND {staging}{ON}" in text
            assert f"CREATE OR REPLACE TABLE {table}{ON} AS {local} ENGINE = Distributed(" in text
    assert "non_replicated_deduplication_window" not in text
    assert "ALTER TABLE otel_traces_local ON CLUSTER servelens (MODIFY SETTING replicated_deduplication_window = 10000, " \
           "replicated_deduplication_window_seconds = 604800)" in text


def test_sharding_keys(rendered):
    by_table = {}
    for statement in rendered:
        m = re.search(r"TABLE (?:IF NOT EXISTS )?(\w+) ON CLUSTER \w+ AS \w+\n"
                      r"ENGINE = Distributed\('\w+', '\w+', '\w+', (.*)\)$", statement)
        if m:
            by_table[m.group(1)] = m.group(2)
    # a trace's spans (and what views derive from them) on one shard; '' spread by the key
    assert by_table["otel_traces"] == ("if(TraceId = '', cityHash64(ServiceName, SpanName, toDateTime(Timestamp)), "
                                       "cityHash64(TraceId))")
    assert by_table["trace_outcomes"] == "cityHash64(TraceId)"
    # rows that merge or claim by token meet on one shard
    assert by_table["analytics_leases"] == "cityHash64(report, until, attempt)"
    assert by_table["trigger_episodes"] == "cityHash64(id)"
    assert by_table["servelens_migrations"] == "cityHash64(version)"
    assert "rand()" not in "".join(by_table.values())


@pytest.mark.integration
def test_every_statement_but_inserts_runs_on_the_cluster(parsed):
    for q in parsed["rendered"]:
        assert q.startswith("INSERT INTO") or ON in q, q[:120]
    assert f"CREATE DATABASE IF NOT EXISTS {DATABASE}{ON}" in parsed["rendered"]


@pytest.mark.integration
def test_views_over_sharded_tables_read_and_write_the_local_tables(parsed):
    sharded = set(mergetree_tables(parsed["originals"]))
    views = [q for q in parsed["rendered"] if q.startswith("CREATE MATERIALIZED VIEW")]
    assert len(views) >= 10
    for q in views:
        assert ON in q
        target = re.search(r" TO (\w+) ", q).group(1)
        # table references (ARRAY JOIN joins columns, not tables)
        reads = [t for t in re.findall(r"(?<!ARRAY )\b(?:FROM|JOIN) (\w+)", q) if t.removesuffix("_local") in sharded]
        if reads:
            assert all(t.endswith("_local") for t in reads), q[:200]
            assert target.endswith("_local") and target.removesuffix("_local") in sharded, q[:200]
            for t in reads:  # aliased to the plain name: `llm_requests.Column` keeps resolving
                assert f"FROM {t} AS {t.removesuffix('_local')}" in q or f"JOIN {t} AS {t.removesuffix('_local')}" in q
    # the engine's protobuf intake is a Null table on each node: its view shards by inserting
    # into the Distributed otel_traces
    (intake,) = [q for q in views if "otlp_traces_in_mv" in q]
    assert " TO otel_traces AS " in intake and "FROM otlp_traces_in " in intake


def test_alter_reaches_the_local_tables_and_the_distributed_ones_for_columns():
    rendered = dict(zip([m.version for m in discover()], [s for _, s in planned(cluster=CLUSTER, database=DATABASE)]))
    local, distributed = [s for s in rendered[17] if s.startswith("ALTER TABLE gpu_samples")]
    assert local.startswith(f"ALTER TABLE gpu_samples_local{ON}") and "MODIFY ORDER BY" in local
    assert distributed.startswith(f"ALTER TABLE gpu_samples{ON}") and "ADD COLUMN IF NOT EXISTS DraClaimName" in distributed
    assert "MODIFY ORDER BY" not in distributed
    assert cluster_ddl.render("ALTER TABLE t DROP COLUMN a", CLUSTER, DATABASE, frozenset({"t"})) == [
        f"ALTER TABLE t{ON}\n    DROP COLUMN a", f"ALTER TABLE t_local{ON}\n    DROP COLUMN a"]
    assert cluster_ddl.render("ALTER TABLE t MODIFY TTL d", CLUSTER, DATABASE, frozenset({"t"})) == [
        f"ALTER TABLE t_local{ON}\n    MODIFY TTL d"]


def test_renderer_reads_tokens_not_text():
    sharded = frozenset({"src", "dst", "other"})
    (view,) = cluster_ddl.render(
        "CREATE MATERIALIZED VIEW v TO dst AS\n"
        "-- a comment's quote ( and paren: FROM src\n"
        "SELECT extract(s, 'FROM src') AS x, EXTRACT(DAY FROM t) AS d, `weird name` /* FROM other */\n"
        "FROM src FINAL LEFT ARRAY JOIN other AS o\n"
        "WHERE k IN (SELECT k FROM other AS o2) AND n IN (SELECT number FROM numbers(10))",
        CLUSTER, DATABASE, sharded)
    assert view == (f"CREATE MATERIALIZED VIEW v{ON} TO dst_local AS\n"
                    "-- a comment's quote ( and paren: FROM src\n"
                    "SELECT extract(s, 'FROM src') AS x, EXTRACT(DAY FROM t) AS d, `weird name` /* FROM other */\n"
                    "FROM src_local AS src FINAL LEFT ARRAY JOIN other AS o\n"
                    "WHERE k IN (SELECT k FROM other_local AS o2) AND n IN (SELECT number FROM numbers(10))")
    table, distributed = cluster_ddl.render(
        "CREATE TABLE IF NOT EXISTS `my t` (TraceId String, -- the trace (hex)\n `at` DateTime) "
        "ENGINE = SummingMergeTree((x)) ORDER BY tuple() SETTINGS non_replicated_deduplication_window = 5",
        CLUSTER, DATABASE)
    assert table == ("CREATE TABLE IF NOT EXISTS `my t_local` ON CLUSTER servelens (TraceId String, -- the trace (hex)\n"
                     " `at` DateTime) ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/{database}/my t_local', "
                     "'{replica}', (x)) ORDER BY tuple() SETTINGS replicated_deduplication_window = 5, "
                     "replicated_deduplication_window_seconds = 604800")
    assert distributed.endswith("'my t_local', if(TraceId = '', rand(), cityHash64(TraceId)))")
    # other engines: on every node, as written
    assert cluster_ddl.render("CREATE TABLE n (a Int8) ENGINE = Null", CLUSTER, DATABASE) == [
        f"CREATE TABLE n{ON} (a Int8) ENGINE = Null"]
    assert cluster_ddl.render("DROP TABLE IF EXISTS t SYNC", CLUSTER, DATABASE, frozenset({"t"})) == [
        f"DROP TABLE IF EXISTS t{ON} SYNC", f"DROP TABLE IF EXISTS t_local{ON} SYNC"]
    assert cluster_ddl.render("CREATE VIEW pv AS SELECT * FROM src", CLUSTER, DATABASE, sharded) == [
        f"CREATE VIEW pv{ON} AS SELECT * FROM src"]  # reads the Distributed table


@pytest.mark.parametrize("statement", [
    "CREATE MATERIALIZED VIEW v ENGINE = MergeTree ORDER BY a AS SELECT a FROM src",  # no TO
    "CREATE TABLE t ON CLUSTER c (a Int8) ENGINE = MergeTree ORDER BY a",  # names a cluster
    "CREATE TABLE t (a Int8) ENGINE = ReplicatedMergeTree('/p', 'r') ORDER BY a",
    "CREATE TABLE t (a Int8) ENGINE = MergeTree ORDER BY a AS SELECT 1",  # CTAS would run on every replica
    "RENAME TABLE src TO src2",
    "ALTER TABLE v MODIFY QUERY SELECT a FROM src",
])
def test_what_it_cannot_render_it_refuses(statement):
    with pytest.raises(ValueError):
        cluster_ddl.render(statement, CLUSTER, DATABASE, frozenset({"src"}))


# --- the schema works: a one-shard cluster of the embedded engine ---------------------------

SPAN = ("INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, ServiceName, SpanName, SpanAttributes, "
        "Duration, StatusCode, `Events.Timestamp`, `Events.Name`, `Events.Attributes`) VALUES (now64(9), "
        "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 'bbbbbbbbbbbbbbbb', '', 'chat', 'chat gpt-4o', map('gen_ai.operation.name', "
        "'chat', 'gen_ai.request.model', 'gpt-4o', 'gen_ai.usage.input_tokens', '10', 'gen_ai.usage.output_tokens', '5', "
        "'app.outcome', 'ok'), 1000000000, 'STATUS_CODE_OK', [now64(9)], ['gen_ai.evaluation.result'], "
        "[map('gen_ai.evaluation.name', 'relevance', 'gen_ai.evaluation.score.value', '0.9')])")
GAUGE = ("INSERT INTO otel_metrics_gauge (TimeUnix, MetricName, Value, Attributes, ResourceAttributes) VALUES "
         "(now64(9), 'DCGM_FI_DEV_GPU_UTIL', 50, map('Hostname', 'h1', 'UUID', 'GPU-1'), map())")
EVALUATION = ("INSERT INTO evaluations (Timestamp, TraceId, SpanId, Name, ScoreValue, Source) VALUES "
              "(now64(9), 'cccccccccccccccccccccccccccccccc', 'dddddddddddddddd', 'relevance', 1, 'api')")


@pytest.mark.integration
def test_the_schema_runs_and_fills_through_the_distributed_tables(tmp_path):
    migrations = planned(cluster=CLUSTER, database=DATABASE)
    execute: list[Any] = [f"CREATE DATABASE IF NOT EXISTS {DATABASE}", f"USE {DATABASE}",
                          # what migrate() sets on a cluster
                          "SET insert_distributed_sync = 1", "SET parallel_distributed_insert_select = 0"]
    execute += [single_node(s) for s in ledger_ddl(CLUSTER, DATABASE)]
    rebuild: list[str] = []
    for _, statements in migrations:
        execute += [single_node(s) for s in statements]
        rebuild += [single_node(s) for s in statements if "evaluations_local_rebuild" in s
                    or s.startswith("CREATE OR REPLACE TABLE evaluations ")]
        if any(s.startswith("CREATE TABLE IF NOT EXISTS evaluations ") for s in statements):
            execute.append(EVALUATION)  # a row there before a later migration rebuilds the table
    # the Distributed otel_traces routes a span to its shard; what a shard receives from
    # another node's Distributed table arrives in otel_traces_local, and fills the same way
    local_span = SPAN.replace("INTO otel_traces ", "INTO otel_traces_local ").replace("'" + "a" * 32, "'" + "e" * 32)
    execute += [SPAN, local_span, GAUGE, "INSERT INTO servelens_migrations (version, name) VALUES (1, 'x')",
                {"check": "evaluations", "sql": "SELECT count() FROM evaluations"}]
    execute += rebuild  # a rebuild cut short and run again copies the new table onto itself
    # the rollups' six hours and days, filled as analytics.rollup_tiers fills a period: read
    # through the Distributed finer rollups, written through the Distributed tiers
    execute += [t.insert_sql().replace("{lo_s:Int64}", "0").replace("{hi_s:Int64}", "4102444800")
                for t in rollup_tiers.TIERS]
    expected = {t: 2 for t in ("otel_traces", "otel_traces_local", "llm_requests", "llm_requests_local",
                               "trace_outcomes", "stage_spans", "otel_traces_trace_id_ts")}
    expected |= {"gpu_samples": 1, "gpu_util_minutes": 1, "servelens_migrations": 1}
    checks = {t: f"SELECT count() FROM {t}" for t in expected}
    if any("rollup_requests_1m_local" in s for _, ss in migrations for s in ss):
        for rollup in ("rollup_requests_1m", "rollup_requests_1h", "rollup_requests_6h", "rollup_costs_15m", "rollup_costs_6h",
                       "rollup_ingest_1h", "rollup_context_1h", "rollup_context_6h", "rollup_context_1d", "rollup_costs_1d", "rollup_workload_1h",
                       "rollup_workload_1d", "rollup_costs_models_1h", "rollup_context_all_1d"):
            expected[rollup] = 2
            checks[rollup] = f"SELECT sum(Requests) FROM {rollup}"
    if any("rollup_arrivals_1m_local" in s for _, ss in migrations for s in ss):
        expected["rollup_arrivals_1m"] = 2
        checks["rollup_arrivals_1m"] = "SELECT sum(arraySum(Seconds.2)) FROM rollup_arrivals_1m"
    if any("rollup_arrivals_1d_local" in s for _, ss in migrations for s in ss):
        expected["rollup_arrivals_1d"] = 2
        checks["rollup_arrivals_1d"] = "SELECT sum(Arrivals) FROM rollup_arrivals_1d"
    if any("rollup_spans_1h_local" in s for _, ss in migrations for s in ss):
        expected["rollup_spans_1h"] = 2
        checks["rollup_spans_1h"] = "SELECT sum(Spans) FROM rollup_spans_1h"
    checks["evaluations_after_rerun"] = "SELECT count() FROM evaluations"
    checks["request"] = "SELECT Model, InputTokens, OutputTokens FROM llm_requests"
    checks["profile settings"] = ("SELECT name FROM system.settings WHERE name IN "
                                  "('insert_distributed_sync', 'load_balancing', 'optimize_distributed_group_by_sharding_key')")
    out = run_engine(tmp_path, ONE_SHARD, execute=execute, checks=checks)
    assert out["errors"] == []
    got = out["checks"]
    assert {t: got[t][0][0] for t in expected} == expected
    assert got["request"] == [["gpt-4o", 10, 5]] * 2
    # the API row survived the rebuild, beside the two spans' evaluation events
    assert got["evaluations"] == [[3]] == got["evaluations_after_rerun"]
    assert len(got["profile settings"]) == 3  # deploy/cluster's profile names settings that exist


# --- migrate() on a cluster -------------------------------------------------------------------

class RecordingClient:
    """Records what migrate() sends; `done` are the versions the ledger already holds."""

    def __init__(self, done: set[int] = frozenset(), nodes: int = 4) -> None:
        self.done, self.nodes, self.commands, self.inserts = done, nodes, [], []

    def command(self, sql: str, settings: dict | None = None) -> Any:
        self.commands.append((sql, settings))
        if sql.startswith("SELECT count() FROM system.clusters"):
            return self.nodes
        return DATABASE if sql == "SELECT currentDatabase()" else None

    def query(self, sql: str) -> Any:
        return type("Result", (), {"result_rows": [(v,) for v in self.done]})()

    def insert(self, table: str, rows: list, column_names: list, settings: dict | None = None) -> None:
        self.inserts.append((table, rows, settings))


def test_migrate_on_a_cluster_runs_the_rendered_statements():
    client = RecordingClient()
    ran = migrate(client, cluster=CLUSTER)
    assert [m.version for m in ran] == [m.version for m in discover()]
    sent = [sql for sql, _ in client.commands]
    expected = ledger_ddl(CLUSTER, DATABASE) + [s for _, ss in planned(cluster=CLUSTER, database=DATABASE) for s in ss]
    assert sent == [f"SELECT count() FROM system.clusters WHERE cluster = '{CLUSTER}'", "SELECT currentDatabase()",
                    *expected]
    assert sent[2] == f"CREATE DATABASE IF NOT EXISTS `{DATABASE}`{ON}"
    # the ledger row, like every statement, waits for the shards
    sync = {"insert_distributed_sync": 1, "parallel_distributed_insert_select": 0}
    assert all(s == sync for sql, s in client.commands[2 + len(ledger_ddl(CLUSTER, DATABASE)):])
    assert client.inserts[0][0] == "servelens_migrations" and client.inserts[0][2] == sync

    up_to_date = RecordingClient(done={m.version for m in discover()})
    assert migrate(up_to_date, cluster=CLUSTER) == []
    assert len(up_to_date.commands) == 2 + len(ledger_ddl(CLUSTER, DATABASE))


def test_migrate_names_a_cluster_the_server_lacks():
    client = RecordingClient(nodes=0)
    with pytest.raises(ValueError, match="no such cluster"):
        migrate(client, cluster=CLUSTER)
    assert len(client.commands) == 1  # nothing created


def test_migrate_without_a_cluster_sends_what_it_always_did():
    client = RecordingClient()
    migrate(client)
    assert client.commands == [(_LEDGER_DDL, None)] + [(s, None) for m in discover() for s in m.statements()]
    assert all(settings is None for *_, settings in client.inserts)


# --- configuration and CLI --------------------------------------------------------------------

def test_store_cluster_is_a_plain_identifier(tmp_path, monkeypatch):
    assert load(None, data_dir=str(tmp_path)).store.cluster is None
    assert load(None, data_dir=str(tmp_path), store={"cluster": "servelens"}).store.cluster == "servelens"
    with pytest.raises(ConfigError):
        load(None, data_dir=str(tmp_path), store={"cluster": "servelens; DROP TABLE x"})
    monkeypatch.setenv("SERVELENS_STORE__CLUSTER", "prod_2")  # as docker-compose.cluster.yml sets it
    assert load(None, data_dir=str(tmp_path)).store.cluster == "prod_2"


def test_print_ddl_needs_no_store(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SERVELENS_STORE__CLUSTER", CLUSTER)
    data = tmp_path / "data"
    assert main(["migrate", "--print-ddl", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert out == ddl_script(CLUSTER, DATABASE)
    assert f"-- servelens schema for cluster {CLUSTER}, database {DATABASE}" in out
    assert "ENGINE = Distributed('servelens', 'otel', 'llm_requests_local'" in out
    assert not data.exists()


# --- (d) docker-compose.cluster.yml and deploy/cluster ----------------------------------------

def test_cluster_compose_names_four_clickhouse_nodes_and_keeper(tmp_path):
    compose = yaml.safe_load((ROOT / "docker-compose.cluster.yml").read_text())
    services = compose["services"]
    servers = {n: s for n, s in services.items() if s.get("image", "").startswith("clickhouse/clickhouse-server:")}
    keepers = {n: s for n, s in services.items() if s.get("image", "").startswith("clickhouse/clickhouse-keeper:")}
    assert len(servers) == 4 and len(keepers) == 3
    for service in [*servers.values(), *keepers.values()]:
        for volume in service["volumes"]:
            if volume.startswith("./"):
                assert (ROOT / volume.split(":")[0]).is_file(), volume
    for role in ("migrate", "collector", "analytics", "dashboard"):
        env = services[role]["environment"]
        assert env["SERVELENS_STORE__CLUSTER"] == CLUSTER
        assert re.match(r"http://[^@]+@([\w-]+):8123$", env["SERVELENS_CLICKHOUSE_URL"]).group(1) in servers
    assert services["collector"]["command"] == ["collector"]

    config = ET.parse(ROOT / "deploy/cluster/clickhouse/cluster.xml").getroot()
    shards = config.findall(f"remote_servers/{CLUSTER}/shard")
    layout = [[r.findtext("host") for r in shard.findall("replica")] for shard in shards]
    assert len(layout) == 2 and all(len(replicas) == 2 for replicas in layout)
    assert sorted(h for replicas in layout for h in replicas) == sorted(servers)
    assert all(shard.findtext("internal_replication") == "true" for shard in shards)
    for number, replicas in enumerate(layout, 1):
        for host in replicas:  # each node's macros say where remote_servers puts it
            env = servers[host]["environment"]
            assert int(env["SHARD"]) == number and env["REPLICA"] == host == servers[host]["hostname"]
    assert {m.tag for m in config.find("macros")} == {"shard", "replica", "cluster"}
    assert sorted(n.findtext("host") for n in config.findall("zookeeper/node")) == sorted(keepers)
    keeper = ET.parse(ROOT / "deploy/cluster/keeper/keeper.xml").getroot()
    assert sorted(s.findtext("hostname") for s in keeper.findall("keeper_server/raft_configuration/server")) == sorted(keepers)
    assert sorted(k["environment"]["KEEPER_SERVER_ID"] for k in keepers.values()) == ["1", "2", "3"]


@pytest.mark.integration
def test_clickhouse_reads_the_cluster_config(tmp_path):
    """ClickHouse's own config loader (the embedded engine's) on deploy/cluster's file."""
    env = {**os.environ, "SHARD": "02", "REPLICA": "clickhouse-s2-r1"}
    out = run_engine(tmp_path, (ROOT / "deploy/cluster/clickhouse/cluster.xml").read_text(), env=env, checks={
        "macros": "SELECT macro, substitution FROM system.macros ORDER BY macro",
        "cluster": f"SELECT shard_num, replica_num, host_name FROM system.clusters WHERE cluster = '{CLUSTER}'"})
    assert out["checks"]["macros"] == [["cluster", CLUSTER], ["replica", "clickhouse-s2-r1"], ["shard", "02"]]
    assert out["checks"]["cluster"] == [[1, 1, "clickhouse-s1-r1"], [1, 2, "clickhouse-s1-r2"],
                                        [2, 1, "clickhouse-s2-r1"], [2, 2, "clickhouse-s2-r2"]]
