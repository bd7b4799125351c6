"""Trigger kinds register themselves: a new detect_*.py module is found, its config model
becomes `triggers.<kind>` (defaults, validation, YAML and env), and the engine runs it on
the real store. Every kind there was before the registry keeps its keys and defaults."""

from __future__ import annotations

import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pytest

from servelens.analytics.triggers import detectors, engine
from servelens.analytics.triggers.base import DETECTORS, KINDS
from servelens.core.config import TRIGGER_KINDS, ConfigError, Settings

pytestmark = pytest.mark.integration

# Read from core/config.py's TriggersConfig before the kinds' models moved to their modules.
# Keys added since are added here on purpose (queue_wait_growth.resolution,
# quality_under_load.quiet_lookback and quiet_alpha).
FIELDS_BEFORE = {
    "queue_wait_growth": ["alpha", "critical_growth", "min_growth", "min_increase", "min_requests", "min_windows",
                          "points", "resolution", "windows"],
    "p99_drift": ["alpha", "critical_rise", "min_baseline", "min_requests", "min_rise", "p50_tolerance",
                  "recovery_alpha"],
    "quality_regression": ["correct_per", "critical_drop", "fdr", "keys", "min_baseline", "min_drop",
                           "min_evaluations", "pairs", "windows"],
    "new_workload_shape": ["alpha", "dimensions", "grown_ratio", "min_baseline", "min_count", "min_share", "pool_for_share",
                           "rare_share", "shift_alpha", "shift_margin", "shift_min_auc", "shift_min_baseline_minutes",
                           "shift_min_minutes"],
    "retry_storm": ["amplification", "critical_amplification", "min_originals", "min_retries"],
    "error_rate_spike": ["alpha", "critical_rate", "min_baseline", "min_errors", "min_increase", "min_ratio",
                         "min_requests", "pool_for_rate"],
    "fallback_over_budget": ["alpha", "critical_ratio", "min_fallbacks"],
    "cost_anomaly": ["critical_change", "direction", "min_baseline_windows", "min_change", "min_requests",
                     "recent_windows", "z"],
    "budget": ["forecast_after", "recent"],
    "slo_burn": ["alpha", "min_requests", "rules"],
    "model_inconsistency": ["alpha", "critical_share", "min_requests", "min_share", "routes"],
    "quality_under_load": ["bucket", "critical_drop", "fdr", "keys", "lookback", "min_drop", "min_evaluations",
                           "min_load_ratio", "p99_tolerance", "pairs", "quiet_alpha", "quiet_lookback", "windows"],
}
KINDS_BEFORE = {*FIELDS_BEFORE, "low_utilization"}  # low_utilization's keys are flat: triggers.low_utilization*

