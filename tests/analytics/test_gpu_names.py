"""GPU busy time by the metric each GPU reports, under dcgm-exporter's label spellings.

dcgm-exporter pages served on 127.0.0.1 and scraped by the running collector: a current
exporter with profiling fields (`hostname`, DCGM_FI_PROF_GR_ENGINE_ACTIVE beside
DCGM_FI_DEV_GPU_UTIL), an older one without them (`Hostname`, utilization only), and a
MIG GPU whose instances report no DCGM_FI_DEV_GPU_UTIL, allocated through Kubernetes DRA
(`uuid`, pod labels and the dra_* labels, one instance's claim shared by two pods). The
utilization report measures each GPU by the graphics engine's active time where it has
it, else by utilization, and says which (`busy_metric`); `gpus.busy_metric` forces one.
The per-minute rollup of the graphics engine's readings, its edges and the migration's
backfill are checked against the readings themselves.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import numpy as np
import pytest

from servelens.analytics.query import ReportQuery
from servelens.analytics.reports.registry import run
from servelens.analytics.sources import gpus as source
from servelens.collector.service import Collector
from servelens.core.migrate import discover, migrate
from servelens.core.store import Store

pytestmark = pytest.mark.integration

H100 = "NVIDIA H100 80GB HBM3"
DRIVER = "570.124.06"
UUIDS = {"prof-0": "GPU-3f1c9a2e-51d7-4b8e-9c03-6a2f1e7d4b10", "prof-1": "GPU-8d2e4f6a-0b1c-4d3e-8f5a-7c9b1d3e5f72",
         "basic-0": "GPU-c4b3a291-8e7f-4a6d-9b5c-3e2d1f0a9b88", "mig-0": "GPU-0a9b8c7d-6e5f-4d3c-8b2a-1f0e9d8c7b66"}
DEPLOYMENTS = [{"name": "llama", "gpus": {"hosts": ["gpu-prof", "gpu-basic"]}, "gpu_hourly_usd": 2.0},
               {"name": "embed", "gpus": {"hosts": ["gpu-mig"]}, "gpu_hourly_usd": 2.0}]


def _board(index: str, uuid: str, bus: str) -> dict[str, str]:
    return {"gpu": index, "UUID": uuid, "pci_bus_id": bus, "device": f"nvidia{index}", "modelName": H100}


# (labels, {metric: value}) per series, in dcgm-exporter's label order
PROF = [  # a current exporter with profiling fields: hostname
    ({**_board("0", UUIDS["prof-0"], "00000000:18:00.0"), "hostname": "gpu-prof", "DCGM_FI_DRIVER_VERSION": DRIVER},
     {"DCGM_FI_DEV_GPU_UTIL": 90, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.25, "DCGM_FI_DEV_FB_USED": 70011}),
    ({**_board("1", UUIDS["prof-1"], "00000000:2A:00.0"), "hostname": "gpu-prof", "DCGM_FI_DRIVER_VERSION": DRIVER},
     {"DCGM_FI_DEV_GPU_UTIL": 100, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.625, "DCGM_FI_DEV_FB_USED": 73403}),
]
BASIC = [  # an older exporter, profiling off: Hostname
    ({**_board("0", UUIDS["basic-0"], "00000000:18:00.0"), "Hostname": "gpu-basic", "DCGM_FI_DRIVER_VERSION": DRIVER},
     {"DCGM_FI_DEV_GPU_UTIL": 40, "DCGM_FI_DEV_FB_USED": 40960}),
]


def _mig(instance: str, profile: str, pod: str, claim: str) -> dict[str, str]:
    """A MIG instance's series under DRA: the renderer's labels (lowercase `uuid`), then the
    pod mapping's attributes in key order, as dcgm-exporter writes them."""
    labels = {"gpu": "0", "uuid": UUIDS["mig-0"], "pci_bus_id": "00000000:3A:00.0", "device": "nvidia0",
              "modelName": H100, "GPU_I_PROFILE": profile, "GPU_I_ID": instance, "hostname": "gpu-mig",
              "DCGM_FI_DRIVER_VERSION": DRIVER}
    return labels | {"container": "server", "dra_claim_name": claim, "dra_claim_namespace": "search",
                     "dra_device_name": f"gpu-0-mig-{instance}", "dra_driver_name": "gpu.nvidia.com",
                     "dra_mig_device_uuid": f"MIG-{instance}e7c1d2a-4b5f-5c6d-8e9f-0a1b2c3d4e5f",
                     "dra_mig_profile": profile, "dra_pool_name": "gpu-mig", "namespace": "search", "pod": pod}


