"""Slow clients vs normal ones: `python -m bench.slow_clients [--slow N] [--seconds S] [--no-write]`.

`servelens up` runs in a subprocess on a fresh data dir (ports picked by the OS). For each
scenario, a swarm process holds N slow connections to the OTLP/HTTP receiver and N to the
dashboard, all on 127.0.0.1 and for a bounded time: "drip" sockets send one byte of a
never-ending header each second, "silent" ones connect and send nothing. A socket the
server closes is replaced at once, so the pressure stays at N per server. Meanwhile a
normal client (this process) sends, on a fresh connection each time, a small valid
OTLP/HTTP protobuf export (POST /v1/traces, answered once its rows are stored) and
GET /api/v1/health, alternately, every 50 ms; its latency runs from connect to the last
byte of the answer. Figures go into BENCHMARKS.md between the slow-clients markers.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import platform
import re
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.ingest import CLIENT_CORE, COLLECTOR_CORE, _pin, cpu_seconds, machine_busy_seconds
from bench.payloads import build_payloads
from bench.report import cpu_model, write_section
from servelens.core.serving import LIMITS

HOST = "127.0.0.1"
PROBE_EVERY = 0.05  # seconds between two normal requests (the two routes alternate)
PROBE_TIMEOUT = 10.0
DRIP = b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4096


# --- the server under test ----------------------------------------------------------------

class Servelens:
    """`servelens up` on a fresh data dir, no config file, no SERVELENS_* variables."""

    def __init__(self, scratch: Path, acknowledge: str = "stored") -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SERVELENS_")}
        env["SERVELENS_COLLECTOR__ACKNOWLEDGE"] = acknowledge
        self._log = open(scratch / "servelens.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "servelens", "up", "--data-dir", str(scratch / "data"),
             "--otlp-http-port", "0", "--otlp-grpc-port", "0", "--ui-port", "0", "--log-level", "WARNING"],
            cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=self._log, text=True)
        _pin(COLLECTOR_CORE, self.proc.pid)  # the clients get the other core
        self.ports = self._await_ports(120.0)

    def _await_ports(self, timeout: float) -> dict[str, int]:
        found: dict[str, int] = {}

        def read() -> None:
            found.update({k: int(v) for k, v in re.findall(r"([\w-]+)=(\d+)", self.proc.stdout.readline())})

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        if "otlp-http" not in found or "ui" not in found:
            self.stop()
            raise RuntimeError("servelens up did not start; see servelens.log")
        return found

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# --- the slow swarm (its own process, so its work does not delay the normal client) -------

def swarm(ports: list[int], per_port: int, mode: str, seconds: float, ready: multiprocessing.Event,
          results: multiprocessing.Queue) -> None:
    """Hold `per_port` slow sockets on each port for `seconds`; report lifetimes of the ones
    the server closed."""
    _pin(CLIENT_CORE)
    sel = selectors.DefaultSelector()
    opened_at: dict[socket.socket, tuple[float, int]] = {}  # socket -> (connect time, bytes sent)
    lifetimes: list[float] = []
    failed_connects = 0
    end = time.monotonic() + seconds

    def open_one(port: int) -> None:
        nonlocal failed_connects
        s = socket.socket()
        s.settimeout(2.0)
        try:
            s.connect((HOST, port))
        except OSError:
            failed_connects += 1
            s.close()
            return
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, port)
        opened_at[s] = (time.monotonic(), 0)

    def drop(s: socket.socket, port: int, by_server: bool) -> None:
        started, _ = opened_at.pop(s)
        sel.unregister(s)
        s.close()
        if by_server:
            lifetimes.append(time.monotonic() - started)
            if time.monotonic() < end:
                open_one(port)  # keep the pressure up

    for port in ports:
        for _ in range(per_port):
            open_one(port)
    ready.set()
    next_drip = time.monotonic() + 1.0
    while time.monotonic() < end:
        for key, _ in sel.select(timeout=max(0.0, min(next_drip, end) - time.monotonic())):
            try:
                data = key.fileobj.recv(4096)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:  # closed by the server (any answer it sends is followed by a close)
                drop(key.fileobj, key.data, by_server=True)
        if time.monotonic() < next_drip:
            continue
        next_drip += 1.0
        if mode == "drip":
            for s, (started, sent) in list(opened_at.items()):
                try:
                    s.send(DRIP[sent % len(DRIP):][:1])
                    opened_at[s] = (started, sent + 1)
                except OSError:
                    drop(s, sel.get_key(s).data, by_server=True)
    held = len(opened_at)
    for s in list(opened_at):
        drop(s, 0, by_server=False)
    results.put({"lifetimes": lifetimes, "failed_connects": failed_connects, "held_at_end": held,
                 "cpu": time.process_time()})


# --- the normal client --------------------------------------------------------------------

@dataclass
class Route:
    name: str
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    sent_at: list[float] = field(default_factory=list)  # seconds into the scenario, per latency

    def figures(self) -> dict[str, float | int]:
        xs = sorted(self.latencies)
        if not xs:
            return {"n": 0, "errors": sum(self.errors.values())}
        return {"n": len(xs), "errors": sum(self.errors.values()), "p50": xs[len(xs) // 2] * 1e3,
                "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e3, "max": xs[-1] * 1e3}


def request_once(port: int, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> float:
    started = time.perf_counter()
    conn = http.client.HTTPConnection(HOST, port, timeout=PROBE_TIMEOUT)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
    finally:
        conn.close()
    return time.perf_counter() - started


def probe(ports: dict[str, int], seconds: float) -> dict[str, Route]:
    payloads = build_payloads(64, spans=2)
    otlp, health = Route("POST /v1/traces"), Route("GET /api/v1/health")
    start = time.monotonic()
    end = start + seconds
    next_at, i = start, 0
    while time.monotonic() < end:
        route = otlp if i % 2 == 0 else health
        sent_at = time.monotonic() - start
        try:
            if route is otlp:
                latency = request_once(ports["otlp-http"], "POST", "/v1/traces", payloads[i // 2 % len(payloads)],
                                       {"Content-Type": "application/x-protobuf"})
            else:
                latency = request_once(ports["ui"], "GET", "/api/v1/health", None, {})
            route.latencies.append(latency)
            route.sent_at.append(sent_at)
        except (OSError, RuntimeError, http.client.HTTPException) as exc:
            kind = type(exc).__name__ if not isinstance(exc, RuntimeError) else str(exc)
            route.errors[kind] = route.errors.get(kind, 0) + 1
        i += 1
        next_at += PROBE_EVERY
        time.sleep(max(0.0, next_at - time.monotonic()))
    return {"otlp": otlp, "health": health}


def scenario(server: Servelens, mode: str, per_port: int, seconds: float) -> dict:
    """One scenario: the swarm (unless mode is "none") and the normal client, side by side."""
    proc, results = None, None
    if mode != "none":
        ctx = multiprocessing.get_context("spawn")
        ready, results = ctx.Event(), ctx.Queue()
        ports = [server.ports["otlp-http"], server.ports["ui"]]
        proc = ctx.Process(target=swarm, args=(ports, per_port, mode, seconds + 3.0, ready, results), daemon=True)
        proc.start()
        ready.wait(60)
        time.sleep(1.0)  # all of them connected and accepted
    open_files = server.open_files()
    busy, own, probe_cpu, started = machine_busy_seconds(), cpu_seconds(server.proc.pid), time.process_time(), time.monotonic()
    routes = probe(server.ports, seconds)
    window = time.monotonic() - started
    cpu = {"servelens": (cpu_seconds(server.proc.pid) - own) / window,
           "probe": (time.process_time() - probe_cpu) / window}
    busy = (machine_busy_seconds() - busy) / window
    stats = None
    if proc is not None:
        stats = results.get(timeout=60)
        proc.join(10)
        cpu["swarm"] = stats["cpu"] / (seconds + 3.0)
    cpu["others"] = max(0.0, busy - sum(cpu.values()))
    return {"mode": mode, "routes": routes, "swarm": stats, "open_files": open_files, "cpu": cpu}


# --- report -------------------------------------------------------------------------------

# collector.acknowledge (the product's default is spooled): when an export is answered
ANSWERED = {"spooled": "its rows are fsynced in the write-ahead log", "stored": "its rows are committed"}


def render(runs: list[dict], per_port: int, seconds: float, acknowledge: str) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Measured {when} on {os.cpu_count()} cores ({cpu_model()}), Python {platform.python_version()}, by "
        f"`.venv/bin/python -m bench.slow_clients --slow {per_port} --seconds {seconds:g} --acknowledge {acknowledge}`: `servelens up` "
        f"(embedded chDB, no demo traffic) in a subprocess pinned to core {COLLECTOR_CORE}, the slow sockets in "
        f"a second one and the normal client in a third, both pinned to core {CLIENT_CORE}, all on 127.0.0.1; "
        f"\"others\" is the CPU that other processes on the machine took meanwhile. {per_port} slow connections to the OTLP/HTTP "
        f"receiver and {per_port} to the dashboard at once, each replaced as soon as the server closes it. "
        f"Deadlines (core/serving.py): headers {LIMITS.header_timeout:g} s from a request's first byte "
        f"(from accept for a connection's first request), whole request {LIMITS.read_timeout:g} s, idle "
        f"keep-alive {LIMITS.idle_timeout} s. The normal client opens a fresh connection per request, one "
        f"every {PROBE_EVERY * 1e3:.0f} ms, the two routes alternating (POST /v1/traces: 2 spans, answered "
        f"once {ANSWERED[acknowledge]}), latency from connect to the end of the answer, {seconds:g} s per scenario.",
        "",
        "| slow sockets | POST /v1/traces p50 / p99 / max ms | GET /api/v1/health p50 / p99 / max ms "
        "| errors | closed by the server: count (lifetime median / max s) | servelens open files "
        "| CPU cores: servelens / swarm / client / others |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        figures = [run["routes"][key].figures() for key in ("otlp", "health")]
        cells = [f"{f['p50']:.0f} / {f['p99']:.0f} / {f['max']:.0f} (n={f['n']})" if f["n"] else "—" for f in figures]
        errors = sum(f["errors"] for f in figures)
        stats = run["swarm"]
        if stats is None:
            label, closed = "none", "—"
        else:
            life = stats["lifetimes"]
            label = {"drip": f"{2 * per_port}, each dripping 1 header byte/s",
                     "silent": f"{2 * per_port}, connected and silent"}[run["mode"]]
            closed = f"{len(life):,} ({statistics.median(life):.1f} / {max(life):.1f})" if life else "0"
            if stats["failed_connects"]:
                closed += f"; {stats['failed_connects']} connects failed"
        c = run["cpu"]
        cpu = f"{c['servelens']:.2f} / {c.get('swarm', 0):.2f} / {c['probe']:.2f} / {c['others']:.2f}"
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {errors} | {closed} | {run['open_files']:,} | {cpu} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.slow_clients")
    parser.add_argument("--slow", type=int, default=1000, help="slow connections per server (default 1000)")
    parser.add_argument("--seconds", type=float, default=30.0, help="probe time per scenario (default 30)")
    parser.add_argument("--modes", default="none,drip,silent")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    parser.add_argument("--acknowledge", choices=tuple(ANSWERED), default="spooled",
                        help="collector.acknowledge: answer once committed, or once in the write-ahead log")
    args = parser.parse_args(argv)
    _pin(CLIENT_CORE)
    with tempfile.TemporaryDirectory(prefix="servelens-slow-") as scratch:
        server = Servelens(Path(scratch), args.acknowledge)
        try:
            time.sleep(2.0)  # let start-up work settle
            runs = [scenario(server, mode, args.slow, args.seconds) for mode in args.modes.split(",")]
        finally:
            server.stop()
    text = render(runs, args.slow, args.seconds, args.acknowledge)
    print(text)
    if not args.no_write:
        write_section("slow-clients", "Slow clients", text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