ECHO = '''
from pydantic import Field

from servelens.analytics.triggers.base import Finding, detector
from servelens.core.config import TriggerKindConfig


class Echo(TriggerKindConfig):
    quiet_below: int = Field(1, ge=1)
    label: str = "echo-api"


@detector("echo", Echo)
def echo(store, settings, at):
    """Fires while the window holds fewer than quiet_below requests."""
    cfg = settings.triggers.echo
    n = store.client().query(
        "SELECT count() FROM llm_requests WHERE Timestamp >= {s:DateTime64(9)} AND Timestamp < {u:DateTime64(9)}",
        parameters={"s": at.since, "u": at.until}).first_row[0]
    return [Finding("echo", {"service": cfg.label}, n < cfg.quiet_below, "warning", f"{n} requests",
                    {"requests": n, "quiet_below": cfg.quiet_below})]
'''


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """A package of its own holding detect_echo.py; the kind is gone again afterwards."""
    name = f"kinds_{tmp_path.name.replace('-', '_')}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "detect_echo.py").write_text(textwrap.dedent(ECHO))
    (root / "helpers.py").write_text("raise AssertionError('only detect_*.py modules are imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root, name
    DETECTORS.pop("echo", None)
    TRIGGER_KINDS.models.pop("echo", None)
    for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[module]


def test_every_kind_keeps_its_keys_and_defaults() -> None:
    assert set(KINDS) == KINDS_BEFORE
    t = Settings().triggers
    assert {k: sorted(type(getattr(t, k)).model_fields) for k in FIELDS_BEFORE} == FIELDS_BEFORE
    assert (t.low_utilization, t.low_utilization_critical, t.low_utilization_min_samples) == (0.30, 0.10, 20)
    assert (t.window, t.baseline, t.pool_windows, t.resolve_after) == (timedelta(hours=1), timedelta(days=7), 6, 2)
    assert t.queue_wait_growth.min_increase == timedelta(milliseconds=5) and t.queue_wait_growth.windows == 6
    assert (t.p99_drift.min_rise, t.p99_drift.alpha, t.p99_drift.min_baseline) == (0.3, 1e-3, 1000)
    assert (t.error_rate_spike.pool_for_rate, t.error_rate_spike.min_errors) == (0.05, 10)
    assert t.quality_regression.fdr == 1e-4 and t.quality_regression.keys[0] == "task_type"
    assert t.quality_regression.correct_per == "deployment"
    assert t.new_workload_shape.min_baseline == 2000 and t.cost_anomaly.direction == "up"
    assert t.budget.forecast_after == 0.1 and t.model_inconsistency.routes == ["region"]
    assert [(r.burn_rate, r.severity) for r in t.slo_burn.rules] == [
        (14.4, "critical"), (6.0, "critical"), (3.0, "warning"), (1.0, "warning")]
    assert t.quality_under_load.bucket == timedelta(minutes=15)


def test_kind_sections_load_from_file_env_and_flags(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from servelens.core.config import load

    config = tmp_path / "servelens.yaml"
    config.write_text("triggers:\n  window: 30m\n  p99_drift: {min_rise: 0.5, min_requests: 50}\n"
                      "  slo_burn:\n    rules: [{long: 2h, short: 10m, burn_rate: 5, severity: critical}]\n")
    monkeypatch.setenv("SERVELENS_TRIGGERS__P99_DRIFT__MIN_RISE", "0.7")
    monkeypatch.setenv("SERVELENS_TRIGGERS__QUALITY_REGRESSION__KEYS", '["model", "tenant"]')
    s = load(config, triggers={"p99_drift": {"min_requests": 75}})
    assert s.triggers.window == timedelta(minutes=30)
    assert (s.triggers.p99_drift.min_rise, s.triggers.p99_drift.min_requests) == (0.7, 75)  # env over file, flag over env
    assert s.triggers.quality_regression.keys == ["model", "tenant"]
    assert s.triggers.slo_burn.rules[0].short == timedelta(minutes=10)
    assert s.triggers.p99_drift.alpha == 1e-3  # the keys not given keep their defaults

    config.write_text("triggers:\n  p99_drift: {min_requests: 0, bogus: 1}\n  p99_drfit: {}\n"
                      "  slo_burn:\n    rules: [{long: 1h, short: 2h, burn_rate: 1, severity: critical}]\n")
    with pytest.raises(ConfigError) as bad:
        load(config)
    message = str(bad.value)
    for key in ("triggers.p99_drift.min_requests", "triggers.p99_drift.bogus", "triggers.p99_drfit",
                "triggers.slo_burn.rules.0"):
        assert key in message, message


def test_a_new_module_is_a_new_kind(package, store, make_settings) -> None:
    root, name = package
    assert detectors.discover(root, name) == ["detect_echo"]
    assert "echo" in KINDS and "echo" in DETECTORS
    assert (make_settings().triggers.echo.quiet_below, make_settings().triggers.echo.label) == (1, "echo-api")
    with pytest.raises(ConfigError, match=r"triggers\.echo\.quiet_below"):
        make_settings(triggers={"echo": {"quiet_below": 0}})
    with pytest.raises(ConfigError, match=r"triggers\.echo\.loud"):
        make_settings(triggers={"echo": {"loud": True}})

    settings = make_settings(triggers={"echo": {"quiet_below": 5, "label": "quiet-api"}})
    until = datetime(2026, 3, 2, 10, tzinfo=timezone.utc)
    changed = engine.evaluate(store, settings, until, kinds=["echo"])
    assert [(t["kind"], t["subject"], t["summary"]) for t in changed] == [("echo", {"service": "quiet-api"}, "0 requests")]
    assert changed[0]["evidence"] == {"requests": 0, "quiet_below": 5}
    # Every kind runs when none is named, the new one among them.
    _, ran, _ = engine.run_detectors(store, settings, engine.window_at(settings, until + timedelta(hours=1)))
    assert set(ran) == KINDS_BEFORE | {"echo"}


def test_settings_read_before_their_kind_registers(package, store, make_settings,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line reads its config before it imports the detectors: a kind's section
    is kept as given, validated on first read, and a key that names no kind stops the engine."""
    root, name = package
    monkeypatch.setattr(TRIGGER_KINDS, "complete", False)
    early = make_settings(triggers={"echo": {"quiet_below": "7"}})
    wrong = make_settings(triggers={"echo": {"quiet_below": 0}})
    typo = make_settings(triggers={"ecko": {}})
    detectors.discover(root, name)
    monkeypatch.setattr(TRIGGER_KINDS, "complete", True)
    assert early.triggers.echo.quiet_below == 7 and early.triggers.echo.label == "echo-api"
    with pytest.raises(ConfigError, match=r"triggers\.echo\.quiet_below"):
        wrong.triggers.echo
    until = datetime(2026, 3, 2, 10, tzinfo=timezone.utc)
    with pytest.raises(ConfigError, match=r"triggers\.ecko"):
        engine.evaluate(store, typo, until, kinds=["echo"])
    assert engine.last_evaluated(store) is None  # the bad config took no window
