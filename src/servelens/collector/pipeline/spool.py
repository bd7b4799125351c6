"""The ingest spool: acknowledged batches the store could not take yet, on disk, in order.

One file per batch, written to a temporary name, fsynced, then renamed (and the directory
fsynced), so a file either exists whole or not at all: a crash or `kill -9` after the
writer acknowledged a batch cannot lose it. Files are replayed oldest first with the
batch's insert-deduplication token, so a replay of a batch the store did take is a no-op.

Spool files are only ever read back by servelens from its own data directory; the
payload is a pickle of plain lists, dicts, strings and numbers, framed with a length and
CRC32 so a damaged file is detected and set aside instead of replayed.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelens.collector.mapping.spans import block_rows

log = logging.getLogger(__name__)

_MAGIC = b"SLSPOOL1"
_HEADER = struct.Struct(">8sIQ")  # magic, crc32, payload length
_SUFFIX = ".batch"
_GROUP = ".group"

# [(table, columns, column-oriented data), ...]
Tables = list[tuple[str, tuple[str, ...], list[list[Any]]]]


@dataclass(frozen=True)
class SpooledBatch:
    path: Path
    token: str
    tables: Tables

    @property
    def rows(self) -> int:
        return max((block_rows(columns, data) for _, columns, data in self.tables), default=0)


class Spool:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._refused_at: int | None = None  # the size at which an append last did not fit
        self._seq = time.time_ns()
        for leftover in self.directory.glob("*.tmp"):
            # never renamed, so never acknowledged: the client was told to retry
            leftover.unlink(missing_ok=True)
        self._bytes = 0
        self._count = 0
        self._recount()

    def _files(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{_SUFFIX}"))

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def count(self) -> int:
        return self._count

    @property
    def full(self) -> bool:
        """An append did not fit, and nothing has been removed since."""
        refused_at = self._refused_at
        return refused_at is not None and self._bytes >= refused_at

    def append(self, token: str, tables: Tables) -> SpooledBatch | None:
        """Durably store a batch; None (nothing written) when it would exceed max_bytes."""
        blob = _frame(token, tables)
        with self._lock:
            if self._bytes + len(blob) > self.max_bytes:
                self._refused_at = self._bytes
                return None
            self._refused_at = None
            self._seq = max(self._seq + 1, time.time_ns())
            final = self.directory / f"{self._seq:020d}-{token}{_SUFFIX}"
            tmp = final.with_suffix(".tmp")
            with open(tmp, "wb") as fh:
                fh.write(blob)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
            _fsync_dir(self.directory)
            self._bytes += len(blob)
            self._count += 1
        return SpooledBatch(final, token, tables)

    def oldest(self) -> SpooledBatch | None:
        """The oldest readable batch; damaged files are moved to corrupt/ and skipped."""
        for path in self._files():
            batch = self.read(path)
            if batch is not None:
                return batch
        return None

    def listing(self) -> list[Path]:
        """The batch files, oldest first."""
        return self._files()

    def read(self, path: Path) -> SpooledBatch | None:
        """One batch file; None when it is gone or damaged (moved to corrupt/)."""
        try:
            blob = path.read_bytes()
            magic, crc, length = _HEADER.unpack_from(blob)
            payload = memoryview(blob)[_HEADER.size:]  # not copied: a batch is megabytes
            if magic != _MAGIC or len(payload) != length or zlib.crc32(payload) != crc:
                raise ValueError("bad frame")
            token, tables = pickle.loads(payload)  # noqa: S301 - our own fsynced file
        except FileNotFoundError:
            return None
        except (OSError, ValueError, struct.error, pickle.UnpicklingError, EOFError) as exc:
            self._set_aside(path, f"damaged ({exc})")
            return None
        return SpooledBatch(path, token, tables)

    # Groups: several batches inserted as one, under one token. The group is written down
    # (fsynced) before its insert, so a replay after a crash inserts exactly that group
    # again, under that token, and the store's deduplication recognises it.
    def begin_group(self, token: str, batches: list[SpooledBatch]) -> Path:
        path = self.directory / f"{batches[0].path.stem}{_GROUP}"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump({"token": token, "files": [b.path.name for b in batches]}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.directory)
        return path

    def end_group(self, group: Path, batches: list[SpooledBatch]) -> None:
        for batch in batches:
            self.remove(batch)
        group.unlink(missing_ok=True)

    def open_groups(self) -> list[tuple[Path, str, list[Path]]]:
        """Groups begun and not ended (a crash between their insert and their removal)."""
        out = []
        for path in sorted(self.directory.glob(f"*{_GROUP}")):
            try:
                meta = json.loads(path.read_text())
                out.append((path, str(meta["token"]), [self.directory / name for name in meta["files"]]))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("spool group %s unreadable (%s); its batches replay one by one", path.name, exc)
                path.unlink(missing_ok=True)
        return out

    # Quarantine: acknowledged rows the store refused on their own (collector.isolation),
    # kept with why, so the batches behind them go on. `servelens spool` lists them and
    # releases them back into the spool, to be inserted again once the cause is fixed.
    @property
    def quarantine_dir(self) -> Path:
        return self.directory / "quarantine"

    def quarantine_rows(self, token: str, tables: Tables, reason: str) -> Path:
        """Durably keep refused rows apart; the same token again replaces its file (a
        batch isolated twice, after a crash, is quarantined once)."""
        self.quarantine_dir.mkdir(exist_ok=True)
        path = self.quarantine_dir / f"{time.time_ns():020d}-{token}{_SUFFIX}"
        for earlier in self.quarantine_dir.glob(f"*-{token}{_SUFFIX}"):
            earlier.unlink(missing_ok=True)
            earlier.with_suffix(".json").unlink(missing_ok=True)
        note = {"token": token, "reason": reason, "quarantined_at": time.time(),
                "rows": {table: block_rows(columns, data) for table, columns, data in tables}}
        _write_durably(path.with_suffix(".json"), json.dumps(note).encode())
        _write_durably(path, _frame(token, tables))
        _fsync_dir(self.quarantine_dir)
        log.error("quarantined %s rows the store refused (%s) in %s", sum(note["rows"].values()), reason, path)
        return path

    def quarantined(self) -> list[dict[str, Any]]:
        """The quarantined batches, oldest first: id, token, reason, time, rows per table."""
        out = []
        for path in sorted(self.quarantine_dir.glob(f"*{_SUFFIX}")) if self.quarantine_dir.is_dir() else []:
            try:
                note = json.loads(path.with_suffix(".json").read_text())
            except (OSError, ValueError):
                note = {"reason": "(note missing)", "rows": {}}
            out.append({"id": path.stem, "bytes": path.stat().st_size, **note})
        return out

    def read_quarantined(self, batch_id: str) -> SpooledBatch | None:
        path = self.quarantine_dir / f"{Path(batch_id).name}{_SUFFIX}"
        return self.read(path) if path.is_file() else None

    def release(self, batch_id: str) -> bool:
        """Put a quarantined batch back in the spool, to be inserted again (in order of
        its name: before what was logged after it)."""
        path = self.quarantine_dir / f"{Path(batch_id).name}{_SUFFIX}"
        if not path.is_file():
            return False
        os.replace(path, self.directory / path.name)
        path.with_suffix(".json").unlink(missing_ok=True)
        _fsync_dir(self.directory)
        self._recount()
        return True

    def _set_aside(self, path: Path, reason: str) -> None:
        log.error("spool file %s %s; moved to %s", path.name, reason, self.directory / "corrupt")
        corrupt = self.directory / "corrupt"
        corrupt.mkdir(exist_ok=True)
        os.replace(path, corrupt / path.name)
        self._recount()

    def remove(self, batch: SpooledBatch) -> None:
        with self._lock:
            size = batch.path.stat().st_size if batch.path.exists() else 0
            if batch.path.exists():
                batch.path.unlink()
                self._count -= 1
            self._bytes = max(0, self._bytes - size)

    def _recount(self) -> None:
        with self._lock:
            files = self._files()
            self._bytes = sum(p.stat().st_size for p in files)
            self._count = len(files)


def quarantine_summary(spool_dir: Path) -> dict[str, int]:
    """Batches and rows in `spool_dir`'s quarantine, from their notes alone (a reader's
    view: creates nothing, safe beside a running collector)."""
    batches = rows = 0
    directory = Path(spool_dir) / "quarantine"
    for note in directory.glob("*.json") if directory.is_dir() else ():
        try:
            rows += sum(int(n) for n in json.loads(note.read_text()).get("rows", {}).values())
        except (OSError, ValueError, TypeError, AttributeError):
            pass
        batches += 1
    return {"quarantined_batches": batches, "quarantined_rows": rows}


def _frame(token: str, tables: Tables) -> bytes:
    payload = pickle.dumps((token, tables), protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(_MAGIC, zlib.crc32(payload), len(payload)) + payload


def _write_durably(path: Path, blob: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(blob)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
