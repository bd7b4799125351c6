"""The migrations rendered for a ClickHouse cluster (store.cluster, SPEC 1a).

migrations/NNNN_*.sql are written for one server (or the embedded chDB) and stay the one
source of the schema: on a cluster each statement is rewritten here, one at a time, by
reading its tokens (strings, quoted names and comments are never mistaken for SQL).
`servelens migrate --print-ddl` shows the result for review.

- CREATE TABLE x (...) ENGINE = <Family>MergeTree(args) becomes two tables, ON CLUSTER:
    x_local  Replicated<Family>MergeTree('/clickhouse/tables/{shard}/{database}/x_local',
             '{replica}', args): the rows, one copy on each replica of a shard;
    x        AS x_local ENGINE = Distributed(cluster, database, x_local, <sharding key>):
             stores nothing; a read fans out to every shard, an insert is split by the key.
  Readers and writers keep using the plain names, so nothing else changes. Tables of
  other engines (Null, Memory, ...) are created as written, on every node.
- Sharding key (sharding_key()): a hash, never rand() while the table has a key, so a
  replayed batch (same insert_deduplication_token) splits across shards exactly as the
  first time and each shard drops its part of it as a duplicate, and rows that merge
  (Replacing/Aggregating/Summing: same ORDER BY key) or claim a lease by token
  (analytics_leases) meet on one shard. Tables with a TraceId column hash the trace id:
  a trace's spans, and the requests, stages and evaluations derived from them, live on
  one shard; rows without one (logs outside a trace) spread by the table's key instead of
  piling onto the shard of ''.
- CREATE MATERIALIZED VIEW v TO t AS SELECT ... FROM s: a view fires on inserts into the
  table it reads first. If that is a sharded table, the view reads s_local and writes
  t_local, on every node, so an insert that the Distributed s routes to a shard fills
  that shard's typed tables (spans -> llm_requests -> rollups, all shard-local). Other
  sharded tables the view reads become their _local tables too (shard-local joins), each
  aliased to its plain name so `s.Column` references still resolve. A view whose first
  table is not sharded (otlp_traces_in, a Null table the collector inserts protobuf into)
  writes into the Distributed t, so its rows are sharded like any other insert. A view
  without TO is refused: its hidden inner table could not be replicated and sharded.
- CREATE VIEW (plain): ON CLUSTER, as written: it reads the Distributed tables.
- ALTER TABLE x: applied to x_local ON CLUSTER; column changes (ADD/DROP/MODIFY/RENAME/
  COMMENT COLUMN) to the Distributed x too, which must list the same columns. MODIFY QUERY
  is refused (a view's query would need the rewrite above).
- non_replicated_deduplication_window = N (a setting, or ALTER ... MODIFY SETTING)
  means nothing to a Replicated table, which deduplicates in Keeper by
  replicated_deduplication_window: it becomes replicated_deduplication_window = N, plus
  replicated_deduplication_window_seconds = a week, as the non-replicated window (bounded
  by count only) would still recognise a batch the spool replays after a long outage.
- CREATE OR REPLACE TABLE x (...) ENGINE ... [AS SELECT ...] (a table rebuilt): ON
  CLUSTER its SELECT would run on every replica and copy each row once per replica, so the
  new table is built beside the old one (x_local_rebuild, a Keeper path of its own),
  filled once through the cluster, swapped in with EXCHANGE TABLES, the old one dropped,
  and the Distributed x recreated over the new columns. Safe to rerun like the original.
- DROP TABLE|VIEW: ON CLUSTER; a sharded table drops its Distributed table, then x_local.
- INSERT: as written, once, on the node migrate() is connected to: it writes (and
  reads) the Distributed tables, so a backfill covers every shard (migrate() turns off
  parallel_distributed_insert_select, which would rewrite it onto the _local tables).
- Anything else, and a statement that names a cluster itself, raises ValueError: teach
  this module its kind rather than let a migration run half-clustered.

Rows a view writes stay on the shard of the row that fired it, wherever the target's own
sharding key would have put them; the cluster profile (deploy/cluster) therefore turns
off optimize_distributed_group_by_sharding_key, which assumes every row follows the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

LOCAL = "_local"
REBUILD = "_rebuild"  # x_local_rebuild: where CREATE OR REPLACE builds the new x_local
REPLICA_PATH = "/clickhouse/tables/{shard}/{database}/"
# A replayed batch must still be recognised after an outage of up to this long.
DEDUP_WINDOW_SECONDS = 7 * 24 * 3600

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>--[^\n]*|\#[^\n]*|/\*.*?\*/)
  | (?P<string>'(?:[^'\\]|\\.|'')*')
  | (?P<quoted>`(?:[^`\\]|\\.|``)*`|"(?:[^"\\]|\\.|"")*")
  | (?P<number>\d[\w.]*)
  | (?P<word>[A-Za-z_][\w$]*)
  | (?P<punct>.)
""", re.X | re.S)

