"""The utilization report and the overview's GPU utilization against numpy, over DCGM
gauges sent the exporter's way (otel_metrics_gauge rows), several inserts per sample so
gpu_samples holds partial rows, and windows whose edges fall inside minutes.

The reports read the per-minute rollup (gpu_util_minutes) for whole minutes and the raw
samples at the edges: every window must give what the samples themselves give (mean over
samples; p95 with numpy's default "linear" method, which is quantileExactInclusive's).
"""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from servelens.analytics.query import ReportQuery
from servelens.analytics.reports.registry import run
from servelens.analytics.reports.utilization import deployment_costs

pytestmark = pytest.mark.integration

T0 = (datetime.now(timezone.utc) - timedelta(hours=5)).replace(second=0, microsecond=0)
HOSTS = {"gpu-a1": "dep-a", "gpu-a2": "dep-a", "gpu-b1": "dep-b", "gpu-x": ""}  # gpu-x: no deployment
RATES = {"dep-a": 2.5, "dep-b": 4.0}
DEPLOYMENTS = [{"name": "dep-a", "gpus": {"hosts": ["gpu-a1", "gpu-a2"]}, "gpu_hourly_usd": RATES["dep-a"]},
               {"name": "dep-b", "gpus": {"hosts": ["gpu-b1"]}, "gpu_hourly_usd": RATES["dep-b"]}]
# (since, until) offsets from T0: minute-aligned; both edges inside minutes; inside one
# minute; across one minute boundary with no whole minute; before any sample.
WINDOWS = [
    (timedelta(0), timedelta(hours=2)),
    (timedelta(minutes=3, seconds=17, microseconds=250_000), timedelta(hours=1, minutes=41, seconds=44, microseconds=5)),
    (timedelta(minutes=10, seconds=5), timedelta(minutes=10, seconds=50)),
    (timedelta(minutes=20, seconds=31), timedelta(minutes=21, seconds=29)),
    (timedelta(hours=-3), timedelta(hours=-1)),
    # on the hours' grid: the stored hours alone (sources.gpus._rows)
    (timedelta(minutes=(60 - T0.minute) % 60), timedelta(minutes=(60 - T0.minute) % 60 + 60)),
]


def _ns(dt: datetime) -> int:
    return (dt - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1) * 1000


def samples() -> list[tuple[str, str, int, float]]:
    """(host, gpu uuid, time ns, DCGM value): two GPUs per host every ~15 s with jitter for
    2 h; integer percents, except gpu-b1's, which report fractional OpenLIT-style values."""
    rng = random.Random(5)
    out = []
    for host in HOSTS:
        for g in range(2):
            t = _ns(T0) + rng.randrange(0, 15 * 10**9)
            end = _ns(T0 + timedelta(hours=2))
            while t < end:
                value = round(rng.uniform(0, 100), 1) if host == "gpu-b1" else float(rng.choice(
                    [0, 3, 17, 35, 35, 50, 64, 88, 99, 100]))
                out.append((host, f"GPU-{host}-{g}", t, value))
                t += rng.randrange(14 * 10**9, 16 * 10**9)
    return out


