"""Sources for the report jobs, one module per stored domain (requests, traces, GPUs).

The heavy aggregation runs in ClickHouse; Polars receives small pre-aggregated frames
(one row per group, never one per request). Queries bind every value server-side.

`frame` is the one place a store query becomes a Polars frame, so the guards live here:
strings are made valid UTF-8 first (Polars panics on invalid ones); inside
`deadline(seconds)` every query carries the time left as the engine's max_execution_time;
every query spills a large GROUP BY or ORDER BY to disk (SPILL_BYTES);
inside `background()` every query runs on one engine thread, so that work nobody waits on
leaves the cores to the work someone does. `beside(fn, ...)` runs a report's
independent reading on another thread, in the same context.
"""

from __future__ import annotations

import contextvars
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator, TypeVar

import polars as pl
import pyarrow as pa

from servelens.core.store import StoreLike


def stored_run(store: StoreLike, job: str, period_ns: int) -> tuple[int, int] | None:
    """[first, last) ns of the periods (of `period_ns`) that `job` has recorded in
    analytics_results, None when it holds none or they are not one unbroken run (then
    nothing is read from them)."""
    row = store.client().query(
        "SELECT toUnixTimestamp64Nano(min(since)), toUnixTimestamp64Nano(max(until)), uniqExact(since) "
        "FROM analytics_results WHERE report = {job:String}", parameters={"job": job}).first_row
    if not row or not row[2]:
        return None
    lo, hi, count = int(row[0]), int(row[1]), int(row[2])
    return (lo, hi) if (hi - lo) // period_ns == count else None


class DeadlineExceeded(TimeoutError):
    """The caller's deadline passed before the next query could start."""


_DEADLINE: ContextVar[float | None] = ContextVar("analytics_query_deadline", default=None)
_BACKGROUND: ContextVar[bool] = ContextVar("analytics_query_background", default=False)


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Bound every query run by `frame` in this block to what is left of `seconds`."""
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


@contextmanager
def background() -> Iterator[None]:
    """Run every query of this block on one engine thread (the caller's priority is its own)."""
    token = _BACKGROUND.set(True)
    try:
        yield
    finally:
        _BACKGROUND.reset(token)


# A query's GROUP BY or ORDER BY past this much memory goes on in parts on disk: the same
# answer, slower, in bounded memory. What reads raw rows over long windows (a month's
# stages per trace before their hours are stored) held the process at 2.9 GiB and more at
# 10 M requests, 1.1 GiB with this (BENCHMARKS.md, "Dashboard: refreshes that overlap").
SPILL_BYTES = 512 * 1024**2
_SPILL = {"max_bytes_before_external_group_by": SPILL_BYTES, "max_bytes_before_external_sort": SPILL_BYTES}


T = TypeVar("T")
# Long-lived threads: a store keeps a client per thread, and a thread per call would leave
# one behind every time.
_BESIDE = ThreadPoolExecutor(4, thread_name_prefix="report-part")
_IN_BESIDE = threading.local()


def beside(fn: Callable[..., T], *args: Any) -> Future[T]:
    """fn(*args) started on another thread in a copy of this context (the same memo,
    deadline and query priority), for a report whose readings do not depend on one another:
    where a core is free, their time together is the longest's. Called from such a thread,
    fn runs at once on it (a part waiting on a part could otherwise wait for a thread that
    its own waiting holds)."""
    if getattr(_IN_BESIDE, "on", False):
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:  # handed to the caller's .result(), as a thread would
            done.set_exception(exc)
        return done
    return _BESIDE.submit(contextvars.copy_context().run, _marked, fn, *args)


def _marked(fn: Callable[..., T], *args: Any) -> T:
    _IN_BESIDE.on = True
    try:
        return fn(*args)
    finally:
        _IN_BESIDE.on = False


def in_background() -> bool:
    """Whether this block's queries are background work (`background()`)."""
    return _BACKGROUND.get()


def _query_settings(spill_bytes: int | None = None) -> dict[str, Any]:
    spill = _SPILL if spill_bytes is None else dict.fromkeys(_SPILL, spill_bytes)
    settings: dict[str, Any] = {**spill, **({"max_threads": 1} if _BACKGROUND.get() else {})}
    ends = _DEADLINE.get()
    if ends is None:
        return settings
    left = ends - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("the report's deadline passed")
    # The engine stops the query itself: work abandoned by a caller that gave up ends too.
    return {**settings, "max_execution_time": round(max(left, 0.001), 3)}


def frame(store: StoreLike, sql: str, params: dict[str, Any], spill_bytes: int | None = None) -> pl.DataFrame:
    """Run `sql` and return its result as a Polars frame (via Arrow, no row objects).
    `spill_bytes`: where its GROUP BY or ORDER BY goes on on disk (default SPILL_BYTES)."""
    settings = _query_settings(spill_bytes)
    table = store.client().query_arrow(sql, parameters=params, **({"settings": settings} if settings else {}))
    return pl.from_arrow(valid_utf8(table))  # type: ignore[return-value]


# --- Invalid UTF-8 ------------------------------------------------------------------------
# ClickHouse String is bytes: a span attribute that was not valid UTF-8 is stored as sent,
# and Polars panics (pyo3 PanicException) when it turns such a string into Python. Repair
# on the Arrow side rather than wrapping every String column in toValidUTF8 in SQL: the
# check is Arrow's vectorised UTF-8 validation of the (small, aggregated) result, ~7 ms
# per 200 k rows x 4 string columns, it covers strings nested in arrays, tuples and maps
# without knowing each query's columns, and the slow repair (decode with U+FFFD) runs only
# for a chunk that actually holds an invalid sequence.


def valid_utf8(table: pa.Table) -> pa.Table:
    """`table` with every invalid UTF-8 sequence in its strings replaced by U+FFFD."""
    for i, column in enumerate(table.columns):
        if _has_strings(column.type):
            repaired = pa.chunked_array([_repair(chunk) for chunk in column.chunks], type=column.type)
            table = table.set_column(i, table.field(i), repaired)
    return table


def _has_strings(t: pa.DataType) -> bool:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return True
    if pa.types.is_dictionary(t):
        return _has_strings(t.value_type)
    return any(_has_strings(t.field(i).type) for i in range(t.num_fields))


def _repair(chunk: pa.Array) -> pa.Array:
    try:
        chunk.validate(full=True)  # checks UTF-8, nested children included
        return chunk
    except pa.ArrowInvalid:
        pass
    if isinstance(chunk, pa.DictionaryArray):
        return pa.DictionaryArray.from_arrays(chunk.indices, _repair(chunk.dictionary))
    as_bytes = chunk.cast(_binary_twin(chunk.type)).to_pylist()
    return pa.array(_decoded(as_bytes), type=chunk.type)


def _binary_twin(t: pa.DataType) -> pa.DataType:
    """`t` with every string type replaced by its binary counterpart (same layout)."""
    if pa.types.is_string(t):
        return pa.binary()
    if pa.types.is_large_string(t):
        return pa.large_binary()
    if pa.types.is_map(t):
        return pa.map_(_binary_twin(t.key_type), pa.field(t.item_field.name, _binary_twin(t.item_type),
                                                          t.item_field.nullable))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        field = pa.field(t.value_field.name, _binary_twin(t.value_type), t.value_field.nullable)
        return pa.list_(field) if pa.types.is_list(t) else pa.large_list(field)
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _binary_twin(f.type), f.nullable) for f in t])
    return t


def _decoded(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_decoded(v) for v in value)
    if isinstance(value, dict):
        return {k: _decoded(v) for k, v in value.items()}
    return value
