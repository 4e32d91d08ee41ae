"""SIGKILL the driver at every named crash point of the commit protocol, then recover.

For each store (SQLite, PostgreSQL, Delta Lake), one chain of runs on one checkpoint, each
killed at the next crash point, in protocol order: run 1 the 2nd time it reaches
``before-commit`` (batch 1, after batch 0 committed), then runs 2, 3 and 4 the first time
they reach ``after-rows``, ``before-ledger-commit`` and ``after-ledger-commit`` (batch 1
again each time: the first three roll back). After each kill the store must hold what the
protocol promises at that point; run 5 (no crash) skips the batch that run 4 committed in
the sink but not in Spark, and finishes; the output must then equal the oracle's exactly.
A chain starts five drivers where a separate test per point started eight.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sparkonce.offsets import check_chain
from sparkonce.protocol import CrashPoint
from sparkonce.spark.checkpoint import Checkpoint
from sparkonce.verify.driver import SIGKILL_EXIT, Driver
from tests.crash.conftest import (
    BATCHES,
    KEYS,
    PARTITIONS,
    RECORDS,
    ROWS_PER_BATCH,
    STATEFUL_TABLE,
    STATELESS_TABLE,
    Oracle,
    event_tuples,
    kill_chain,
    log_on_failure,
    read_sink,
    replays_skipped,
    run_driver,
    sums_by_key,
    write_pipeline,
)

# The whole matrix runs in make test-crash; make test's crash tests are in test_fault_kinds.py.
pytestmark = pytest.mark.crash_lane

ROLLED_BACK = [CrashPoint.BEFORE_COMMIT, CrashPoint.AFTER_ROWS, CrashPoint.BEFORE_LEDGER_COMMIT]


def _check_intermediate(
    point: CrashPoint, sink_url: str, table: str, checkpoint: Path, epoch: int = 1
) -> None:
    """Assert the state a run holding ``epoch`` left behind (killed at ``point`` in batch 1)."""
    stateless = table == STATELESS_TABLE
    state = read_sink(sink_url, table)
    ckpt = Checkpoint(checkpoint)
    commits, offsets = ckpt.batch_ids("commits"), ckpt.batch_ids("offsets")
    where = f"after the crash at {point}: ledger {state.ledger}, commits {commits}"
    # Spark planned batch 1 (its offsets are logged) but never finished it.
    assert commits == [0], where
    assert 1 in offsets, where
    assert state.owner is not None and state.owner.epoch == epoch, where
    if point in ROLLED_BACK:
        # Crash before step 5: nothing of batch 1 is visible, in the table or the ledger.
        assert len(state.ledger) == 1, where
    else:
        # Crash after step 5: the sink committed batch 1; Spark's commit log does not know it.
        assert len(state.ledger) == 2, where
    if stateless:
        # Exactly the committed batches' rows, nothing of a rolled-back one.
        assert all(e.row_count == ROWS_PER_BATCH for e in state.ledger), where
        assert len(state.rows) == sum(e.row_count for e in state.ledger), where
        ranges = [r for e in state.ledger for r in e.ranges.ranges]
        covered = {(r.partition, o) for r in ranges for o in range(r.start, r.end)}
        visible = {(int(row["partition"]), int(row["offset"])) for row in state.rows}
        assert visible == covered, f"{where}: rows outside the ledger's ranges"


def _check_final(sink_url: str, oracle: Oracle) -> None:
    state = read_sink(sink_url, STATELESS_TABLE)
    got = event_tuples(state.rows)
    ids = [str(r["record_id"]) for r in state.rows]
    dupes = sorted(i for i, n in Counter(ids).items() if n > 1)
    assert not dupes, f"duplicate record ids: {dupes[:10]} ({len(dupes)} in all)"
    assert len(state.rows) == RECORDS
    missing, extra = oracle.events - got, got - oracle.events
    assert got == oracle.events, f"missing {list(missing)[:5]}, extra {list(extra)[:5]}"
    assert check_chain(e.ranges for e in state.ledger) == []
    assert [e.seq for e in state.ledger] == list(range(len(state.ledger)))
    assert sum(e.row_count for e in state.ledger) == RECORDS


def test_every_crash_point_then_recover(
    store_url: str,
    tmp_path: Path,
    make_log: Callable[..., Path],
    oracle: Oracle,
    drivers: list[Driver],
) -> None:
    _crash_chain_then_recover(store_url, tmp_path, make_log, oracle, drivers)


def test_delta_every_crash_point_then_recover(
    spark: SparkSession,
    tmp_path: Path,
    make_log: Callable[..., Path],
    oracle: Oracle,
    drivers: list[Driver],
) -> None:
    """The same on a Delta Lake table: before the Delta commit nothing is visible, after it
    the batch is, and the run after the last crash ends with the oracle's rows."""
    url = f"delta://{tmp_path / 'tables'}"
    _crash_chain_then_recover(url, tmp_path, make_log, oracle, drivers)


