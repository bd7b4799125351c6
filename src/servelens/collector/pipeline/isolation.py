"""Finding the rows a store will not take, so that every other row of their block goes in.

A block that keeps failing while the store is available is split in halves, each half
inserted on its own, recursively, down to single rows: a few bad rows among n cost about
2·log2(n) inserts each. A bounded number of inserts per block keeps a block of nothing
but bad rows from costing n; what is left then is set aside in pieces larger than a row.

Every piece is inserted under a token derived from its block's and its place in the
bisection, so the same block bisected again (after a crash, or by a replay) produces
the same pieces under the same tokens, and the store's deduplication skips the pieces it
already has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from servelens.collector.errors import describe, is_data_error
from servelens.collector.mapping import engine_spans
from servelens.collector.mapping.decode import PayloadError
from servelens.collector.mapping.spans import PROTOBUF_COLUMNS, block_rows

# [(table, columns, column-oriented data), ...], as collector.spool keeps it
Tables = list[tuple[str, tuple[str, ...], list[list[Any]]]]
# One insert attempt of one table's block under a token; raises when the store refuses.
InsertOne = Callable[[str, str, tuple[str, ...], list[list[Any]]], None]

MAX_INSERTS_PER_BLOCK = 64


class StoreUnavailable(Exception):
    """The store stopped answering during the bisection: retry the whole block later."""


@dataclass(frozen=True)
class Rejected:
    """Rows the store refused on their own, with why."""

    table: str
    columns: tuple[str, ...]
    data: list[list[Any]]
    reason: str

    @property
    def rows(self) -> int:
        return block_rows(self.columns, self.data)


def isolate(tables: Tables, token: str, insert: InsertOne, available: Callable[[BaseException], bool],
            max_inserts: int = MAX_INSERTS_PER_BLOCK) -> list[Rejected]:
    """Insert every row of `tables` the store takes; returns the rows it refused.

    Called once the whole block has failed while the store answered. Each table's block
    is tried whole first, under the block's token: one the store took before (a block's
    tables are separate inserts) is deduplicated, not split into doubles. Raises
    StoreUnavailable when a piece fails and `available(error)` then says the store is down."""
    rejected: list[Rejected] = []
    for table, columns, data in tables:
        _bisect(table, columns, data, token, None, insert, available, [max_inserts], rejected)
    return rejected


def _bisect(table: str, columns: tuple[str, ...], data: list[list[Any]], token: str, error: BaseException | None,
            insert: InsertOne, available: Callable[[BaseException], bool], budget: list[int], rejected: list[Rejected]) -> None:
    """`error`: how this piece failed, or None when it has not been tried on its own yet."""
    n = len(data[0]) if data else 0
    if n == 0:
        return
    if error is None:
        error = _attempt(table, columns, data, token, insert, budget)
        if error is None:
            return
        if not available(error):
            raise StoreUnavailable(describe(error))
    if n == 1:
        error = _repair(table, columns, data, token, error, insert, budget)
        if error is not None:
            rejected.append(Rejected(table, columns, data, describe(error)))
        return
    # Only a data error is raised before any part is written; after another, a view may
    # already hold the piece, and halves under new tokens would double it there.
    if budget[0] <= 0 or not is_data_error(error):
        rejected.append(Rejected(table, columns, data, describe(error)))
        return
    half = n // 2
    for part, (lo, hi) in enumerate(((0, half), (half, n))):
        piece = [column[lo:hi] for column in data]
        _bisect(table, columns, piece, f"{token}.{part}", None, insert, available, budget, rejected)


def _attempt(table: str, columns: tuple[str, ...], data: list[list[Any]], token: str, insert: InsertOne,
             budget: list[int]) -> BaseException | None:
    budget[0] -= 1
    try:
        insert(token, table, columns, data)
    except Exception as exc:  # noqa: BLE001 - any refusal is the piece's, once the store answers
        return exc
    return None


def _repair(table: str, columns: tuple[str, ...], data: list[list[Any]], token: str, error: BaseException,
            insert: InsertOne, budget: list[int]) -> BaseException | None:
    """One row the store refused: an engine-mapped request goes again as the full OTLP
    parser reads it (collector.engine_spans.canonical). Returns the error when it still fails."""
    if columns != PROTOBUF_COLUMNS:
        return error
    try:
        message = engine_spans.canonical(data[0][0])
    except PayloadError as exc:
        return exc
    if message == data[0][0]:
        return error
    return _attempt(table, columns, [[message], data[1]], f"{token}.r", insert, budget)
