"""SIGKILL a driver running an IcebergSink pipeline at each crash point, then recover.

One chain of runs on one checkpoint, as tests/crash/test_crash_points.py runs it for the
other stores: run 1 is killed the 2nd time it reaches ``before-commit`` (batch 0
committed), runs 2-4 the first time they reach ``after-rows``, ``before-ledger-commit``
and ``after-ledger-commit`` (batch 1 each time), run 5 finishes. After each kill the
table holds exactly the committed batches; after run 5 both independent readers
(PyIceberg's scan, DuckDB's ``iceberg_scan``) see every record once, every file the table
references is in its batch's committed staging directory, and the killed attempts'
directories are gone (the pipeline's sweep runs with no grace period).

Rows reach the table from Spark's tasks (Parquet files in a staging directory) and PyIceberg
adds them; a kill after ``after-rows`` leaves that attempt's directory unreferenced.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from sparkonce.ledger.base import LedgerEntry
from sparkonce.offsets import check_chain
from sparkonce.protocol import CrashPoint
from sparkonce.sinks.iceberg import IcebergSink, committed_dirs, staging_root
from sparkonce.spark.checkpoint import Checkpoint
from sparkonce.verify.driver import Driver
from tests.crash.conftest import (
    BATCHES,
    KEYS,
    PARTITIONS,
    RECORDS,
    ROWS_PER_BATCH,
    TRANSFORMS,
    kill_chain,
    log_on_failure,
)
from tests.iceberg.readers import assert_each_value_once, referenced_files

pytestmark = pytest.mark.crash_lane

NAME = "crash-test"
TABLE = "ns.events_out"

_PIPELINE = (
    '''"""A sparkonce crash-test pipeline into an Iceberg table, written by tests/crash."""

from pyiceberg.catalog.sql import SqlCatalog

'''
    + TRANSFORMS
    + """
from sparkonce import EmbeddedLogSource, IcebergSink, Pipeline


pipeline = Pipeline(
    name={name!r},
    source=EmbeddedLogSource({log_dir!r}, "events", max_records_per_partition=200),
    transform=stateless,
    sink=IcebergSink(
        SqlCatalog("c", uri={uri!r}, warehouse={warehouse!r}), {table!r}, orphan_grace_seconds=0
    ),
    checkpoint={checkpoint!r},
)
"""
)


def catalog(tmp_path: Path) -> SqlCatalog:
    return SqlCatalog("c", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")


def write_pipeline(
    tmp_path: Path, log_dir: Path, template: str = _PIPELINE, **fields: object
) -> Path:
    """Write ``template`` (this file's append pipeline by default) filled in for a catalog,
    warehouse and checkpoint in ``tmp_path``, plus the template's own ``fields``."""
    path = tmp_path / "pipeline.py"
    path.write_text(
        template.format(
            name=NAME,
            log_dir=str(log_dir),
            uri=f"sqlite:///{tmp_path}/cat.db",
            warehouse=f"file://{tmp_path}/wh",
            table=TABLE,
            checkpoint=str(tmp_path / "checkpoint"),
            **fields,
        )
    )
    return path


def ledger(tmp_path: Path) -> list[LedgerEntry]:
    return IcebergSink(catalog(tmp_path), TABLE).ledger(NAME)


def check_files(tmp_path: Path, *, swept: bool) -> None:
    """Every referenced file is in the committed staging directory of its batch; with
    ``swept``, no other staging directory is left."""
    table = catalog(tmp_path).load_table(TABLE)
    winners = committed_dirs(table, NAME)
    assert all(w is not None for w in winners.values()), winners
    parents = {f.parent.name for f in referenced_files(catalog(tmp_path), TABLE)}
    assert parents <= set(winners.values()), f"files outside committed dirs: {parents}"
    if swept:
        on_disk = {d.name for d in staging_root(table, NAME, TABLE).iterdir()}
        assert on_disk == set(winners.values()), f"orphans left: {on_disk - parents}"


def check_intermediate(tmp_path: Path, point: CrashPoint, epoch: int) -> None:
    entries = ledger(tmp_path)
    owner = IcebergSink(catalog(tmp_path), TABLE).owner(NAME)
    where = f"after the crash at {point}: ledger {entries}"
    assert Checkpoint(tmp_path / "checkpoint").batch_ids("commits") == [0], where
    assert owner is not None and owner.epoch == epoch, where
    committed = 2 if point is CrashPoint.AFTER_LEDGER_COMMIT else 1
    assert len(entries) == committed, where
    assert all(e.row_count == ROWS_PER_BATCH for e in entries), where
    rows = catalog(tmp_path).load_table(TABLE).scan().to_arrow().to_pylist()
    covered = {
        (r.partition, o) for e in entries for r in e.ranges.ranges for o in range(r.start, r.end)
    }
    assert {(r["partition"], r["offset"]) for r in rows} == covered, where
    assert len(rows) == len(covered), where
    check_files(tmp_path, swept=False)


def run_chain(
    tmp_path: Path,
    make_log: Callable[..., Path],
    drivers: list[Driver],
    points: list[CrashPoint],
) -> None:
    """Kill one run at each of ``points`` (the first after batch 0), then finish."""
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    pipeline_file = write_pipeline(tmp_path, log_dir)
    last = kill_chain(
        pipeline_file,
        tmp_path,
        drivers,
        points,
        hit=lambda _run, point: 2 if point is CrashPoint.BEFORE_COMMIT else 1,
        check=lambda run, point: check_intermediate(tmp_path, point, epoch=run),
    )
    assert Checkpoint(tmp_path / "checkpoint").batch_ids("commits")[-1] >= BATCHES - 1
    with log_on_failure(last, "last run's"):
        assert_each_value_once(catalog(tmp_path), TABLE, list(range(1, RECORDS + 1)))
        entries = ledger(tmp_path)
        assert check_chain(e.ranges for e in entries) == []
        assert [e.seq for e in entries] == list(range(BATCHES))
        check_files(tmp_path, swept=True)


def test_iceberg_every_crash_point_then_recover(
    tmp_path: Path, make_log: Callable[..., Path], drivers: list[Driver]
) -> None:
    points = list(CrashPoint)
    assert points[-1] is CrashPoint.AFTER_LEDGER_COMMIT
    run_chain(tmp_path, make_log, drivers, points)
