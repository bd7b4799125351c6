"""The writer's chain against an in-memory Sink that fails on demand (pipeline.sink).

The sink keeps what it takes by insert-deduplication token, as ClickHouse does, so a
block inserted twice under one token is stored once; it fails as a store does: an
outage (every insert and the probe fail), rows it refuses as bad data (a data error),
or a block whose insert throws while the store answers (a view that throws). The real
spool is on disk under tmp_path; the chDB fault tests are the end-to-end checks.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from clickhouse_connect.driver.exceptions import DataError, OperationalError

from servelens.collector.errors import Busy, DataRejected, WriteFailed
from servelens.collector.intake import ROOM_WAIT_SECONDS, Intake
from servelens.collector.mapping.spans import Batch
from servelens.collector.pipeline.spool import Spool, SpooledBatch
from servelens.collector.pipeline.writer import Writer, WriterSettings
from servelens.collector.telemetry import SelfMetrics

COLUMNS = ("name", "n")


class MemorySink:
    def __init__(self) -> None:
        self.down = False  # an outage: inserts and the probe fail
        self.refused: set[str] = set()  # names refused as bad data (before any part is written)
        self.throwing: set[str] = set()  # names whose block is written, then its insert throws
        self.take_then_fail = 0  # the next inserts are stored, and then fail (a lost answer)
        self.gate = threading.Event()  # cleared: inserts wait for it
        self.gate.set()
        self.stored: dict[str, list[tuple[Any, ...]]] = {}  # by "token:table", first insert wins
        self.attempts: list[tuple[str, int]] = []  # (token:table, rows) per attempt
        self._lock = threading.Lock()

    def insert(self, token: str, table: str, columns: tuple[str, ...], data: list[list[Any]]) -> None:
        self.gate.wait(10)
        key = f"{token}:{table}"
        with self._lock:
            self.attempts.append((key, len(data[0])))
        if self.down:
            raise OperationalError("connection refused")
        names = set(data[columns.index("name")])
        if names & self.refused:
            raise DataError(f"refused: {sorted(names & self.refused)}")
        with self._lock:
            self.stored.setdefault(key, list(zip(*data)))
        if names & self.throwing:
            raise OperationalError("a view threw")
        if self.take_then_fail:
            self.take_then_fail -= 1
            raise OperationalError("timed out after the commit")

    def available(self) -> bool:
        return not self.down

    def names(self) -> list[str]:
        """Every stored row's name, in the order the blocks were stored."""
        return [row[0] for rows in self.stored.values() for row in rows]


def batch(*names: str) -> Batch:
    return Batch("t", COLUMNS, [list(names), list(range(len(names)))])


@pytest.fixture
def sink() -> MemorySink:
    return MemorySink()


@pytest.fixture
def make_writer(sink: MemorySink, tmp_path: Path) -> Iterator:
    started: list[Writer] = []

    def build(spool: bool = True, **settings: Any) -> Writer:
        base = {"flush_interval": 0.02, "store_retry": 0.05, "linger": 0.05}
        base.update(settings)
        writer = Writer(None, WriterSettings(**base), spool=Spool(tmp_path / "spool", 1 << 24) if spool else None,
                        sink=sink)
        writer.start()
        started.append(writer)
        return writer

    yield build
    sink.down, sink.refused, sink.throwing = False, set(), set()
    sink.gate.set()
    for writer in started:
        writer.shutdown(5)


def test_requests_queued_while_an_insert_runs_go_in_as_one_group(make_writer, sink) -> None:
    writer = make_writer()
    sink.gate.clear()  # the first insert holds
    first = writer.submit([batch("a")])
    time.sleep(0.1)  # taken: the others queue behind it
    rest = [writer.submit([batch(f"b{i}", f"c{i}")]) for i in range(4)]
    sink.gate.set()
    assert first.wait(5) and all(t.wait(5) for t in rest)
    assert [rows for _, rows in sink.attempts] == [1, 8]
    assert sink.names() == ["a", "b0", "c0", "b1", "c1", "b2", "c2", "b3", "c3"]


def test_a_group_stops_growing_at_batch_size(make_writer, sink) -> None:
    writer = make_writer(batch_size=4, flush_interval=0.5)
    sink.gate.clear()
    tickets = [writer.submit([batch(f"x{i}", f"y{i}")]) for i in range(4)]
    sink.gate.set()
    assert all(t.wait(5) for t in tickets)
    assert [rows for _, rows in sink.attempts] == [4, 4]


@pytest.mark.parametrize("acknowledge", ["stored", "spooled"])
def test_an_outage_is_acknowledged_from_the_spool_and_replayed_in_order(make_writer, sink, acknowledge) -> None:
    writer = make_writer(acknowledge=acknowledge, flush_interval=0.0)
    sink.down = True
    for i in range(6):
        assert writer.submit([batch(f"r{i}")]).wait(5)  # durable: in the spool
    assert writer._spool.count >= 1 and not sink.stored
    sink.down = False
    assert writer.drain_spool(10)
    assert sink.names() == [f"r{i}" for i in range(6)]


