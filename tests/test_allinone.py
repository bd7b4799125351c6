"""`servelens up --demo` as a user runs it: one process, demo traffic, dashboard alive.

A real subprocess on its own data directory (chDB admits one process per directory),
ports 0, polled over loopback with bounded waits, stopped with Ctrl-C (SIGINT).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _ago(minutes: int) -> str:
    return (datetime.now(timezone.utc) - timedelta(minutes=minutes)).isoformat()


def test_up_with_demo_serves_analysed_traffic_and_stops_cleanly(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "servelens", "up", "--demo", "--data-dir", str(tmp_path / "data"),
         "--otlp-http-port", "0", "--otlp-grpc-port", "0", "--ui-port", "0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ports: dict[str, str] = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "ui" not in ports:
            line = proc.stdout.readline()
            if line.startswith("otlp-grpc="):  # SPEC 1: the chosen ports, printed on start
                ports = dict(part.split("=") for part in line.split())
        assert set(ports) == {"otlp-grpc", "otlp-http", "ui"}, "no ports line"
        base = f"http://127.0.0.1:{ports['ui']}"
        assert get(f"{base}/api/v1/health")["status"] == "ok"

        # The history is stored before the analytics and the dashboard start (their first
        # answers would otherwise be of part of it): the first read has it all.
        overview = get(f"{base}/api/v1/reports/overview")["rows"][0]
        assert overview["requests"] > 5000
        assert overview["cost_per_request_usd"] > 0
        assert 0 < overview["gpu_utilization"] < 1
        assert overview["binding_constraint"] in ("queue", "prefill", "decode", "retrieval", "tool", "other")
        # The history runs on into the live traffic at one rate: its five-minute buckets
        # hold about what live traffic sends in five minutes, not a hundredth of it.
        from servelens.demo.traffic import UP_RATE_PER_S
        points = get(f"{base}/api/v1/series/requests?bucket=5m&since="
                     + urllib.parse.quote(_ago(115)) + "&until=" + urllib.parse.quote(_ago(10)))["series"][0]["points"]
        history = sorted(v for _, v in points)
        assert len(history) >= 20 and 0.4 < history[len(history) // 2] / (UP_RATE_PER_S * 300) < 2.5, history
        # the demo's SLOs, judged on its traffic
        slos = {r["name"]: r for r in get(f"{base}/api/v1/reports/slo")["rows"]}
        assert set(slos) == {"chat-availability", "llama-latency"} and all(r["total"] > 0 for r in slos.values())
        health = get(f"{base}/api/v1/health")
        assert health["collector"]["servelens_receiver_accepted_items_total{signal=traces,transport=http}"] > 500
        with urllib.request.urlopen(f"{base}/", timeout=30) as resp:  # the dashboard page itself
            assert resp.status == 200 and b"servelens" in resp.read()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, out[-2000:]
