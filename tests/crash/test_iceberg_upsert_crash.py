"""SIGKILL a driver running an IcebergSink **upsert** pipeline at each crash point, then recover.

The chain of tests/crash/test_iceberg_crash.py (whose helpers it reuses), on an upsert
pipeline: run 1 is killed the 2nd time it reaches ``before-commit`` (batch 0 committed),
runs 2-4 the first time they reach ``after-rows``, ``before-ledger-commit`` and
``after-ledger-commit`` (batch 1 each time), run 5 finishes. A kill inside the commit
lands after the merge wrote its survivors' files and before (or after) the catalog swap:
the table must show either all of the batch (its rows in, the replaced rows gone) or none.

The upsert key is ``value % 60``: the log keys are ``k{value % 6}``, so all values of one
upsert key are in one partition, in increasing offsets, and a later batch holds its greater
values. The oracle, in plain Python over the input log: after the committed batches (the
ledger's ranges), each key's row is the covered record of that key with the greatest value.
Both independent readers (PyIceberg's scan, DuckDB's ``iceberg_scan``) must see exactly it,
and after run 5 every referenced file is in its batch's committed staging directory and the
killed attempts' directories are gone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.log.storage import Topic
from sparkonce.offsets import check_chain
from sparkonce.protocol import CrashPoint
from sparkonce.sinks.iceberg import IcebergSink
from sparkonce.spark.checkpoint import Checkpoint
from sparkonce.verify.driver import Driver
from tests.crash.conftest import BATCHES, KEYS, PARTITIONS, RECORDS, TOPIC, kill_chain
from tests.crash.test_iceberg_crash import catalog, check_files, write_pipeline
from tests.iceberg.readers import assert_rows

pytestmark = pytest.mark.crash_lane

NAME = "crash-test"
TABLE = "ns.events_out"  # the name check_files (tests/crash/test_iceberg_crash.py) reads
UPSERT_KEYS = 10 * KEYS

_PIPELINE = '''"""A sparkonce crash-test upsert pipeline into an Iceberg table (tests/crash)."""

from pyiceberg.catalog.sql import SqlCatalog
from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, IcebergSink, Pipeline


def keyed(df):
    value = F.col("value").cast("string").cast("long")
    return df.select(
        (value % {keys}).alias("k"), value.alias("value"), F.col("partition"), F.col("offset")
    )


pipeline = Pipeline(
    name={name!r},
    source=EmbeddedLogSource({log_dir!r}, "events", max_records_per_partition=200),
    transform=keyed,
    sink=IcebergSink(
        SqlCatalog("c", uri={uri!r}, warehouse={warehouse!r}),
        {table!r},
        mode="upsert",
        keys=["k"],
        latest_by="value",
        orphan_grace_seconds=0,
    ),
    checkpoint={checkpoint!r},
)
'''


def expected(log_dir: Path, tmp_path: Path) -> list[tuple[int, int, int, int]]:
    """(k, value, partition, offset) per key: the greatest covered value of the key."""
    entries = IcebergSink(catalog(tmp_path), TABLE).ledger(NAME)
    latest: dict[int, tuple[int, int, int, int]] = {}
    topic = Topic(log_dir, TOPIC)
    for e in entries:
        for r in e.ranges.ranges:
            for rec in topic.read(r.partition, r.start, r.end):
                assert rec.value is not None
                v = int(rec.value.decode())
                k = v % UPSERT_KEYS
                if k not in latest or latest[k][1] < v:
                    latest[k] = (k, v, rec.partition, rec.offset)
    return sorted(latest.values())


def check_table(log_dir: Path, tmp_path: Path, where: str) -> None:
    try:
        want = expected(log_dir, tmp_path)
        assert_rows(catalog(tmp_path), TABLE, ["k", "value", "partition", "offset"], want)
    except AssertionError as exc:
        raise AssertionError(f"{where}: {exc}") from None


def run_chain(
    tmp_path: Path,
    make_log: Callable[..., Path],
    drivers: list[Driver],
    points: list[CrashPoint],
) -> None:
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    pipeline_file = write_pipeline(tmp_path, log_dir, _PIPELINE, keys=UPSERT_KEYS)

    def check(run: int, point: CrashPoint) -> None:
        entries = IcebergSink(catalog(tmp_path), TABLE).ledger(NAME)
        committed = 2 if point is CrashPoint.AFTER_LEDGER_COMMIT else 1
        where = f"after the crash at {point} (run {run}), ledger {entries}"
        assert len(entries) == committed, where
        assert len(catalog(tmp_path).load_table(TABLE).snapshots()) == committed, where
        check_table(log_dir, tmp_path, where)
        check_files(tmp_path, swept=False)

    last = kill_chain(
        pipeline_file,
        tmp_path,
        drivers,
        points,
        hit=lambda _run, point: 2 if point is CrashPoint.BEFORE_COMMIT else 1,
        check=check,
    )
    assert Checkpoint(tmp_path / "checkpoint").batch_ids("commits")[-1] >= BATCHES - 1
    entries = IcebergSink(catalog(tmp_path), TABLE).ledger(NAME)
    assert check_chain(e.ranges for e in entries) == []
    assert [e.seq for e in entries] == list(range(BATCHES))
    assert sum(len(range(r.start, r.end)) for e in entries for r in e.ranges.ranges) == RECORDS
    check_table(log_dir, tmp_path, f"after the last run:\n{last.log_tail()}")
    assert len(expected(log_dir, tmp_path)) == UPSERT_KEYS
    check_files(tmp_path, swept=True)


def test_iceberg_upsert_every_crash_point_then_recover(
    tmp_path: Path, make_log: Callable[..., Path], drivers: list[Driver]
) -> None:
    points = list(CrashPoint)
    assert points[-1] is CrashPoint.AFTER_LEDGER_COMMIT
    run_chain(tmp_path, make_log, drivers, points)
