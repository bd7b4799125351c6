"""Triggers name the most specific part that explains them. Error spikes: a (deployment, model) of the
service when the rest of the service holds, the service with its parts when several spike.
Cost anomalies: the tenant, feature, or one tenant's feature whose own cost per request
carries the service's out of its band.

The store case runs the real detector through the engine on histories written into the
embedded ClickHouse (bench/history.py); the rule itself is checked on constructed counts.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from bench.history import HOUR, Traffic, insert
from servelens.analytics.triggers.detect_reliability import ErrorRateSpike, most_specific
from tests.analytics.test_triggers import T0, Recorder, all_triggers, run_windows

CFG = ErrorRateSpike()


def counts(n: int, rate: float, base_rate: float = 0.005, base_n: int = 20_000, **key: str) -> dict:
    return {**key, "n": n, "errors": round(n * rate), "like_n": base_n // 7, "like_errors": round(base_n / 7 * base_rate),
            "base_n": base_n, "base_errors": round(base_n * base_rate)}


def total(parts: list[dict]) -> dict:
    return {k: sum(p[k] for p in parts) for k in ("n", "errors", "like_n", "like_errors", "base_n", "base_errors")}


def test_one_spiking_part_explains_its_service() -> None:
    parts = [counts(600, 0.2, deployment="gpt", model="gpt-4o"), counts(600, 0.005, deployment="gpt", model="mini"),
             counts(600, 0.006, deployment="llama", model="llama-70b")]
    assert most_specific(CFG, total(parts), parts)["part"]["model"] == "gpt-4o"


def test_several_spiking_parts_leave_the_service_named_with_them() -> None:
    parts = [counts(600, 0.2, deployment="gpt", model="gpt-4o"), counts(600, 0.15, deployment="gpt", model="mini"),
             counts(600, 0.005, deployment="llama", model="llama-70b")]
    found = most_specific(CFG, total(parts), parts)
    assert "part" not in found and sorted(p["model"] for p in found["parts"]) == ["gpt-4o", "mini"]


def test_a_service_wide_spike_or_a_single_part_names_the_service() -> None:
    even = [counts(600, 0.1, deployment="gpt", model=m) for m in ("a", "b", "c")]  # every part spikes alike
    found = most_specific(CFG, total(even), even)
    assert "part" not in found and len(found["parts"]) == 3
    one = [counts(1800, 0.1, deployment="gpt", model="a")]
    assert most_specific(CFG, total(one), one) == {}
    # Too few attempts in each part to test any: the service is all that can be named.
    thin = [counts(60, 0.3, deployment="gpt", model=m) for m in ("a", "b", "c")]
    assert most_specific(CFG, total(thin), thin) == {}


@pytest.mark.integration
def test_an_error_spike_of_one_model_is_named_as_that_model(store, make_settings) -> None:
    settings = make_settings(triggers={"baseline": "2d"})
    onset = T0 + timedelta(days=2)
    for seed, model in enumerate(("gpt-4o-mini", "gpt-4o")):
        insert(store, T0, onset + 4 * HOUR, Traffic(model=model, per_hour=300), seed=seed)
    insert(store, onset, onset + 2 * HOUR, Traffic(model="gpt-4o", per_hour=100, error_share=1.0), seed=9)
    changes = run_windows(store, settings, onset, 5, ["error_rate_spike"], Recorder())
    assert changes[0] == []
    [episode] = [t for t in all_triggers(store) if t["kind"] == "error_rate_spike"]
    assert episode["subject"] == {"service": "chat-api", "deployment": "chat-api", "model": "gpt-4o"}
    assert episode["evidence"]["parent"]["service"] == "chat-api"
    assert episode["evidence"]["error_rate"] > episode["evidence"]["parent"]["error_rate"]


PRICING = {"models": [{"model": "gpt-4o-mini", "input_per_mtok": 0.15, "output_per_mtok": 0.60}]}


def _cost_history(store, onset, longer: set[tuple[str, str]]) -> None:
    """chat-api for two tenants x two features, 100 requests an hour each; from `onset` for
    two hours the (tenant, feature) pairs in `longer` answer six times as long."""
    for seed, (tenant, feature) in enumerate([(t, f) for t in ("acme", "globex") for f in ("chat", "search")]):
        usual = Traffic(per_hour=100, tenant=tenant, feature=feature, tokens_sigma=0.1)
        insert(store, T0, onset, usual, seed=seed)
        changed = Traffic(per_hour=100, tenant=tenant, feature=feature, tokens_sigma=0.1,
                          output_tokens=900 if (tenant, feature) in longer else 150)
        insert(store, onset, onset + 2 * HOUR, changed, seed=10 + seed)


@pytest.mark.integration
@pytest.mark.parametrize(("longer", "named"), [
    ({("globex", "search")}, {"tenant": "globex", "feature": "search"}),
    ({("globex", "chat"), ("globex", "search")}, {"tenant": "globex"}),
    ({(t, f) for t in ("acme", "globex") for f in ("chat", "search")}, {}),  # all of it: the service's
])
def test_a_cost_anomaly_names_the_tenant_or_feature_that_carries_it(store, make_settings, longer, named) -> None:
    settings = make_settings(pricing=PRICING, triggers={"baseline": "2d"})
    onset = T0 + timedelta(days=2)
    _cost_history(store, onset, longer)
    run_windows(store, settings, onset, 2, ["cost_anomaly"], Recorder())
    [episode] = [t for t in all_triggers(store) if t["kind"] == "cost_anomaly"]
    assert episode["subject"] == {"service": "chat-api", **named}
    ev = episode["evidence"]
    if named:
        assert ev["parent"]["service"] == "chat-api"
        assert ev["without_it_cost_per_request_usd"] < 1.25 * ev["baseline_cost_per_request_usd"]
    else:
        assert "parent" not in ev
