"""The writer's last stage: one insert attempt of one table's block, behind `Sink`.

Every stage before it (queue, durability, retry) speaks to this protocol only, so the
store is the one thing a test replaces. ClickHouseSink inserts column-oriented blocks
through clickhouse-connect, and the engine-mapped requests (columns PROTOBUF_COLUMNS)
as their protobuf bytes, which the engine parses and maps into otel_traces
(collector.mapping.engine_spans). Each insert carries its deduplication token, so the
same block under the same token is stored once however often it is attempted.
"""

from __future__ import annotations

import logging
import struct
import time
from typing import Any, Protocol

from servelens.collector.errors import RowsNotEncodable, describe
from servelens.collector.mapping import engine_spans
from servelens.collector.mapping.spans import PROTOBUF_COLUMNS, block_rows
from servelens.collector.telemetry import SelfMetrics
from servelens.core.store import Store, is_embedded

log = logging.getLogger(__name__)

# Every insert: a request's rows may fall on any day of the retention (a backfill), and
# each day is a partition; the default cap of 100 per insert would refuse such a request
# whatever the retries. batch_size bounds the parts one insert creates.
INSERT_SETTINGS = {"max_partitions_per_insert_block": 0,
                   "deduplicate_blocks_in_dependent_materialized_views": 1}

# What the driver's column encoders raise on a value its column type cannot hold; the
# driver records it while serializing and raises it from insert() (clickhouse_connect's
# transform). Only that one call into the driver is read this way: nothing of ours runs
# inside it, so a builtin error from our own code is never taken for bad rows.
_ENCODER_ERRORS: tuple[type[Exception], ...] = (TypeError, ValueError, OverflowError, struct.error)


class Sink(Protocol):
    def insert(self, token: str, table: str, columns: tuple[str, ...], data: list[list[Any]]) -> None:
        """One attempt to insert one table's block under `token`; raises what the store raised."""

    def available(self) -> bool:
        """Whether the store takes an insert now, whatever any batch's error said."""


# Engine-mapped blocks of fewer spans than this are mapped in Python instead, where that
# gives the same rows (engine_spans.as_rows): the view's analysis is most of a small
# insert's CPU, and below about 4,096 spans the Python mapping costs less than it does
# (BENCHMARKS.md, "Small blocks mapped in Python"). A lone request reaches the reports sooner.
ENGINE_FROM_SPANS = 4096


class ClickHouseSink:
    def __init__(self, store: Store, metrics: SelfMetrics, engine_from: int = ENGINE_FROM_SPANS) -> None:
        """`engine_from`: spans from which an engine-mapped block is mapped by the engine
        (0: always)."""
        self._store = store
        self._metrics = metrics
        self._engine_from = engine_from
        self._protobuf_settings = engine_spans.insert_settings(is_embedded(store.url))

    def insert(self, token: str, table: str, columns: tuple[str, ...], data: list[list[Any]]) -> None:
        settings = {"insert_deduplication_token": f"{token}:{table}", **INSERT_SETTINGS}
        engine_mapped = columns == PROTOBUF_COLUMNS
        label = "otel_traces" if engine_mapped else table
        started = time.perf_counter()
        try:
            rows = engine_spans.as_rows(data[0]) if engine_mapped and sum(data[1]) < self._engine_from else None
            if rows is not None:
                self._insert_rows(rows.table, rows.columns, rows.data,
                                  {**settings, "insert_deduplication_token": f"{token}:{rows.table}"})
            elif engine_mapped:
                body = engine_spans.frame(data[0])
                self._store.client().raw_insert(table, None, body, fmt="Protobuf",
                                                settings={**self._protobuf_settings, **settings})
            else:
                self._insert_rows(table, columns, data, settings)
        except Exception:
            self._metrics.write_errors.labels(label).inc()
            raise
        self._metrics.write_seconds.labels(label).observe(time.perf_counter() - started)
        self._metrics.written.labels(label).inc(block_rows(columns, data))

    def _insert_rows(self, table: str, columns: tuple[str, ...], data: list[list[Any]],
                     settings: dict[str, Any]) -> None:
        try:
            self._store.client().insert(table, data, column_names=list(columns), column_oriented=True,
                                        settings=settings)
        except _ENCODER_ERRORS as exc:
            raise RowsNotEncodable(f"{table}: {describe(exc)}") from exc

    def available(self) -> bool:
        """One row into ingest_probe (migrations/0013)."""
        try:
            self._store.client().command("INSERT INTO ingest_probe (Timestamp) VALUES (now())")
        except Exception as exc:  # noqa: BLE001 - any failure means unavailable
            log.info("store probe failed: %s", describe(exc))
            return False
        return True
