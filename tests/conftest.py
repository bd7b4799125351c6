"""Shared fixtures: the real embedded ClickHouse, real receivers on 127.0.0.1.

chDB admits one data directory per process, so the whole session shares one engine
directory and every test gets a database of its own (isolation without a second engine).
A test's database is handed to a later test emptied, when its schema is still the migrated
one (_Databases): migrating a database costs 2-3 s, emptying one ~30 ms.
"""

from __future__ import annotations

import functools
import os
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from servelens.collector.service import Collector
from servelens.core.config import Settings, load
from servelens.core.migrate import discover, migrate
from servelens.core.store import Store


@pytest.fixture(scope="session")
def engine_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chdb")


# Engines whose tables hold no rows of their own (TRUNCATE refuses or ignores them).
_ROWLESS = ("MaterializedView", "View", "Null", "Distributed", "Dictionary")


class _Databases:
    """Migrated databases passed from test to test in one worker's engine. When a test ends,
    its database is handed on only if its schema is exactly the migrated one (every table,
    view, setting and constraint, read back from system.tables); then every table but the
    migration ledger is truncated, which also clears the insert deduplication logs, so the
    next test starts from empty tables as a fresh migration would leave them. Any other
    database (a test that detached, dropped or altered something, or never migrated) is
    dropped as before."""

    MAX_PARTS = 1000

    def __init__(self, engine_dir: Path) -> None:
        self.url = f"chdb://{engine_dir}"
        self.free: list[str] = []
        self.migrated: int | None = None  # the schema fingerprint of a fresh migration
        self._admin: Store | None = None

    def _client(self):
        if self._admin is None:
            self._admin = Store(self.url, "default")
        return self._admin.client()

    def take(self) -> str:
        return self.free.pop() if self.free else self.fresh()

    @staticmethod
    def fresh() -> str:
        return f"t_{uuid.uuid4().hex[:12]}"

    @staticmethod
    def _schema(client, database: str) -> int | None:
        # create_table_query names the database; the fingerprint must not
        return client.command(
            "SELECT if(count() = 0, 0, cityHash64(groupArray((name, engine, "
            "replaceAll(create_table_query, {db:String} || '.', ''))))) "
            "FROM (SELECT * FROM system.tables WHERE database = {db:String} ORDER BY name)",
            parameters={"db": database}) or None

    def learn(self, store: Store) -> None:
        """The schema of a database migrated from nothing just now."""
        if self.migrated is None:
            self.migrated = self._schema(store.client(), store.database)

    def give_back(self, database: str) -> None:
        client = self._client()
        schema = self._schema(client, database)
        if schema is None:
            return  # never created
        # Truncating costs per part: a database of many day-partitions is quicker dropped.
        parts = client.command("SELECT count() FROM system.parts WHERE database = {db:String} AND active",
                               parameters={"db": database})
        if schema != self.migrated or parts > self.MAX_PARTS:
            client.command(f"DROP DATABASE IF EXISTS `{database}`")
            return
        tables = client.query(
            "SELECT name FROM system.tables WHERE database = {db:String} AND engine NOT IN {rowless:Array(String)} "
            "AND name != 'servelens_migrations'", parameters={"db": database, "rowless": list(_ROWLESS)}).result_rows
        for (table,) in tables:
            client.command(f"TRUNCATE TABLE `{database}`.`{table}`")
        self.free.append(database)


@pytest.fixture(scope="session")
def databases(engine_dir: Path) -> _Databases:
    return _Databases(engine_dir)


# SERVELENS_TEST_AUTH=1 runs the suites with access control on: every test's settings hold an
# admin user (so the dashboard and API ask who is calling), and every dashboard app a test
# builds has an admin token put on each request that carries no credentials of its own
# (as a signed-in client would send it). The access layer itself runs whole.
TEST_AUTH = os.environ.get("SERVELENS_TEST_AUTH") == "1"


