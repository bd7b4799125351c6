"""Run-scoped memo: within one run of the report jobs, an aggregate several jobs need (the
GPU frames behind every self-hosted cost, the stage quantiles behind `stages` and the
overview's binding constraint) is computed once.

Outside `with run():` nothing is cached: an API call or a single report computes from
the store every time. Inside, results are keyed by everything they depend on (the
function, the store and settings objects, the window, filters and grouping), and live
only until the block ends, so a cached value is never older than the run that uses it.
The memo is a ContextVar: each thread (the scheduler's, a request's) has its own, unless
threads join one Memo on purpose (`joined`: the dashboard's refreshes that overlap in
time, dashboard.data.one_reading); then a value one thread is computing is waited for,
not computed twice.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Hashable, Iterator, TypeVar

T = TypeVar("T")


class Memo:
    """The values of one run, safe to share between threads."""

    def __init__(self) -> None:
        self._values: dict[Hashable, Any] = {}
        self._pending: dict[Hashable, Future] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        with self._lock:
            return self._values.get(key)

    def cached(self, key: Hashable, compute: Callable[[], T]) -> T:
        with self._lock:
            if key in self._values:
                return self._values[key]  # type: ignore[no-any-return]
            pending = self._pending.get(key)
            if pending is None:
                pending = self._pending[key] = Future()
                owner = True
            else:
                owner = False
        if not owner:
            # No wait cycle: a computation asks for the same keys whoever runs it, and one
            # that needed itself would recurse forever in a single thread too.
            return pending.result()  # type: ignore[no-any-return]
        try:
            value = compute()
        except BaseException as exc:
            with self._lock:
                del self._pending[key]  # the next reader tries again
            pending.set_exception(exc)
            raise
        with self._lock:
            self._values[key] = value
            del self._pending[key]
        pending.set_result(value)
        return value


_MEMO: ContextVar[Memo | None] = ContextVar("analytics_run_memo", default=None)


@contextmanager
def run() -> Iterator[None]:
    """Share aggregates between the jobs computed inside this block (nested blocks join
    the outer one)."""
    if _MEMO.get() is not None:
        yield
        return
    with joined(Memo()):
        yield


@contextmanager
def joined(shared: Memo) -> Iterator[None]:
    """Run this block in `shared`, a Memo other threads may be using at the same time."""
    token = _MEMO.set(shared)
    try:
        yield
    finally:
        _MEMO.reset(token)


def active() -> bool:
    return _MEMO.get() is not None


def get(key: Hashable) -> Any:
    """The value this run holds for `key`, None if none (or outside run())."""
    memo = _MEMO.get()
    return None if memo is None else memo.get(key)


def cached(key: Hashable, compute: Callable[[], T]) -> T:
    """compute(), or inside run() the value computed earlier for the same key."""
    memo = _MEMO.get()
    return compute() if memo is None else memo.cached(key, compute)


def key(name: str, store: object, settings: Any, *parts: Hashable) -> tuple[Hashable, ...]:
    """A memo key: the function, the store and settings objects (by identity: one run
    uses one of each) and the arguments that shape the result."""
    return (name, id(store), id(settings), *parts)
