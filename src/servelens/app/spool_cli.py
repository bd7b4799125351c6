"""`servelens spool`: what the collector set aside, and putting it back.

Reads only the spool directory (<data-dir>/spool), never the store, so it runs beside a
running collector, embedded store included. A released batch is inserted again by the
collector (at once in stored mode, within a few seconds in write-ahead mode), under the
token it was quarantined with: rows the store already holds are not doubled.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Any

from servelens.collector.mapping.spans import PROTOBUF_COLUMNS
from servelens.collector.pipeline.spool import Spool
from servelens.core.config import Settings

SHOW_ROWS = 20


def run(action: str, settings: Settings, batch_id: str | None = None, as_json: bool = False) -> int:
    spool = Spool(settings.spool_dir, settings.collector.spool_max_bytes or 1)
    if action == "list":
        return _list(spool, as_json)
    if action == "show":
        return _show(spool, batch_id or "")
    return _release(spool, batch_id)


def _list(spool: Spool, as_json: bool) -> int:
    entries = spool.quarantined()
    if as_json:
        print(json.dumps({"waiting": spool.count, "waiting_bytes": spool.size_bytes, "quarantined": entries}, indent=2))
        return 0
    print(f"waiting to be inserted: {spool.count} batches, {spool.size_bytes:,} bytes")
    if not entries:
        print("quarantined: none")
        return 0
    print(f"quarantined: {len(entries)}")
    for entry in entries:
        when = datetime.fromtimestamp(entry.get("quarantined_at", 0), timezone.utc).isoformat(timespec="seconds")
        rows = ", ".join(f"{n} in {table}" for table, n in entry.get("rows", {}).items())
        print(f"  {entry['id']}  {when}  {rows}\n      {entry.get('reason', '')}")
    return 0


def _show(spool: Spool, batch_id: str) -> int:
    batch = spool.read_quarantined(batch_id)
    if batch is None:
        print(f"servelens: no quarantined batch {batch_id!r} (see `servelens spool list`)", file=sys.stderr)
        return 1
    for table, columns, data in batch.tables:
        print(f"# {table}")
        for row in _rows(columns, data)[:SHOW_ROWS]:
            print(json.dumps(row, default=_plain, ensure_ascii=False))
    return 0


def _release(spool: Spool, batch_id: str | None) -> int:
    ids = [batch_id] if batch_id else [e["id"] for e in spool.quarantined()]
    released = [i for i in ids if spool.release(i)]
    missing = sorted(set(ids) - set(released))
    for i in released:
        print(f"released {i}: the collector inserts it again")
    for i in missing:
        print(f"servelens: no quarantined batch {i!r}", file=sys.stderr)
    return 1 if missing else 0


def _rows(columns: tuple[str, ...], data: list[list[Any]]) -> list[dict[str, Any]]:
    if columns == PROTOBUF_COLUMNS:  # encoded export requests (the engine mapping)
        return [{"request_bytes": len(m), "spans": n, "head": m[:64].hex()} for m, n in zip(*data)]
    return [dict(zip(columns, values)) for values in zip(*data)]


def _plain(value: Any) -> Any:
    return value.hex() if isinstance(value, bytes) else str(value)