# Words that can follow a table in FROM without being its alias.
_NOT_ALIAS = frozenset("""
    WHERE PREWHERE GROUP ORDER LIMIT OFFSET HAVING WINDOW QUALIFY SETTINGS FORMAT UNION
    EXCEPT INTERSECT ARRAY LEFT RIGHT INNER OUTER FULL CROSS JOIN ANY ALL SEMI ANTI ASOF
    GLOBAL PASTE ON USING FINAL SAMPLE INTO
""".split())
# CREATE TABLE clauses after ENGINE, each (first word, second word or "").
_TABLE_CLAUSES = (("PARTITION", "BY"), ("ORDER", "BY"), ("PRIMARY", "KEY"), ("SAMPLE", "BY"),
                  ("TTL", ""), ("SETTINGS", ""), ("COMMENT", ""), ("AS", ""))
_COLUMN_COMMANDS = frozenset({"ADD", "DROP", "MODIFY", "RENAME", "COMMENT"})


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    start: int
    end: int

    @property
    def word(self) -> str:
        return self.text.upper() if self.kind == "word" else ""

    @property
    def is_name(self) -> bool:
        return self.kind in ("word", "quoted")

    @property
    def name(self) -> str:
        """The identifier itself: `my table` -> my table."""
        return self.text[1:-1] if self.kind == "quoted" else self.text