MIG = [  # instance 1's claim is shared by two pods: its series is written once per pod
    (_mig("1", "3g.40gb", "embed-0", "embed-mig"),
     {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.5, "DCGM_FI_DEV_FB_USED": 30012}),
    (_mig("1", "3g.40gb", "embed-1", "embed-mig"),
     {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.5, "DCGM_FI_DEV_FB_USED": 30012}),
    (_mig("2", "4g.40gb", "rerank-0", "rerank-mig"),
     {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.125, "DCGM_FI_DEV_FB_USED": 22016}),
]
HELP = {"DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).", "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active."}


def page(series: list[tuple[dict[str, str], dict[str, float]]]) -> str:
    lines = []
    for name, help_text in HELP.items():
        rows = [(labels, values[name]) for labels, values in series if name in values]
        if rows:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            lines += [f"{name}{{{','.join(f'{k}={chr(34)}{v}{chr(34)}' for k, v in labels.items())}}} {value}"
                      for labels, value in rows]
    return "\n".join(lines) + "\n"


PAGES = {"/prof/metrics": page(PROF), "/basic/metrics": page(BASIC), "/mig/metrics": page(MIG)}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = PAGES.get(self.path, "").encode()
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def exporters() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="test dcgm-exporters", daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def rows(store: Store, sql: str, **params: Any) -> list[dict[str, Any]]:
    return list(store.client().query(sql, parameters=params).named_results())


def scrapes(store: Store, host: str) -> int:
    return store.client().command("SELECT uniqExact(Timestamp) FROM gpu_samples WHERE Host = {h:String}",
                                  parameters={"h": host})


@pytest.fixture
def scraped(make_settings, store: Store, exporters: str) -> dict[str, int]:
    """Three scrapes or more of every exporter, then the collector stopped: scrapes per host."""
    targets = [{"url": f"{exporters}/{name}/metrics", "interval": "1s", "job": "dcgm"}
               for name in ("prof", "basic", "mig")]
    collector = Collector(make_settings(scrape={"targets": targets}), store)
    collector.start()
    try:
        deadline = time.monotonic() + 20
        while min(scrapes(store, h) for h in ("gpu-prof", "gpu-basic", "gpu-mig")) < 3:
            assert time.monotonic() < deadline, "timed out waiting for three scrapes of every exporter"
            time.sleep(0.05)
    finally:
        collector.shutdown()
    return {h: scrapes(store, h) for h in ("gpu-prof", "gpu-basic", "gpu-mig")}


LABELS = ("Host", "GpuUuid", "GpuIndex", "ModelName", "MigProfile", "MigInstance", "Pod", "Namespace", "Container",
          "DraClaimNamespace", "DraClaimName", "DraDriverName", "DraPoolName", "DraDeviceName", "MigDeviceUuid")


def test_dcgm_exporter_label_spellings_mig_and_dra_land_in_gpu_samples(scraped, store) -> None:
    got = rows(store, f"SELECT {', '.join(LABELS)}, anyLast(Util) AS Util, anyLast(GrEngineActive) AS GrEngineActive "
                      f"FROM gpu_samples GROUP BY {', '.join(LABELS)} ORDER BY Host, GpuUuid, MigInstance, Pod")
    dra = {k: "" for k in LABELS[9:]}
    assert got == [
        {"Host": "gpu-basic", "GpuUuid": UUIDS["basic-0"], "GpuIndex": "0", "ModelName": H100, "MigProfile": "",
         "MigInstance": "", "Pod": "", "Namespace": "", "Container": "", **dra, "Util": 0.4, "GrEngineActive": None},
        *({"Host": "gpu-mig", "GpuUuid": UUIDS["mig-0"], "GpuIndex": "0", "ModelName": H100,
           "MigProfile": labels["GPU_I_PROFILE"], "MigInstance": labels["GPU_I_ID"], "Pod": labels["pod"],
           "Namespace": "search", "Container": "server", "DraClaimNamespace": "search",
           "DraClaimName": labels["dra_claim_name"], "DraDriverName": "gpu.nvidia.com", "DraPoolName": "gpu-mig",
           "DraDeviceName": labels["dra_device_name"], "MigDeviceUuid": labels["dra_mig_device_uuid"], "Util": None,
           "GrEngineActive": values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]} for labels, values in MIG),
        *({"Host": "gpu-prof", "GpuUuid": labels["UUID"], "GpuIndex": labels["gpu"], "ModelName": H100,
           "MigProfile": "", "MigInstance": "", "Pod": "", "Namespace": "", "Container": "", **dra,
           "Util": values["DCGM_FI_DEV_GPU_UTIL"] / 100, "GrEngineActive": values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]}
          for labels, values in sorted(PROF, key=lambda s: s[0]["UUID"])),
    ]


