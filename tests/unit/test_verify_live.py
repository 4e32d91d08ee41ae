"""The live readers of ``sparkonce verify`` (sparkonce.verify.live): their checks on made-up
observations, and a real SQLite store read while a planted sink commits, crashes and
rolls back. No Spark (the verify run with live readers: tests/verify/test_live.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import types as T

from sparkonce.faults import FaultPlan
from sparkonce.ledger.base import BatchContext, LedgerEntry
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.protocol import CrashPoint
from sparkonce.sinks.sql import SQLiteSink
from sparkonce.verify.compare import diff_rows
from sparkonce.verify.live import (
    LiveCheck,
    LiveReader,
    LiveStore,
    Observation,
    OutputSpec,
    SqlReader,
    StoreReader,
)
from sparkonce.verify.sim.world import SimCrash
from tests.verify.broken_sink import VisibleBeforeCommitSink

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
BATCHES = [[(i, f"v{i}") for i in range(b * 3, b * 3 + 3)] for b in range(3)]
ORACLE = [{"id": i, "v": v} for batch in BATCHES for i, v in batch]


def _ranges(b: int) -> BatchRanges:
    return BatchRanges((OffsetRange("t", 0, b * 3, b * 3 + 3),))


def _entry(b: int, rows: int = 3) -> LedgerEntry:
    return LedgerEntry("p", b, _ranges(b), 1, rows, datetime.now(UTC))


def _rows(*batches: int) -> dict[str, list[dict[str, Any]]]:
    return {"output": [{"id": i, "v": v} for b in batches for i, v in BATCHES[b]]}


def _check(**kw: Any) -> LiveCheck:
    return LiveCheck([OutputSpec("output", ORACLE, **kw)])


# -- the checks -----------------------------------------------------------------------------


def test_whole_committed_batches_growing_show_no_anomaly() -> None:
    check = _check()
    for n in range(4):
        check.observe(Observation(_rows(*range(n)), [_entry(b) for b in range(n)]))
        check.observe(Observation(_rows(*range(n)), [_entry(b) for b in range(n)]))
    assert check.report()["anomalies"] == dict.fromkeys(check.report()["anomalies"], 0)
    assert check.observations == 8


@pytest.mark.parametrize(
    ("rows", "ledger", "kind"),
    [
        # a row no failure-free run writes (of an attempt later aborted)
        ({"output": [{"id": 0, "v": "zombie"}]}, [_entry(0, 1)], "aborted-read"),
        # a row visible twice
        ({"output": _rows(0)["output"] + _rows(0)["output"][:1]}, [_entry(0, 4)], "duplicate"),
        # rows of a batch whose ledger entry has not committed
        (_rows(0, 1), [_entry(0)], "torn-batch"),
        # half a batch
        ({"output": _rows(0, 1)["output"][:4]}, [_entry(0), _entry(1)], "torn-batch"),
        # rows and no ledger entry at all
        (_rows(0), [], "torn-batch"),
    ],
)
def test_each_anomaly_is_named(
    rows: dict[str, list[dict[str, Any]]], ledger: list[LedgerEntry], kind: str
) -> None:
    check = _check()
    assert check.observe(Observation(rows, ledger)) >= 1
    assert check.anomalies[kind] >= 1, check.report()
    assert check.report()["examples"][kind]


def test_a_row_that_disappears_is_non_monotonic_and_the_ledger_decides_the_rows() -> None:
    check = _check()
    check.observe(Observation(_rows(0, 1), [_entry(0), _entry(1)]))
    check.observe(Observation(_rows(0), [_entry(0), _entry(1)]))
    assert check.anomalies["non-monotonic"] == 3  # three rows gone
    assert check.anomalies["torn-batch"] >= 1  # the same two batches, other rows
    check.observe(Observation(_rows(0), [_entry(0)]))
    assert check.anomalies["non-monotonic"] == 4  # and the ledger lost an entry


def test_forget_starts_afresh_after_a_reset() -> None:
    check = _check()
    check.observe(Observation(_rows(0, 1), [_entry(0), _entry(1)]))
    check.forget()
    check.observe(Observation({"output": []}, []))
    assert sum(check.anomalies.values()) == 0


def test_upserts_and_complete_mode() -> None:
    keyed = _check(keys=("id",))
    keyed.observe(Observation({"output": [{"id": 0, "v": "old"}]}, [_entry(0, 1)]))
    keyed.observe(Observation({"output": [{"id": 0, "v": "v0"}]}, [_entry(0, 1), _entry(1, 1)]))
    assert sum(keyed.anomalies.values()) == 0  # a key's value changes with a new batch
    keyed.observe(Observation({"output": [{"id": 0, "v": "x"}]}, [_entry(0, 1), _entry(1, 1)]))
    assert keyed.anomalies["torn-batch"] == 1  # ...and only then
    keyed.observe(Observation({"output": [{"id": 99, "v": "x"}]}, [_entry(0), _entry(1)]))
    assert keyed.anomalies["aborted-read"] == 1 and keyed.anomalies["non-monotonic"] == 1
    complete = _check(complete=True)
    complete.observe(Observation(_rows(0, 1), [_entry(0, 6)]))
    complete.observe(Observation(_rows(2), [_entry(0, 6), _entry(1, 3)]))  # replaced: allowed
    assert sum(complete.anomalies.values()) == 0
    complete.observe(Observation(_rows(2, 1), [_entry(0, 6), _entry(1, 3), _entry(2, 3)]))
    assert complete.anomalies["torn-batch"] >= 1


def test_kafka_observations_between_two_ledger_reads() -> None:
    check = _check()
    # a batch committed while the partitions were read: between the two sums is whole
    check.observe(Observation(_rows(0, 1), [_entry(0)], [_entry(0), _entry(1)]))
    assert sum(check.anomalies.values()) == 0
    check.observe(Observation(_rows(0, 1, 2), [_entry(0)], [_entry(0), _entry(1)]))
    assert check.anomalies["torn-batch"] == 1


def test_a_sink_whose_tasks_commit_first_needs_only_the_ledger_s_batches_whole() -> None:
    check = LiveCheck([OutputSpec("output", ORACLE)], tasks_commit=True)
    # a task of batch 1 committed before the batch's ledger entry: documented, no anomaly
    check.observe(Observation({"output": _rows(0, 1)["output"][:4]}, [_entry(0)], [_entry(0)]))
    check.observe(Observation(_rows(0, 1), [_entry(0)], [_entry(0)]))
    assert sum(check.anomalies.values()) == 0
    # ...but a batch the ledger holds must be all there
    check.observe(Observation(_rows(0, 1), [_entry(0), _entry(1), _entry(2)], None))
    assert check.anomalies["torn-batch"] == 1


# -- a real store, a real reader, the planted sink --------------------------------------------


def _raise_crash() -> None:
    raise SimCrash  # the protocol simulation's crash: no process dies, no cleanup runs


def _script(sink_cls: type[SQLiteSink], url: str, live: LiveReader) -> None:
    """Run 1 commits batch 0, crashes after batch 1's rows; run 2 replays 1 and commits 2.
    The live reader looks after every step a reader could see."""

    def ctx(b: int, epoch: int) -> BatchContext:
        return BatchContext("p", epoch, _ranges(b), b, "cp")

    run1 = sink_cls(url, "out")
    epoch = run1.acquire("p").epoch
    run1.use_faults(FaultPlan(crash=(CrashPoint.AFTER_ROWS, 2), on_crash=_raise_crash))
    run1.commit_rows(ctx(0, epoch), SCHEMA, ["id", "v"], BATCHES[0])
    live.poll()
    with pytest.raises(SimCrash):
        run1.commit_rows(ctx(1, epoch), SCHEMA, ["id", "v"], BATCHES[1])
    live.poll()  # run 1 is dead; its batch 1 may be visible
    run1.close()
    run2 = sink_cls(url, "out")
    epoch = run2.acquire("p").epoch
    live.poll()
    for b in (1, 2):
        run2.commit_rows(ctx(b, epoch), SCHEMA, ["id", "v"], BATCHES[b])
        live.poll()
    final = [{"id": i, "v": v} for i, v in run2.conn.execute("SELECT id, v FROM out")]
    assert diff_rows(ORACLE, final, ()).matched, "the final state is right either way"
    run2.close()


def _live(url: str) -> LiveReader:
    reader = SqlReader({"output": SQLiteSink(url, "out")}, "p")
    return LiveReader([LiveStore("sqlite", reader, _check())])


def test_the_live_reader_catches_rows_visible_before_their_ledger_entry(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'planted.db'}"
    live = _live(url)
    before = VisibleBeforeCommitSink.rolled_back
    _script(VisibleBeforeCommitSink, url, live)
    assert VisibleBeforeCommitSink.rolled_back == before + 1, "the bug's rollback ran"
    (store,) = live.report()
    assert store["observations"] == 5 and store["read_errors"] == 0
    # After the crash: batch 1's rows without their ledger entry; then gone.
    assert store["anomalies"]["torn-batch"] >= 1, store
    assert store["anomalies"]["non-monotonic"] == 3, store
    assert live.anomalies() > 0


def test_the_live_reader_sees_nothing_wrong_in_the_real_sink(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'real.db'}"
    live = _live(url)
    _script(SQLiteSink, url, live)
    (store,) = live.report()
    assert store["observations"] == 5 and live.anomalies() == 0, store


def test_the_reader_thread_polls_at_its_rate_and_stops(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'rate.db'}"
    with LiveReader(
        [LiveStore("sqlite", SqlReader({"output": SQLiteSink(url, "out")}, "p"), _check())],
        interval_s=0.02,
    ) as live:
        import time

        time.sleep(0.5)
    (store,) = live.report()
    assert 10 <= store["observations"] <= 40, store
    assert live.anomalies() == 0


def test_a_store_reader_must_say_how_it_reads() -> None:
    """StoreReader is abstract: a reader without ``read`` is refused when it is made, not
    when the reader thread first polls it."""

    class Silent(StoreReader):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Silent()  # type: ignore[abstract]
    with pytest.raises(TypeError, match="abstract"):
        StoreReader()  # type: ignore[abstract]