def test_write_ahead_holds_at_most_two_inserts_of_rows_in_memory_and_reads_the_rest_back(make_writer, sink) -> None:
    """A backlog of logged requests while an insert runs stays on disk past two inserts'
    worth of rows (the collector's memory), and is inserted in order all the same."""
    writer = make_writer(acknowledge="spooled", batch_size=4, flush_interval=0.0, linger=0.0)
    sink.gate.clear()  # the first insert holds; the log grows behind it
    for i in range(20):
        assert writer.submit([batch(f"a{i}", f"b{i}")]).wait(5)  # acknowledged once logged
    backlog = writer._replayer._backlog
    held = [b for b in backlog.handed if isinstance(b, SpooledBatch)]
    assert sum(b.rows for b in held) <= 8 and len(held) < len(backlog.handed)
    sink.gate.set()
    assert writer.drain_spool(10)
    assert sink.names() == [n for i in range(20) for n in (f"a{i}", f"b{i}")]
    assert backlog._held == 0


def test_a_request_finding_no_room_waits_for_some_before_it_is_refused(make_writer, sink) -> None:
    """A full queue answers 503 only after ROOM_WAIT_SECONDS without room: a client that
    retries at once then waits instead of spinning on refusals (intake.make_room)."""
    writer = make_writer(acknowledge="stored", queue_size=1, flush_interval=0.0)
    intake = Intake(writer, SelfMetrics(), ("app.tenant",))
    sink.gate.clear()  # the writer holds its insert; the next group fills the queue
    tickets = [writer.submit([batch("held")])]
    while writer.depth:  # taken: the writer waits at the gate
        time.sleep(0.001)
    tickets.append(writer.submit([batch("queued")]))
    assert writer.no_room() is not None

    started = time.monotonic()
    threading.Timer(0.2, sink.gate.set).start()  # room once the insert is let through
    intake.make_room("traces", "http")
    assert 0.15 < time.monotonic() - started < ROOM_WAIT_SECONDS
    assert all(t.wait(5) for t in tickets)

    sink.gate.clear()
    tickets = [writer.submit([batch("held again")])]
    while writer.depth:
        time.sleep(0.001)
    tickets.append(writer.submit([batch("queued again")]))
    started = time.monotonic()
    with pytest.raises(Busy):
        intake.make_room("traces", "http")
    assert time.monotonic() - started >= ROOM_WAIT_SECONDS
    sink.gate.set()
    assert all(t.wait(5) for t in tickets)


def test_without_a_spool_an_outage_fails_the_request_as_availability(make_writer, sink) -> None:
    writer = make_writer(spool=False)
    sink.down = True
    with pytest.raises(WriteFailed) as failed:
        writer.submit([batch("lost")]).wait(5)
    assert not isinstance(failed.value, DataRejected)  # 503: the client keeps it and retries


def test_a_replay_reuses_the_token_of_the_insert_the_store_took(make_writer, sink) -> None:
    """The store committed, its answer was lost, then it went down: the spooled batch is
    replayed under the same token, and the store keeps one copy."""
    writer = make_writer()
    sink.take_then_fail = 1
    ticket = writer.submit([batch("once")])

    def outage_after_first_attempt() -> None:
        while not sink.attempts:
            time.sleep(0.001)
        sink.down = True

    threading.Thread(target=outage_after_first_attempt).start()
    assert ticket.wait(5)
    assert writer._spool.count == 1
    sink.down = False
    assert writer.drain_spool(10)
    tokens = {key for key, _ in sink.attempts}
    assert len(tokens) == 1  # every attempt, the replay's too, under one token
    assert sink.names() == ["once"]


def test_stored_mode_answers_refused_rows_as_partial_success_and_stores_the_rest(make_writer, sink) -> None:
    writer = make_writer()
    sink.refused = {"bad"}
    sink.gate.clear()
    mixed = writer.submit([batch("g1", "bad", "g2", "g3")])
    neighbour = writer.submit([batch("n1")])
    only_bad = writer.submit([batch("bad")])
    sink.gate.set()
    assert mixed.wait(5) and mixed.rejected == 1 and "refused by the store" in mixed.message
    assert neighbour.wait(5)
    with pytest.raises(DataRejected):
        only_bad.wait(5)
    assert sorted(sink.names()) == ["g1", "g2", "g3", "n1"]
    assert writer._spool.count == 0 and writer._spool.quarantined() == []


def test_write_ahead_quarantines_only_the_refused_rows_and_goes_on(make_writer, sink) -> None:
    writer = make_writer(acknowledge="spooled", linger=0.5)
    sink.refused = {"bad"}
    for names in (("a", "b"), ("c", "bad", "d"), ("e",)):  # within one linger: one group
        assert writer.submit([batch(*names)]).wait(5)
    assert writer.drain_spool(10)
    assert sorted(sink.names()) == ["a", "b", "c", "d", "e"]
    [entry] = writer._spool.quarantined()
    assert entry["rows"] == {"t": 1}
    [kept] = [writer._spool.read_quarantined(entry["id"])]
    assert kept.tables[0][2][0] == ["bad"]