def _report(store: Store, settings, by: str) -> dict[str, dict[str, Any]]:
    now = datetime.now(timezone.utc)
    params = {"since": (now - timedelta(minutes=10)).isoformat(), "until": (now + timedelta(seconds=5)).isoformat(),
              "by": by}
    return {r[by]: r for r in run("utilization", store, settings, params)["rows"]}


def test_busy_time_is_the_graphics_engines_where_a_gpu_reports_it(scraped, make_settings, store) -> None:
    settings = make_settings(deployments=DEPLOYMENTS)
    by_gpu = _report(store, settings, "gpu")
    assert {g: (r["deployment"], r["busy_metric"], r["gpu_util_mean"]) for g, r in by_gpu.items()} == {
        UUIDS["prof-0"]: ("llama", "gr_engine_active", pytest.approx(0.25)),
        UUIDS["prof-1"]: ("llama", "gr_engine_active", pytest.approx(0.625)),
        UUIDS["basic-0"]: ("llama", "gpu_util", pytest.approx(0.40)),
        # one reading per instance and time, not per pod: (0.5 + 0.125) / 2
        UUIDS["mig-0"]: ("embed", "gr_engine_active", pytest.approx(0.3125)),
    }
    assert by_gpu[UUIDS["mig-0"]]["gpu_util_p95"] == pytest.approx(0.5)

    by_dep = _report(store, settings, "deployment")
    n_prof, n_basic = scraped["gpu-prof"], scraped["gpu-basic"]
    mean = (n_prof * (0.25 + 0.625) + n_basic * 0.40) / (2 * n_prof + n_basic)
    assert {d: (r["gpus"], r["busy_metric"], r["gpu_util_mean"]) for d, r in by_dep.items()} == {
        "llama": (3, "mixed", pytest.approx(mean)), "embed": (1, "gr_engine_active", pytest.approx(0.3125))}
    assert by_dep["embed"]["busy_cost_usd"] == pytest.approx(by_dep["embed"]["provisioned_cost_usd"] * 0.3125)


@pytest.mark.parametrize("metric", ["gpu_util", "gr_engine_active"])
def test_busy_metric_setting_measures_every_gpu_by_one_metric(scraped, make_settings, store, metric) -> None:
    settings = make_settings(deployments=DEPLOYMENTS, gpus={"busy_metric": metric})
    by_gpu = _report(store, settings, "gpu")
    want = {"gpu_util": {UUIDS["prof-0"]: 0.90, UUIDS["prof-1"]: 1.0, UUIDS["basic-0"]: 0.40},  # MIG: none
            "gr_engine_active": {UUIDS["prof-0"]: 0.25, UUIDS["prof-1"]: 0.625, UUIDS["mig-0"]: 0.3125}}[metric]
    assert {g: (r["busy_metric"], r["gpu_util_mean"]) for g, r in by_gpu.items()} == {
        g: (metric, pytest.approx(v)) for g, v in want.items()}
    by_dep = _report(store, settings, "deployment")
    assert by_dep["llama"]["busy_metric"] == metric
    if metric == "gpu_util":  # the MIG GPU reports no utilization: no GPUs seen, nothing known
        assert (by_dep["embed"]["gpus"], by_dep["embed"]["busy_metric"], by_dep["embed"]["gpu_util_mean"]) == (
            0, None, None)


# --- the rollup of DCGM_FI_PROF_GR_ENGINE_ACTIVE, against the readings ------------------------

T0 = (datetime.now(timezone.utc) - timedelta(hours=5)).replace(second=0, microsecond=0)


def _readings() -> list[tuple[str, datetime, float, float]]:
    """(GPU uuid, time, GR_ENGINE_ACTIVE, GPU_UTIL %) every ~15 s for an hour, two GPUs;
    ratios with six decimals, never halfway at the third (rounding is unambiguous)."""
    rng = random.Random(17)
    out = []
    for gpu in ("GPU-r-0", "GPU-r-1"):
        t = T0 + timedelta(microseconds=rng.randrange(0, 15_000_000))
        while t < T0 + timedelta(hours=1):
            gr = rng.randrange(0, 1000) / 1000 + rng.choice([rng.randrange(1, 500), rng.randrange(501, 1000)]) / 1e6
            out.append((gpu, t, round(min(gr, 1.0), 6), float(rng.randrange(0, 101))))
            t += timedelta(microseconds=rng.randrange(14_000_000, 16_000_000))
    return out


