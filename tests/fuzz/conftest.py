"""A collector shared by a module's tests (one per configuration): the named cases of
test_engine_findings are many and quick, and a collector per case would cost more than
the cases themselves. Built as tests/conftest.py builds one, on the session's engine."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from servelens.collector.service import Collector
from servelens.core.config import Settings, load
from servelens.core.migrate import migrate
from servelens.core.store import Store
from tests.conftest import READ_AFTER_WRITE


@pytest.fixture(scope="module")
def shared_collector(engine_dir: Path, tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[Callable[..., tuple[Collector, Store, Settings]]]:
    """get(**collector settings) -> (collector, store, settings), started once per module."""
    made: dict[str, tuple[Collector, Store, Settings]] = {}

    def get(**collector: Any) -> tuple[Collector, Store, Settings]:
        key = json.dumps(collector, sort_keys=True)
        if key not in made:
            settings = load(None, data_dir=str(tmp_path_factory.mktemp("fuzz") / "data"),
                            clickhouse_url=f"chdb://{engine_dir}", otlp_http_port=0, otlp_grpc_port=0, ui_port=0,
                            store={"database": f"t_{uuid.uuid4().hex[:12]}"},
                            collector={**READ_AFTER_WRITE, **collector})
            store = Store(settings.store_url, settings.store.database)
            migrate(store.client())
            running = Collector(settings, store)
            running.start()
            made[key] = (running, store, settings)
        return made[key]

    yield get
    for running, store, settings in made.values():
        running.shutdown()
        store.client().command(f"DROP DATABASE IF EXISTS `{settings.store.database}`")