@functools.lru_cache(maxsize=1)
def _suite_admin() -> dict:
    from servelens.core.auth.passwords import hash_password

    return {"name": "suite-admin", "password_hash": hash_password("the suite's admin"), "role": "admin"}


@pytest.fixture(autouse=True)
def _signed_in_dashboards(monkeypatch: pytest.MonkeyPatch) -> None:
    if not TEST_AUTH:
        return
    from servelens.dashboard.access import Access

    install = Access.install

    def install_signed_in(self: Access, server) -> None:
        install(self, server)
        if self.credentials.store is None:  # an app built only to import its pages
            return
        raw, _ = self.credentials.create_token("suite", "admin")
        inner = server.wsgi_app

        def with_token(environ, start_response):
            if "HTTP_AUTHORIZATION" not in environ and "HTTP_COOKIE" not in environ:
                environ["HTTP_AUTHORIZATION"] = f"Bearer {raw}"
            return inner(environ, start_response)

        server.wsgi_app = with_token

    monkeypatch.setattr(Access, "install", install_signed_in)


# In-process tests read what they sent right after its 200: the collector's committed mode
# with the reference (Python) mapping. The defaults (write-ahead, engine mapping) are tested
# where a test names them, and wherever a test runs `servelens` itself.
READ_AFTER_WRITE = {"acknowledge": "stored", "trace_mapping": "python"}


@pytest.fixture
def make_settings(engine_dir: Path, tmp_path: Path, databases: _Databases, request: pytest.FixtureRequest):
    """Settings for a test: own database, ports 0, data dir under tmp; overrides as kwargs
    (`collector=` settings are merged over READ_AFTER_WRITE). A test that uses the `store`
    fixture may get a migrated database handed on (emptied); any other test, which may
    migrate its own way (an upgrade, a fresh apply), gets a database that does not exist yet."""
    database = databases.take() if "store" in request.fixturenames else databases.fresh()

    def build(**overrides) -> Settings:
        base = dict(data_dir=str(tmp_path / "data"), clickhouse_url=f"chdb://{engine_dir}",
                    otlp_http_port=0, otlp_grpc_port=0, ui_port=0, store={"database": database})
        collector = {**READ_AFTER_WRITE, **overrides.pop("collector", {})}
        if TEST_AUTH:
            base["auth"] = {"users": [_suite_admin()]}
        base.update(overrides, collector=collector)
        return load(None, **base)

    yield build
    databases.give_back(database)


@pytest.fixture
def settings(make_settings) -> Settings:
    return make_settings()


@pytest.fixture
def store(settings: Settings, databases: _Databases) -> Iterator[Store]:
    """The test's database, migrated (emptied by make_settings when the test ends)."""
    s = Store(settings.store_url, settings.store.database)
    if len(migrate(s.client())) == len(discover()):
        databases.learn(s)
    yield s


class CountingStore:
    """The test's real store, counting the queries (query_arrow) run through it."""

    def __init__(self, store: Store) -> None:
        self.store, self.queries = store, 0

    def client(self) -> Any:
        counter, client = self, self.store.client()

        class Counted:
            def query_arrow(self, *args: Any, **kwargs: Any) -> Any:
                counter.queries += 1
                return client.query_arrow(*args, **kwargs)

            def __getattr__(self, name: str) -> Any:
                return getattr(client, name)

        return Counted()


@pytest.fixture
def counting_store(store: Store) -> CountingStore:
    return CountingStore(store)


@pytest.fixture
def collector(settings: Settings, store: Store) -> Iterator[Collector]:
    c = Collector(settings, store)
    c.start()
    yield c
    c.shutdown()


@pytest.fixture
def otlp_http(collector: Collector) -> str:
    """Base URL of the running OTLP/HTTP receiver, e.g. http://127.0.0.1:43123."""
    return f"http://127.0.0.1:{collector.http.port}"