def _insert(client: Any, readings: list[tuple[str, datetime, float, float]]) -> None:
    """As dcgm-exporter under DRA writes them: each series once per pod (two pods), the
    framebuffer in inserts of its own (partial rows), shuffled, in several inserts."""
    columns = ["ServiceName", "MetricName", "Attributes", "TimeUnix", "Value"]
    gauges, fb = [], []
    for gpu, t, gr, util in readings:
        for pod in ("a-0", "a-1"):
            attrs = {"gpu": gpu[-1], "UUID": gpu, "modelName": H100, "hostname": "gpu-r", "pod": pod,
                     "dra_claim_name": "shared", "dra_claim_namespace": "ns"}
            gauges += [["dcgm", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", attrs, t, gr],
                       ["dcgm", "DCGM_FI_DEV_GPU_UTIL", attrs, t, util]]
            fb.append(["dcgm", "DCGM_FI_DEV_FB_USED", attrs, t, 1000.0])
    # a reading's copies stay in one insert (one scrape): shuffle whole readings
    pairs = [gauges[i:i + 4] for i in range(0, len(gauges), 4)]
    random.Random(3).shuffle(pairs)
    flat = [row for pair in pairs for row in pair]
    for chunk in range(0, len(fb), 900):
        client.insert("otel_metrics_gauge", fb[chunk:chunk + 900], column_names=columns)
    for chunk in range(0, len(flat), 1000):
        client.insert("otel_metrics_gauge", flat[chunk:chunk + 1000], column_names=columns)


def test_the_graphics_engine_rollup_and_edges_match_the_readings(make_settings, store) -> None:
    data = _readings()
    _insert(store.client(), data)
    settings = make_settings(deployments=[{"name": "r", "gpus": {"hosts": ["gpu-r"]}, "gpu_hourly_usd": 1.0}])
    since, until = T0 + timedelta(minutes=3, seconds=17, microseconds=250_000), T0 + timedelta(minutes=41, seconds=44)
    got = {r["gpu"]: r for r in source.per_gpu(store, settings, ReportQuery(since, until)).iter_rows(named=True)}
    for gpu in ("GPU-r-0", "GPU-r-1"):
        mine = [gr for g, t, gr, _ in data if g == gpu and since <= t < until]
        assert got[gpu]["busy_metric"] == "gr_engine_active"
        assert got[gpu]["samples"] == len(mine)  # one reading per time, whatever the pods
        assert got[gpu]["util_mean"] == pytest.approx(float(np.mean(mine)), rel=1e-12)
        assert got[gpu]["util_p95"] == pytest.approx(float(np.percentile([round(v, 3) for v in mine], 95)), rel=1e-9)
    both = [round(gr, 3) for _, t, gr, _ in data if since <= t < until]
    (p95,) = source.deployment_p95(store, settings, ReportQuery(since, until)).get_column("gpu_util_p95")
    assert p95 == pytest.approx(float(np.percentile(both, 95)), rel=1e-9)


def test_the_migration_rolls_up_the_graphics_engine_history(make_settings, tmp_path) -> None:
    """An install with samples before migration 0017: its DCGM_FI_PROF_GR_ENGINE_ACTIVE
    history is rolled up once (and not again if the migration runs a second time)."""
    settings = make_settings()
    store = Store(settings.store_url, settings.store.database)
    try:
        client = store.client()
        for m in discover():
            if m.version < 17:
                shutil.copy(m.path, tmp_path / m.path.name)
        migrate(client, tmp_path)
        data = _readings()
        _insert(client, data)
        migrate(client)
        sql = ("SELECT toString(BusyMetric) AS metric, sum(Samples) AS n, sum(UtilSum) AS total "
               "FROM gpu_util_minutes GROUP BY metric ORDER BY metric")
        # utilization was rolled up per row before 0017 (two pods: twice), the engine once per reading
        assert rows(store, sql) == [
            {"metric": "gpu_util", "n": 2 * len(data), "total": pytest.approx(2 * sum(u for *_, u in data) / 100)},
            {"metric": "gr_engine_active", "n": len(data), "total": pytest.approx(sum(gr for *_, gr, _ in data))}]
        (migration,) = [m for m in discover() if m.version == 17]
        before = rows(store, sql)
        for statement in migration.statements():
            client.command(statement)
        # float sums may add in another order: the same totals, not the same last bit
        assert rows(store, sql) == [{**r, "total": pytest.approx(r["total"])} for r in before]
    finally:
        store.client().command(f"DROP DATABASE IF EXISTS `{settings.store.database}`")
        store.close()