def test_write_ahead_inserts_a_lone_request_at_once_and_groups_a_trickle_for_the_linger(make_writer, sink) -> None:
    """The linger is a rest after an insert that others queued behind, not a wait for each
    request: a request logged when the inserter was idle with nothing behind it goes in
    without waiting the linger; requests logged while an insert ran wait the linger after it
    for more, and go in as one group."""
    writer = make_writer(acknowledge="spooled", flush_interval=0.0, linger=1.0)
    assert writer.submit([batch("start")]).wait(5)  # a fresh writer rests one linger first
    assert writer.drain_spool(5)
    time.sleep(0.1)
    logged = time.monotonic()
    assert writer.submit([batch("lone")]).wait(5)
    assert writer.drain_spool(5)
    assert time.monotonic() - logged < 0.5  # far from the linger (1 s)
    sink.gate.clear()  # the next insert holds; two more requests queue behind it
    assert writer.submit([batch("held")]).wait(5)
    time.sleep(0.1)
    assert writer.submit([batch("t1")]).wait(5) and writer.submit([batch("t2")]).wait(5)
    sink.gate.set()
    time.sleep(0.3)  # the held insert is done; the two behind it rest for the linger
    assert sink.names() == ["start", "lone", "held"]
    assert writer.submit([batch("t3")]).wait(5)  # within that rest: the same group
    assert writer.drain_spool(5)
    assert [rows for _, rows in sink.attempts][-1] == 3
    assert sink.names() == ["start", "lone", "held", "t1", "t2", "t3"]


def test_a_block_that_throws_while_the_store_answers_is_kept_whole_under_its_token(make_writer, sink) -> None:
    """An error no list names, the store up: after three attempts the block is set aside
    whole, with the token its release will use (test_poison releases one in chDB)."""
    writer = make_writer(acknowledge="spooled")
    sink.throwing = {"poison"}
    assert writer.submit([batch("x", "poison")]).wait(5)
    assert writer.drain_spool(10)
    [entry] = writer._spool.quarantined()
    assert "kept whole" in entry["reason"]
    attempts = {key for key, _ in sink.attempts}
    assert len(attempts) == 1 and len(sink.attempts) == 3  # the same block, same token, three times
    assert writer._spool.read_quarantined(entry["id"]).token == next(iter(attempts)).split(":")[0]
    assert writer.submit([batch("next")]).wait(5) and writer.drain_spool(10)  # the log goes on
    assert sink.names() == ["x", "poison", "next"]  # the part the table took before the throw, then the rest


def test_a_group_recorded_before_a_crash_is_inserted_again_under_its_token(sink, tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", 1 << 24)
    batches = [spool.append(f"token{i}", [("t", COLUMNS, [[f"r{i}"], [i]])]) for i in range(3)]
    spool.begin_group("group-token", batches[:2])  # recorded; the crash came before its removal
    writer = Writer(None, WriterSettings(acknowledge="spooled", linger=0.0), spool=Spool(tmp_path / "spool", 1 << 24),
                    sink=sink)
    writer.start()
    try:
        assert writer.drain_spool(10)
    finally:
        writer.shutdown(5)
    assert [key for key, _ in sink.attempts] == ["group-token:t", "token2:t"]
    assert sink.names() == ["r0", "r1", "r2"]


def test_shutdown_inserts_the_whole_log(sink, tmp_path: Path) -> None:
    writer = Writer(None, WriterSettings(acknowledge="spooled", linger=10.0), spool=Spool(tmp_path / "s", 1 << 24),
                    sink=sink)
    writer.start()
    for i in range(5):
        assert writer.submit([batch(f"w{i}")]).wait(5)
    writer.shutdown(10)  # no drain first: the linger does not hold the shutdown
    assert sink.names() == [f"w{i}" for i in range(5)]


def test_a_coding_error_in_a_stage_refuses_the_group_as_availability_not_as_bad_data(make_writer, sink) -> None:
    writer = make_writer()
    # batches the mapping got wrong (a column short; no columns at all): the group's
    # merge and the queue's count raise builtin errors, which are the writer's, not the rows'
    for broken in ([Batch("t", COLUMNS, [["a"]]), batch("b")], [Batch("t", COLUMNS, 5)]):  # type: ignore[arg-type]
        with pytest.raises(WriteFailed) as failed:
            writer.submit(broken).wait(5)
        assert not isinstance(failed.value, DataRejected)
        assert isinstance(failed.value.__cause__, WriteFailed) and "writer error" in str(failed.value)
    assert writer._spool.count == 0 and writer._spool.quarantined() == []
    assert writer.submit([batch("after")]).wait(5)  # the writer goes on
    assert sink.names() == ["after"]