def _crash_chain_then_recover(
    store_url: str,
    tmp_path: Path,
    make_log: Callable[..., Path],
    oracle: Oracle,
    drivers: list[Driver],
) -> None:
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    pipeline_file = write_pipeline(tmp_path, log_dir=log_dir, sink_url=store_url)
    checkpoint = tmp_path / "checkpoint"
    points = list(CrashPoint)
    assert points[-1] is CrashPoint.AFTER_LEDGER_COMMIT  # the only one that commits batch 1
    assert all(p in ROLLED_BACK for p in points[:-1])

    last = kill_chain(
        pipeline_file,
        tmp_path,
        drivers,
        points,
        # Run 1 commits batch 0 first; every later run starts at batch 1, rolled back so far.
        hit=lambda run, _point: 2 if run == 1 else 1,
        check=lambda run, point: _check_intermediate(
            point, store_url, STATELESS_TABLE, checkpoint, epoch=run
        ),
    )
    assert replays_skipped(last) == 1, (
        f"the last run did not skip the one replayed batch:\n{last.log_tail()}"
    )
    assert Checkpoint(checkpoint).batch_ids("commits")[-1] >= BATCHES - 1
    with log_on_failure(last, "last run's"):
        _check_final(store_url, oracle)


def test_stateful_after_ledger_commit(
    tmp_path: Path,
    make_log: Callable[..., Path],
    oracle: Oracle,
    drivers: list[Driver],
) -> None:
    """Per-key sums (upsert on key, state in RocksDB) survive a crash after the sink commit."""
    point = CrashPoint.AFTER_LEDGER_COMMIT
    sink_url = f"sqlite:///{tmp_path / 'sink.db'}"
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    pipeline_file = write_pipeline(tmp_path, log_dir=log_dir, sink_url=sink_url, kind="stateful")
    checkpoint = tmp_path / "checkpoint"

    run1 = Driver(pipeline_file, tmp_path / "run1.log", crash_at=point, crash_hit=2)
    drivers.append(run1.start())
    code = run_driver(run1)
    assert code == SIGKILL_EXIT, f"run 1 exited with {code}, not SIGKILL:\n{run1.log_tail()}"
    try:
        _check_intermediate(point, sink_url, STATEFUL_TABLE, checkpoint)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nrun 1 log tail:\n{run1.log_tail()}") from None

    run2 = Driver(pipeline_file, tmp_path / "run2.log")
    drivers.append(run2.start())
    code = run_driver(run2)
    assert code == 0, f"run 2 exited with {code}:\n{run2.log_tail()}"
    assert replays_skipped(run2) == 1, run2.log_tail()

    state = read_sink(sink_url, STATEFUL_TABLE)
    assert sums_by_key(state.rows) == oracle.sums, run2.log_tail()
    assert check_chain(e.ranges for e in state.ledger) == []
