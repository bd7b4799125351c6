"""Shared fixtures: the real embedded ClickHouse, real receivers on 127.0.0.1.

chDB admits one data directory per process, so the whole session shares one engine
directory and every test gets a database of its own (isolation without a second engine).
"""

from __future__ import annotations

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
