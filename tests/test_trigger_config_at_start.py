"""A bad key under `triggers:` fails the commands that evaluate triggers at start, naming the
key, although each kind's section is declared by its detector module (analytics/triggers),
which the configuration loader itself does not import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml


def _run(tmp_path: Path, config: dict, *command: str) -> subprocess.CompletedProcess:
    path = tmp_path / "servelens.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([sys.executable, "-m", "servelens", *command, "--config", str(path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_a_misspelt_field_or_kind_stops_the_triggers_command(tmp_path: Path) -> None:
    for bad, named in (({"p99_drift": {"min_requets": 5}}, "triggers.p99_drift.min_requets"),
                       ({"p99_drfit": {"min_requests": 5}}, "triggers.p99_drfit")):
        done = _run(tmp_path, {"store": {"clickhouse_url": f"chdb://{tmp_path / 'data'}"}, "triggers": bad},
                    "triggers", "replays")
        assert done.returncode == 2, done.stderr
        assert named in done.stderr
        assert not (tmp_path / "data").exists()  # refused before the store was opened


def test_a_good_kind_section_loads(tmp_path: Path) -> None:
    done = _run(tmp_path, {"store": {"clickhouse_url": f"chdb://{tmp_path / 'data'}"},
                           "triggers": {"p99_drift": {"min_requests": 50}}}, "triggers", "replays")
    assert done.returncode == 0, done.stderr
