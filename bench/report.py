"""What the benchmarks share: the machine line, their own section of BENCHMARKS.md, a
fleet directory opened, and a median time."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable

from servelens.core.config import Settings, load
from servelens.core.store import Store

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def write_section(name: str, title: str, section: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace the `name` section between its markers, keeping the rest of the file
    (re-read right before writing: each benchmark owns one section)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{section}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n## {title}\n\n" + block + "\n"
    path.write_text(text)


def open_fleet(directory: str | Path) -> tuple[Settings, Store]:
    """The settings and store of a bench.fleet_data directory."""
    settings = load(Path(directory) / "servelens.yaml")
    return settings, Store(settings.store_url, settings.store.database)


def median_after_first(fn: Callable[[], Any], runs: int = 4) -> tuple[float, Any]:
    """Median wall seconds of `fn` over `runs` calls, the first left out (it fills the
    caches), and the last call's answer."""
    seconds, out = [], None
    for _ in range(runs):
        started = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds[1:]), out


class QueryLog:
    """Wall seconds and text of every query `store`'s clients send while installed (the
    client class is patched: one client per thread, all of them counted)."""

    def __init__(self, store: Store) -> None:
        self._class = type(store.client())
        self._original = self._class.raw_query
        self.entries: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> QueryLog:
        original, entries, lock = self._original, self.entries, self._lock

        def timed(client: Any, query: str, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(client, query, *args, **kwargs)
            finally:
                with lock:
                    entries.append((time.perf_counter() - started, " ".join(query.split())))
        self._class.raw_query = timed
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._class.raw_query = self._original