class _Sql:
    """One statement's significant tokens (no spaces or comments), and edits to its text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = [_Token(m.lastgroup or "", m.group(), m.start(), m.end())
                       for m in _TOKEN.finditer(text) if m.lastgroup not in ("space", "comment")]
        self.edits: list[tuple[int, int, str]] = []

    def word(self, i: int) -> str:
        return self.tokens[i].word if 0 <= i < len(self.tokens) else ""

    def punct(self, i: int) -> str:
        return self.tokens[i].text if 0 <= i < len(self.tokens) and self.tokens[i].kind == "punct" else ""

    def closing(self, i: int) -> int:
        """The index of the ')' that closes the '(' at i."""
        depth = 0
        for j in range(i, len(self.tokens)):
            depth += {"(": 1, ")": -1}.get(self.punct(j), 0)
            if depth == 0:
                return j
        raise ValueError(f"unbalanced parentheses in: {self.text[:80]}")

    def top_level(self, start: int, stop: int | None = None) -> Iterable[int]:
        """Indices in [start, stop) outside any parentheses opened in that range."""
        depth = 0
        for j in range(start, len(self.tokens) if stop is None else stop):
            p = self.punct(j)
            if p == ")":
                depth -= 1
            if depth == 0:
                yield j
            if p == "(":
                depth += 1

    def split(self, start: int, stop: int) -> list[tuple[int, int]]:
        """[start, stop) cut at its top-level commas, as (first, stop) index pairs."""
        parts, first = [], start
        for j in self.top_level(start, stop):
            if self.punct(j) == ",":
                parts.append((first, j))
                first = j + 1
        if first < stop:
            parts.append((first, stop))
        return parts

    def source(self, first: int, stop: int) -> str:
        """The original text of tokens [first, stop), comments inside included."""
        return self.text[self.tokens[first].start:self.tokens[stop - 1].end] if first < stop else ""

    def flat(self, first: int, stop: int) -> str:
        """Tokens [first, stop) on one line: comments dropped, spacing as written."""
        out = ""
        for j in range(first, stop):
            if j > first and self.tokens[j].start > self.tokens[j - 1].end:
                out += " "
            out += self.tokens[j].text
        return out

    def name_at(self, i: int) -> tuple[int, int]:
        """A [db.]name starting at i: (index of the table's own token, index after it)."""
        if not self.tokens[i].is_name:
            raise ValueError(f"expected a name at {self.tokens[i].text!r} in: {self.text[:80]}")
        if self.punct(i + 1) == "." and i + 2 < len(self.tokens) and self.tokens[i + 2].is_name:
            return i + 2, i + 3
        return i, i + 1

    def replace(self, i: int, text: str) -> None:
        self.edits.append((self.tokens[i].start, self.tokens[i].end, text))

    def insert_after(self, i: int, text: str) -> None:
        self.edits.append((self.tokens[i].end, self.tokens[i].end, text))

    def rendered(self) -> str:
        out, at = [], 0
        for start, end, text in sorted(self.edits, key=lambda e: (e[0], e[1])):
            out += [self.text[at:start], text]
            at = end
        return "".join(out) + self.text[at:]


def render(statement: str, cluster: str | None, database: str,
           sharded: frozenset[str] = frozenset()) -> list[str]:
    """The statements that stand for `statement` on `cluster` (None: [statement] as it is).

    `sharded`: the tables earlier statements made x_local + Distributed x (render_all
    keeps track), which views and ALTERs must know to reach the _local tables.
    """
    if cluster is None:
        return [statement]
    return _render(statement, cluster, database, sharded)[0]


def render_all(migrations: Iterable[Iterable[str]], cluster: str, database: str) -> list[list[str]]:
    """Each migration's statements rendered, in order; the result has one list per migration."""
    sharded: frozenset[str] = frozenset()
    out = []
    for statements in migrations:
        rendered: list[str] = []
        for statement in statements:
            more, sharded = _render(statement, cluster, database, sharded)
            rendered += more
        out.append(rendered)
    return out


def create_database(cluster: str, database: str) -> str:
    """The database on every node (the store's client creates it only on the one it reaches)."""
    _check_cluster(cluster)
    return f"CREATE DATABASE IF NOT EXISTS `{database}` ON CLUSTER {cluster}"


def sharding_key(columns: Iterable[str], key: list[str]) -> str:
    """The Distributed table's sharding expression (module docstring: why these)."""
    hashed = f"cityHash64({', '.join(key)})" if key else "rand()"
    if "TraceId" in columns and key != ["TraceId"]:
        return f"if(TraceId = '', {hashed}, cityHash64(TraceId))"
    return hashed


def _check_cluster(cluster: str) -> None:
    if not _IDENTIFIER.match(cluster):
        raise ValueError(f"cluster name must be a plain identifier: {cluster!r}")


def _render(statement: str, cluster: str, database: str,
            sharded: frozenset[str]) -> tuple[list[str], frozenset[str]]:
    _check_cluster(cluster)
    sql = _Sql(statement)
    if not sql.tokens:
        return [statement], sharded
    for j in sql.top_level(0):
        if sql.word(j) == "ON" and sql.word(j + 1) == "CLUSTER":
            raise ValueError(f"migrations name no cluster (it is store.cluster's): {statement[:80]}")
    words = [sql.word(j) for j in range(4)]
    head = " ".join(w for w in words if w)
    r = _Renderer(sql, cluster, database, sharded)
    if words[0] == "INSERT":
        return [statement], sharded
    if words[0] == "CREATE":
        kind_at = 1 + (words[1:3] == ["OR", "REPLACE"]) * 2
        kind = sql.word(kind_at)
        if kind == "TABLE":
            return r.create_table(kind_at + 1)
        if kind == "MATERIALIZED" and sql.word(kind_at + 1) == "VIEW":
            return r.create_materialized_view(kind_at + 2), sharded
        if kind == "VIEW":
            return r.create_view(kind_at + 1), sharded
    if words[0] == "ALTER" and words[1] == "TABLE":
        return r.alter_table(2), sharded
    if words[0] == "DROP" and words[1] in ("TABLE", "VIEW", "DICTIONARY"):
        return r.drop(2)
    raise ValueError(f"no cluster rendering for {head!r} statements (core/cluster_ddl.py): {statement[:80]}")


class _Renderer:
    """One statement's rendering; each method takes the index just past its kind's words."""

    def __init__(self, sql: _Sql, cluster: str, database: str, sharded: frozenset[str]) -> None:
        self.sql, self.cluster, self.database, self.sharded = sql, cluster, database, sharded
        self.on_cluster = f" ON CLUSTER {cluster}"

    def _skip_if(self, i: int, *words: str) -> int:
        """Past an IF [NOT] EXISTS at i."""
        n = len(words)
        return i + n if [self.sql.word(i + k) for k in range(n)] == list(words) else i

    def _local(self, i: int, suffix: str = LOCAL) -> str:
        """The text of the name token at i with _local (or `suffix`) appended, quoting kept."""
        t = self.sql.tokens[i]
        return t.text[:-1] + suffix + t.text[-1] if t.kind == "quoted" else t.text + suffix

    def create_table(self, i: int) -> tuple[list[str], frozenset[str]]:
        sql = self.sql
        name_at, i = sql.name_at(self._skip_if(i, "IF", "NOT", "EXISTS"))
        name = sql.tokens[name_at].name
        if sql.punct(i) != "(":
            raise ValueError(f"CREATE TABLE without a column list has no cluster rendering: {sql.text[:80]}")
        columns_end = sql.closing(i)
        columns = [sql.tokens[a].name for a, _ in sql.split(i + 1, columns_end)
                   if sql.word(a) not in ("INDEX", "PROJECTION", "CONSTRAINT")]
        engine_at = next((j for j in sql.top_level(columns_end + 1) if sql.word(j) == "ENGINE"), None)
        if engine_at is None:
            raise ValueError(f"CREATE TABLE without ENGINE has no cluster rendering: {sql.text[:80]}")
        family_at = engine_at + 1 + (sql.punct(engine_at + 1) == "=")
        family = sql.tokens[family_at].text
        sql.insert_after(name_at, self.on_cluster)
        if not family.endswith("MergeTree"):
            return [sql.rendered()], self.sharded - {name}
        if family.startswith(("Replicated", "Shared")):
            raise ValueError(f"migrations create plain MergeTree tables; cluster_ddl replicates them: {sql.text[:80]}")

        rebuild = sql.word(1) == "OR"  # CREATE OR REPLACE TABLE
        if rebuild and name not in self.sharded:
            raise ValueError(f"CREATE OR REPLACE of a table no earlier migration created: {sql.text[:80]}")
        clauses = self._clauses(family_at + 1)
        select = None
        if "AS" in clauses:
            if not rebuild:
                raise ValueError(f"CREATE TABLE ... AS SELECT has no cluster rendering: {sql.text[:80]}")
            select = sql.text[sql.tokens[clauses["AS"][0]].start:]
            sql.edits.append((sql.tokens[clauses["AS"][0] - 2].end, len(sql.text), ""))
        local = self._local(name_at)
        # A rebuild's table gets a Keeper path of its own ({uuid}: one per incarnation, the
        # same on every replica of an ON CLUSTER query), as the table it replaces keeps its own.
        path = f"{REPLICA_PATH}{name}{LOCAL}" + ("_{uuid}" if rebuild else "")
        sql.replace(name_at, self._local(name_at, LOCAL + REBUILD) if rebuild else local)
        replication = f"'{path}', '{{replica}}'"
        if sql.punct(family_at + 1) == "(":
            args_end = sql.closing(family_at + 1)
            args = sql.source(family_at + 2, args_end)
            sql.edits.append((sql.tokens[family_at].start, sql.tokens[args_end].end,
                              f"Replicated{family}({replication}{', ' + args if args else ''})"))
        else:
            sql.replace(family_at, f"Replicated{family}({replication})")
        if "SETTINGS" in clauses:
            first, stop = clauses["SETTINGS"]
            items = [sql.flat(a, b) for a, b in sql.split(first, stop)]
            if _replicated_settings(items) != items:
                sql.edits.append((sql.tokens[first].start, sql.tokens[stop - 1].end,
                                  ", ".join(_replicated_settings(items))))
        key = sharding_key(columns, self._key(clauses.get("ORDER BY") or clauses.get("PRIMARY KEY")))
        prefix_end = name_at - 2 if sql.punct(name_at - 1) == "." else name_at
        distributed = self._distributed(sql.source(0, prefix_end), name_at, local, key)
        if not rebuild:
            return [sql.rendered(), distributed], self.sharded | {name}
        # CREATE OR REPLACE ... AS SELECT ON CLUSTER would run its SELECT on every replica
        # and insert each row once per replica: build the new table beside the old one, copy
        # once through the cluster, swap. A rerun (cut short) first drops what an earlier
        # try left beside: a partial copy, or the old table once the swap was done.
        sql.edits.append((sql.tokens[1].start, sql.tokens[3].start, ""))  # OR REPLACE: the staging table is new
        staging = self._qualifier(name_at) + self._local(name_at, LOCAL + REBUILD)
        statements = [f"DROP TABLE IF EXISTS {staging}{self.on_cluster} SYNC", sql.rendered()]
        if select is not None:
            statements.append(f"INSERT INTO FUNCTION cluster({_literal(self.cluster)}, "
                              f"{_literal(self._database(name_at))}, {_literal(name + LOCAL + REBUILD)}, {key})\n"
                              f"{select}")
        statements += [f"EXCHANGE TABLES {self._qualifier(name_at)}{local} AND {staging}{self.on_cluster}",
                       f"DROP TABLE {staging}{self.on_cluster} SYNC",
                       distributed]  # CREATE OR REPLACE: the Distributed table takes the new columns
        return statements, self.sharded

    def _clauses(self, start: int) -> dict[str, tuple[int, int]]:
        """The clauses after ENGINE's name: 'ORDER BY' -> (first, stop) of its expression."""
        sql, found = self.sql, []
        for j in sql.top_level(start):
            for first, second in _TABLE_CLAUSES:
                if sql.word(j) == first and (not second or sql.word(j + 1) == second):
                    found.append((f"{first} {second}".strip(), j, j + 1 + bool(second)))
        bounds = {}
        for k, (label, _, body) in enumerate(found):
            stop = found[k + 1][1] if k + 1 < len(found) else len(sql.tokens)
            bounds[label] = (body, stop)
        return bounds

    def _key(self, span: tuple[int, int] | None) -> list[str]:
        """A sorting key's expressions: (a, b) -> ['a', 'b']; tuple() or none -> []."""
        if span is None:
            return []
        sql, (first, stop) = self.sql, span
        if sql.punct(first) == "(" and sql.closing(first) == stop - 1:
            first, stop = first + 1, stop - 1
        elif sql.word(first) == "TUPLE" and sql.punct(first + 1) == "(" and sql.closing(first + 1) == stop - 1:
            first, stop = first + 2, stop - 1
        parts = []
        for a, b in sql.split(first, stop):
            while b - 1 > a and sql.word(b - 1) in ("ASC", "DESC"):
                b -= 1
            parts.append(sql.flat(a, b))
        return parts

    def _qualifier(self, name_at: int) -> str:
        """'db.' when the name at name_at is qualified, else ''."""
        return self.sql.source(name_at - 2, name_at) if self.sql.punct(name_at - 1) == "." else ""

    def _database(self, name_at: int) -> str:
        return self.sql.tokens[name_at - 2].name if self._qualifier(name_at) else self.database

    def _distributed(self, prefix: str, name_at: int, local: str, key: str) -> str:
        sql, qualifier = self.sql, self._qualifier(name_at)
        return (f"{prefix} {qualifier}{sql.tokens[name_at].text}{self.on_cluster} AS {qualifier}{local}\n"
                f"ENGINE = Distributed({_literal(self.cluster)}, {_literal(self._database(name_at))}, "
                f"{_literal(sql.tokens[name_at].name + LOCAL)}, {key})")

    def create_materialized_view(self, i: int) -> list[str]:
        sql = self.sql
        name_at, i = sql.name_at(self._skip_if(i, "IF", "NOT", "EXISTS"))
        sql.insert_after(name_at, self.on_cluster)
        if sql.word(i) != "TO":
            raise ValueError("a materialized view needs TO <table> on a cluster (its inner table "
                             f"could not be replicated and sharded): {sql.text[:80]}")
        target_at, i = sql.name_at(i + 1)
        body = next((j for j in sql.top_level(i) if sql.word(j) == "AS"), None)
        if body is None or any(sql.word(j) == "POPULATE" for j in sql.top_level(i, body)):
            raise ValueError(f"no cluster rendering for this materialized view: {sql.text[:80]}")
        tables = self._tables(body + 1)
        if tables and sql.tokens[tables[0]].name in self.sharded:
            if sql.tokens[target_at].name in self.sharded:
                sql.replace(target_at, self._local(target_at))
            for t in tables:
                if sql.tokens[t].name in self.sharded:
                    self._read_local(t)
        return [sql.rendered()]

    def _tables(self, start: int) -> list[int]:
        """Indices of the table names a SELECT reads (FROM / JOIN, subqueries included), in order."""
        sql, found = self.sql, []
        in_query = [True]  # per open parenthesis: a subquery (True) or an expression
        for j in range(start, len(sql.tokens)):
            p = sql.punct(j)
            if p == "(":
                in_query.append(sql.word(j + 1) in ("SELECT", "WITH"))
            elif p == ")" and len(in_query) > 1:
                in_query.pop()
            # FROM inside an expression is EXTRACT(... FROM x) or the like; ARRAY JOIN joins a column
            elif (sql.word(j) == "FROM" or (sql.word(j) == "JOIN" and sql.word(j - 1) != "ARRAY")) and in_query[-1]:
                if j + 1 < len(sql.tokens) and sql.tokens[j + 1].is_name and sql.word(j + 1) not in ("SELECT", "WITH"):
                    table_at, after = sql.name_at(j + 1)
                    if sql.punct(after) != "(":  # not a table function
                        found.append(table_at)
        return found

    def _read_local(self, t: int) -> None:
        """FROM x -> FROM x_local AS x: `x.Column` references keep resolving."""
        sql = self.sql
        sql.replace(t, self._local(t))
        nxt = t + 1
        aliased = sql.word(nxt) == "AS" or (nxt < len(sql.tokens) and sql.tokens[nxt].is_name
                                           and sql.word(nxt) not in _NOT_ALIAS)
        if not aliased:
            sql.insert_after(t, f" AS {sql.tokens[t].text}")

    def create_view(self, i: int) -> list[str]:
        name_at, _ = self.sql.name_at(self._skip_if(i, "IF", "NOT", "EXISTS"))
        self.sql.insert_after(name_at, self.on_cluster)
        return [self.sql.rendered()]

    def alter_table(self, i: int) -> list[str]:
        sql = self.sql
        name_at, i = sql.name_at(i)
        commands = sql.split(i, len(sql.tokens))
        for a, _ in commands:
            if sql.word(a) == "MODIFY" and sql.word(a + 1) == "QUERY":
                raise ValueError(f"ALTER ... MODIFY QUERY has no cluster rendering: {sql.text[:80]}")
        if sql.tokens[name_at].name not in self.sharded:
            sql.insert_after(name_at, self.on_cluster)
            return [sql.rendered()]
        head = sql.text[:sql.tokens[name_at].start] + self._local(name_at) + self.on_cluster
        local_commands = []
        for a, b in commands:
            if sql.word(a) == "MODIFY" and sql.word(a + 1) == "SETTING":
                items = [sql.flat(x, y) for x, y in sql.split(a + 2, b)]
                local_commands.append("MODIFY SETTING " + ", ".join(_replicated_settings(items)))
            else:
                local_commands.append(sql.source(a, b))
        column = [sql.source(a, b) for a, b in commands
                  if sql.word(a) in _COLUMN_COMMANDS and sql.word(a + 1) == "COLUMN"]
        statements = [f"{head}\n    " + ",\n    ".join(local_commands)]
        if column:
            distributed = (sql.source(0, name_at + 1) + self.on_cluster + "\n    " + ",\n    ".join(column))
            # the Distributed table never names a column its local tables lack
            only_drops = all(sql.word(a) == "DROP" for a, _ in commands)
            statements.insert(0 if only_drops else 1, distributed)
        return statements

    def drop(self, i: int) -> tuple[list[str], frozenset[str]]:
        sql = self.sql
        name_at, _ = sql.name_at(self._skip_if(i, "IF", "EXISTS"))
        name = sql.tokens[name_at].name
        sql.insert_after(name_at, self.on_cluster)
        distributed = sql.rendered()
        if name not in self.sharded or sql.word(1) != "TABLE":
            return [distributed], self.sharded
        sql.replace(name_at, self._local(name_at))
        return [distributed, sql.rendered()], self.sharded - {name}


def _replicated_settings(items: list[str]) -> list[str]:
    """'non_replicated_deduplication_window = N' -> its Replicated counterparts (docstring)."""
    out = []
    for item in items:
        setting, _, value = item.partition("=")
        if setting.strip() == "non_replicated_deduplication_window":
            out += [f"replicated_deduplication_window = {value.strip()}",
                    f"replicated_deduplication_window_seconds = {DEDUP_WINDOW_SECONDS}"]
        else:
            out.append(item)
    return out


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