@pytest.fixture
def loaded(store):
    """The samples as gauge rows, utilization and framebuffer in separate inserts, each
    split over several inserts, in shuffled order."""
    data = samples()
    rows_util, rows_fb = [], []
    for host, gpu, t, value in data:
        ts = datetime.fromtimestamp(t // 10**9, tz=timezone.utc) + timedelta(microseconds=t % 10**9 // 1000)
        attrs = {"Hostname": host, "UUID": gpu, "gpu": gpu[-1], "modelName": "NVIDIA H100 80GB HBM3"}
        metric = "gpu.utilization" if host == "gpu-b1" else "DCGM_FI_DEV_GPU_UTIL"
        rows_util.append(["dcgm-exporter", metric, attrs, ts, value])
        rows_fb.append(["dcgm-exporter", "DCGM_FI_DEV_FB_USED", attrs, ts, 1000.0])
    random.Random(9).shuffle(rows_util)
    client = store.client()
    columns = ["ServiceName", "MetricName", "Attributes", "TimeUnix", "Value"]
    for chunk in range(0, len(rows_fb), 700):
        client.insert("otel_metrics_gauge", rows_fb[chunk:chunk + 700], column_names=columns)
    for chunk in range(0, len(rows_util), 500):
        client.insert("otel_metrics_gauge", rows_util[chunk:chunk + 500], column_names=columns)
    # microsecond times: what the gauge table stores
    return [(h, g, t // 1000 * 1000, v / 100) for h, g, t, v in data]


def expected(data, since: datetime, until: datetime):
    lo, hi = _ns(since), _ns(until)
    per_gpu: dict[str, list[tuple[int, float]]] = defaultdict(list)
    host_of = {}
    for host, gpu, t, util in data:
        if lo <= t < hi:
            per_gpu[gpu].append((t, util))
            host_of[gpu] = host
    hours_window = (hi - lo) / 3.6e12
    gpus = {}
    for gpu, points in per_gpu.items():
        times = [t for t, _ in points]
        utils = [u for _, u in points]
        n = len(points)
        span_h = (max(times) - min(times)) / 3.6e12
        hours = min(span_h * n / (n - 1) if n >= 2 else 15 / 3600, hours_window)
        gpus[gpu] = {"deployment": HOSTS[host_of[gpu]], "utils": utils, "times": times, "hours": hours,
                     "mean": float(np.mean(utils)), "p95": float(np.percentile(utils, 95))}
    deployments = {}
    for dep in RATES:
        mine = [g for g in gpus.values() if g["deployment"] == dep]
        if not mine:
            continue
        utils = [u for g in mine for u in g["utils"]]
        minutes: dict[int, list[float]] = defaultdict(list)
        for g in mine:
            for t, u in zip(g["times"], g["utils"]):
                minutes[t // (60 * 10**9)].append(u)
        mean = float(np.mean(utils))
        provisioned = sum(g["hours"] for g in mine) * RATES[dep]
        busy = sum(g["hours"] * g["mean"] for g in mine) * RATES[dep]
        deployments[dep] = {"gpus": len(mine), "gpu_util_mean": mean, "gpu_util_p95": float(np.percentile(utils, 95)),
                            "peak_to_average": max(np.mean(v) for v in minutes.values()) / mean,
                            "provisioned_cost_usd": provisioned, "busy_cost_usd": busy,
                            "idle_cost_usd": provisioned - busy}
    fleet = [u for g in gpus.values() for u in g["utils"]]
    return gpus, deployments, (float(np.mean(fleet)) if fleet else None)


def approx(value):
    return pytest.approx(value, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("window", WINDOWS, ids=["aligned", "edges-inside-minutes", "inside-a-minute",
                                                 "across-one-boundary", "before-any-sample", "on-the-hours"])
def test_utilization_matches_the_samples(make_settings, store, loaded, window) -> None:
    settings = make_settings(deployments=DEPLOYMENTS)
    since, until = T0 + window[0], T0 + window[1]
    params = {"since": since.isoformat(), "until": until.isoformat()}
    gpus, deployments, fleet = expected(loaded, since, until)

    by_gpu = {r["gpu"]: r for r in run("utilization", store, settings, {**params, "by": "gpu"})["rows"]}
    assert set(by_gpu) == set(gpus)
    for gpu, want in gpus.items():
        got = by_gpu[gpu]
        assert (got["deployment"] or "") == want["deployment"]
        assert got["gpu_util_mean"] == approx(want["mean"]), gpu
        assert got["gpu_util_p95"] == approx(want["p95"]), gpu

    rows = {r["deployment"]: r for r in run("utilization", store, settings, params)["rows"]}
    assert set(rows) == set(RATES)
    for dep in RATES:
        if dep not in deployments:
            assert rows[dep]["gpus"] == 0 and rows[dep]["gpu_util_mean"] is None
            continue
        for name, value in deployments[dep].items():
            assert rows[dep][name] == approx(value), (dep, name)

    # what the cost reports allocate (read without the p95 and the per-minute peaks)
    costs = {r["deployment"]: r for r in deployment_costs(store, settings, ReportQuery(since, until))
             .iter_rows(named=True)}
    for dep, row in rows.items():
        for name in ("provisioned_cost_usd", "busy_cost_usd", "idle_cost_usd"):
            assert costs[dep][name] == approx(row[name]), (dep, name)

    (overview,) = run("overview", store, settings, params)["rows"]
    assert overview["gpu_utilization"] == (None if fleet is None else approx(fleet))


def test_the_rollup_counts_each_reading_once(store, loaded) -> None:
    """Utilization and framebuffer arrive in separate inserts, so until a merge a sample is
    several gpu_samples rows; the rollup holds each utilization reading exactly once."""
    client = store.client()
    readings = client.command("SELECT count() FROM (SELECT Host, GpuUuid, Timestamp FROM gpu_samples "
                              "GROUP BY ALL HAVING anyLast(Util) IS NOT NULL)")
    assert readings == len(loaded)
    assert client.command("SELECT sum(Samples) FROM gpu_util_minutes") == len(loaded)


def test_the_hour_rollup_holds_the_minutes(store, loaded) -> None:
    """gpu_util_hours (0023) folds gpu_util_minutes' inserts into hours: the same readings,
    sums and distributions per GPU, so whole hours of a window can be read from it."""
    client = store.client()
    per = ("SELECT Host, GpuUuid, toStartOfHour(Minute) AS h, sum(Samples), round(sum(UtilSum), 9), min(FirstSample), "
           "max(LastSample), arraySort(sumMap(UtilCounts).1) FROM {t} GROUP BY Host, GpuUuid, h ORDER BY ALL")
    hours = client.query(per.format(t="gpu_util_hours")).result_rows
    assert hours and hours == client.query(per.format(t="gpu_util_minutes")).result_rows
    assert client.command("SELECT count() FROM gpu_util_hours WHERE toMinute(Minute) != 0") == 0


def test_a_window_on_the_hours_reads_the_stored_hours_alone(make_settings) -> None:
    from servelens.analytics.sources import gpus

    settings = make_settings(deployments=DEPLOYMENTS)
    hour = T0.replace(minute=0) + timedelta(hours=1)
    on, off = ReportQuery(hour, hour + timedelta(hours=2)), ReportQuery(hour, hour + timedelta(hours=2, minutes=1))
    assert "gpu_util_hours" in gpus._rows(settings, q=on) and "gpu_samples" not in gpus._rows(settings, q=on)
    assert "gpu_samples" in gpus._rows(settings, q=off)
