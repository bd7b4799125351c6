"""Run-scoped memo: within one run of the report jobs, an aggregate several jobs need (the
GPU frames behind every self-hosted cost, the stage quantiles behind `stages` and the
overview's binding constraint) is computed once.

Outside `with run():` nothing is cached: an API call or a single report computes from
the store every time. Inside, results are keyed by everything they depend on (the
function, the store and settings objects, the window, filters and grouping), and live
only until the block ends, so a cached value is never older than the run that uses it.
The memo is a ContextVar: each thread (the scheduler's, a request's) has its own.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Hashable, Iterator, TypeVar

T = TypeVar("T")

_MEMO: ContextVar[dict[Hashable, Any] | None] = ContextVar("analytics_run_memo", default=None)


@contextmanager
def run() -> Iterator[None]:
    """Share aggregates between the jobs computed inside this block (nested blocks join
    the outer one)."""
    if _MEMO.get() is not None:
        yield
        return
    token = _MEMO.set({})
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
    if memo is None:
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]  # type: ignore[no-any-return]


def key(name: str, store: object, settings: Any, *parts: Hashable) -> tuple[Hashable, ...]:
    """A memo key: the function, the store and settings objects (by identity: one run
    uses one of each) and the arguments that shape the result."""
    return (name, id(store), id(settings), *parts)
