"""The wheel as a user installs it (`pip install .`, not editable): built from a copy of the
sources, installed into a fresh virtual environment, and `servelens up` run from a directory
outside the checkout, so nothing of the source tree can stand in for the package's own files
(migrations, the .proto schema, the dashboard's assets, the entry point).

The fresh environment takes its third-party dependencies from the test environment's
site-packages (a plain path line, so that environment's editable servelens is not loaded):
installing them again would test PyPI, not the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def _wheel(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path / "dist"), str(source)], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("servelens-*.whl")
    return wheel


def _clean_env() -> dict[str, str]:
    """This environment without what would put a source tree on the fresh venv's path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME") and
            not k.startswith("SERVELENS_")}


def _fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    str(wheel)], check=True, timeout=300)
    site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        env=_clean_env(), text=True).strip())
    (site / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_the_wheel_holds_the_package_data_and_runs_up(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "servelens/core/migrations/0001_otel_traces.sql" in names
    assert "servelens/collector/mapping/schemas/otlp_traces.proto" in names
    assert "servelens/dashboard/assets/servelens.css" in names
    assert not any(n.split("/")[0] in ("collector", "analytics", "dashboard", "migrations") for n in names)

    venv = _fresh_venv(tmp_path, wheel)
    where = subprocess.check_output([str(venv / "bin" / "python"), "-c", "import servelens; print(servelens.__file__)"],
                                    cwd=tmp_path, env=_clean_env(), text=True).strip()
    assert Path(where).is_relative_to(venv), where  # the installed copy, not the checkout

    proc = subprocess.Popen(
        [str(venv / "bin" / "servelens"), "up", "--data-dir", str(tmp_path / "data"), "--otlp-http-port", "0",
         "--otlp-grpc-port", "0", "--ui-port", "0", "--log-level", "WARNING"],
        cwd=tmp_path, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ports: dict[str, str] = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "ui" not in ports:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            if line.startswith("otlp-grpc="):
                ports = dict(part.split("=") for part in line.split())
        assert set(ports) == {"otlp-grpc", "otlp-http", "ui"}, "no ports line"
        base = f"http://127.0.0.1:{ports['ui']}"
        with urllib.request.urlopen(f"{base}/api/v1/health", timeout=30) as resp:
            health = json.loads(resp.read())
        assert health["status"] == "ok"
        # A span through the installed receiver and the engine's parse (the .proto schema).
        body = _one_span()
        request = urllib.request.Request(f"http://127.0.0.1:{ports['otlp-http']}/v1/traces", data=body,
                                         headers={"Content-Type": "application/x-protobuf"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"{base}/assets/servelens.css", timeout=30) as resp:
            assert resp.status == 200 and resp.read()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, out[-2000:]


def _one_span() -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = b"\x01" * 16, b"\x02" * 8, "chat gpt-4o"
    span.start_time_unix_nano = time.time_ns() - 1_000_000
    span.end_time_unix_nano = time.time_ns()
    return request.SerializeToString()


def test_the_installed_replay_compiles_once_and_caches_beside_its_module(tmp_path: Path) -> None:
    """What the Dockerfile runs at build time: the first replay compiles the loop and leaves
    numba's cache in the installed package, so the next process loads it."""
    venv = _fresh_venv(tmp_path, _wheel(tmp_path))
    env = {k: v for k, v in _clean_env().items() if k != "NUMBA_CACHE_DIR"}
    run = ("import time; t = time.perf_counter(); "
           "from servelens.analytics.plan.simulate import Server, simulate; "
           "r = simulate([0.0, 0.5], [10, 20], [5, 5], Server(0.01, 1e-5, 1e-4)); "
           "print(r.completed, time.perf_counter() - t)")
    first = subprocess.check_output([str(venv / "bin" / "python"), "-c", run], cwd=tmp_path, env=env, text=True)
    assert first.split()[0] == "2"
    engine = Path(subprocess.check_output(
        [str(venv / "bin" / "python"), "-c", "import servelens.analytics.plan.engine as e; print(e.__file__)"],
        cwd=tmp_path, env=env, text=True).strip())
    assert engine.is_relative_to(venv)
    assert list((engine.parent / "__pycache__").glob("engine.replay-*.nbi")), "no cache beside the installed module"
    second = subprocess.check_output([str(venv / "bin" / "python"), "-c", run], cwd=tmp_path, env=env, text=True)
    assert second.split()[0] == "2"
    assert float(second.split()[1]) < float(first.split()[1]) / 2  # loaded, not compiled again
