"""A command that only reads the store (`servelens report`, `plan`) on a store servelens
never migrated, or migrated by an older version: a clear error naming what to run, not a
traceback from a missing table. The real embedded engine, a database of the test's own."""

from __future__ import annotations

import pytest

from servelens.app import cli
from servelens.app.runtime import open_store
from servelens.core.config import ConfigError
from servelens.core.migrate import discover
from servelens.core.store import Store

pytestmark = pytest.mark.integration


def test_a_read_only_command_names_what_to_run_on_an_unready_store(settings, capsys, tmp_path) -> None:
    url = settings.store_url
    config = tmp_path / "servelens.yaml"
    config.write_text(f"clickhouse_url: {url}\nstore:\n  database: {settings.store.database}\n")
    try:
        with pytest.raises(ConfigError, match=r"holds no servelens schema: run `servelens migrate`"):
            open_store(settings, migrate_schema=False)
        args = ["report", "overview", "--config", str(config), "--format", "json"]
        assert cli.main(args) == 2
        assert "holds no servelens schema" in capsys.readouterr().err

        open_store(settings).close()  # migrates
        assert cli.main(args) == 0
        assert "requests" in capsys.readouterr().out

        last = discover()[-1]
        writer = Store(url, settings.store.database)
        writer.client().command(f"DELETE FROM servelens_migrations WHERE version = {last.version}")
        writer.close()
        with pytest.raises(ConfigError, match=rf"lacks 1 of this version's migrations \(the first: {last.version:04d}_"):
            open_store(settings, migrate_schema=False)
    finally:
        s = Store(url, settings.store.database)
        s.client().command(f"DROP DATABASE IF EXISTS `{settings.store.database}`")
        s.close()
