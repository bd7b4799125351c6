"""Shared fixtures: the real embedded ClickHouse, real receivers on 127.0.0.1.

chDB admits one data directory per process, so the whole session shares one engine
directory and every test gets a database of its own (isolation without a second engine).
"""

from __future__ import annotations

import functools
import os
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from servelens.collector.service import Collector
from servelens.core.config import Settings, load
from servelens.core.migrate import migrate
from servelens.core.store import Store


@pytest.fixture(scope="session")
def engine_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chdb")


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
def make_settings(engine_dir: Path, tmp_path: Path):
    """Settings for a test: own database, ports 0, data dir under tmp; overrides as kwargs
    (`collector=` settings are merged over READ_AFTER_WRITE)."""
    database = f"t_{uuid.uuid4().hex[:12]}"

    def build(**overrides) -> Settings:
        base = dict(data_dir=str(tmp_path / "data"), clickhouse_url=f"chdb://{engine_dir}",
                    otlp_http_port=0, otlp_grpc_port=0, ui_port=0, store={"database": database})
        collector = {**READ_AFTER_WRITE, **overrides.pop("collector", {})}
        if TEST_AUTH:
            base["auth"] = {"users": [_suite_admin()]}
        base.update(overrides, collector=collector)
        return load(None, **base)

    return build


@pytest.fixture
def settings(make_settings) -> Settings:
    return make_settings()


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    s = Store(settings.store_url, settings.store.database)
    migrate(s.client())
    yield s
    s.client().command(f"DROP DATABASE IF EXISTS `{settings.store.database}`")


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
