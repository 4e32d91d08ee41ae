"""DeltaSink against real Delta Lake tables on the local filesystem, on the shared session.

The oracle is the input itself: ``make_log`` writes the values 1..N keyed ``k{i % keys}``,
so the rows every run must end with (each record once, or each key's sum) are computed
here from the numbers, never from what the sink reports.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import ConfigError, DeltaSink, EmbeddedLogSource, FencedError, Pipeline, SinkError
from sparkonce.cli import main
from sparkonce.ledger.base import BatchContext
from sparkonce.ledger.delta import DeltaTxn, app_id, pack, unpack
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks.inspect import inspector_for
from tests.spark.test_pipeline import forget_commit
from tests.spark.test_pipeline import values as spark_values

RECORDS = 300
KEYS = 5


def values(df: DataFrame) -> DataFrame:
    return spark_values(df).drop("record_id")


def sums(df: DataFrame) -> DataFrame:
    return values(df).groupBy("key").agg(F.sum("value").alias("total"), F.count("*").alias("n"))


def pipeline(
    tmp_path: Path,
    log_dir: Path,
    *,
    checkpoint: str = "chk",
    transform: Callable[[DataFrame], DataFrame] = values,
    name: str = "p1",
    limit: int = 50,
    output_mode: str = "update",
    **sink_kwargs: Any,
) -> Pipeline:
    return Pipeline(
        name=name,
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=limit),
        sink=DeltaSink(tmp_path / "tables", table="out", **sink_kwargs),
        checkpoint=tmp_path / checkpoint,
        transform=transform,
        output_mode=output_mode,  # type: ignore[arg-type]
    )


def rows(p: Pipeline) -> list[dict[str, Any]]:
    return inspector_for(p.sink).rows()


def expected_sums(records: int) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for i in range(1, records + 1):
        total, n = out.get(f"k{i % KEYS}", (0, 0))
        out[f"k{i % KEYS}"] = (total + i, n + 1)
    return out


def assert_each_record_once(got: list[dict[str, Any]], records: int) -> None:
    positions = Counter((r["partition"], r["offset"]) for r in got)
    twice = [k for k, n in positions.items() if n > 1]
    assert not twice, f"rows visible twice: {twice[:5]}"
    assert sorted(r["value"] for r in got) == list(range(1, records + 1))


def test_append_replay_and_new_checkpoint(
    spark: SparkSession,
    tmp_path: Path,
    make_log: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every record once through a replay (Spark forgot a committed batch) and through a
    new checkpoint, which resumes from the ledger rather than Spark's batch ids."""
    log_dir = make_log(RECORDS, keys=KEYS)
    p = pipeline(tmp_path, log_dir)
    first = p.run(spark, timeout=300)
    assert first.batches_committed >= 2 and first.rows_committed == RECORDS
    assert_each_record_once(rows(p), RECORDS)
    ledger = p.sink.ledger("p1")
    assert [e.seq for e in ledger] == list(range(len(ledger)))
    assert sum(e.row_count for e in ledger) == RECORDS  # from the Delta commits' metrics
    assert {e.epoch for e in ledger} == {1}
    # Each entry's commit time: the entry file has it up to step 4, the ``.rows`` file up
    # to the end of the Delta write, and neither exceeds what the run timed around commit.
    timed = {b.result.seq: b.seconds for b in first.batches if not b.result.skipped}
    entries = tmp_path / "tables" / "out" / "_sparkonce" / "p1" / "entries"
    for e in ledger:
        assert e.commit_seconds is not None and e.commit_seconds <= timed[e.seq]
        before_write = json.loads((entries / str(e.seq) / "1.json").read_text())
        assert 0 < before_write["commit_seconds"] < e.commit_seconds
        assert (entries / str(e.seq) / "1.rows").read_text().split()[1] == str(e.commit_seconds)

    # A replay: Spark forgets its last batch; the run must skip it, not append it again.
    last_batch = max(
        int(f.name) for f in (tmp_path / "chk" / "commits").iterdir() if f.name.isdigit()
    )
    forget_commit(tmp_path / "chk", last_batch)
    second = p.run(spark, timeout=300)
    assert second.batches_skipped == 1 and second.rows_committed == 0, second
    assert_each_record_once(rows(p), RECORDS)

    # More input, and a brand-new checkpoint: Spark starts at batch 0, the ledger says where.
    make_log(100, keys=KEYS, start=RECORDS + 1)
    p2 = pipeline(tmp_path, log_dir, checkpoint="chk2")
    third = p2.run(spark, timeout=300)
    assert third.resumed_from == "ledger" and third.rows_committed == 100, third
    assert_each_record_once(rows(p2), RECORDS + 100)
    owner = p2.sink.owner("p1")
    assert owner is not None and owner.epoch == 3

    # sparkonce status reads the table's own ledger (the URL the sink's hints print).
    table = tmp_path / "tables" / "out"
    assert main(["status", "--pipeline", "p1", "--sink", f"delta://{table}"]) == 0
    shown = capsys.readouterr().out
    assert "owner epoch 3" in shown and f"{RECORDS + 100} rows committed" in shown, shown
    assert main(["status", "--pipeline", "p1", "--sink", f"delta://{tmp_path}/none"]) == 2
    assert "no Delta table at" in capsys.readouterr().err


def _ctx(sink: DeltaSink, epoch: int, start: int) -> BatchContext:
    ranges = BatchRanges((OffsetRange("events", 0, start, start + 1),))
    return BatchContext("p1", epoch, ranges, spark_batch_id=99)


def test_zombie_write_is_fenced_never_skipped_silently(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """A run whose own view still says it owns the pipeline (it has not looked since a newer
    run took over) reaches Delta's write: Delta skips it, and the sink must raise
    FencedError, with nothing of the batch visible."""
    log_dir = make_log(RECORDS, keys=KEYS)
    p = pipeline(tmp_path, log_dir)
    p.run(spark, timeout=300)
    before = rows(p)
    end = p.sink.end_offsets("p1")[("events", 0)]

    zombie = DeltaSink(tmp_path / "tables", table="out")
    zombie.open()
    old = zombie.acquire("p1")
    newer = DeltaSink(tmp_path / "tables", table="out")
    newer.open()
    new = newer.acquire("p1")
    assert new.epoch == old.epoch + 1

    df = spark.createDataFrame(
        [(0, end, "k9", 10_000)], "partition int, offset long, key string, value long"
    )
    ctx = _ctx(zombie, old.epoch, end)
    _store, stager = zombie.committer_parts()
    # Steps 1-2 read the zombie's own view (it owns epoch `old`); the write must find out.
    staged = stager.prepare(ctx, df, len(p.sink.ledger("p1")))
    with pytest.raises(FencedError) as info:
        assert zombie._committer is not None
        zombie._committer._transaction(ctx, len(p.sink.ledger("p1")), staged, time.monotonic())
    assert info.value.owner_epoch == new.epoch
    assert rows(p) == before or Counter(map(str, rows(p))) == Counter(map(str, before))
    stored = zombie.table.txn_version(app_id("p1"))
    assert stored is not None and unpack(stored)[0] == new.epoch

    # The early look (step 0) finds it too, before anything is staged.
    with pytest.raises(FencedError):
        zombie.commit(ctx, df)


@pytest.mark.campaign_lane  # in the rotation: make test's budget
def test_log_retention_keeps_the_resume_point(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """Delta deletes commit files past delta.logRetentionDuration (30 days; at a checkpoint); the
    ledger's progress (txn, kept in checkpoints) and offsets (entry files) survive it."""
    log_dir = make_log(RECORDS, keys=KEYS)
    p = pipeline(tmp_path, log_dir)
    p.run(spark, timeout=300)
    path = p.sink.path  # type: ignore[attr-defined]
    ledger = p.sink.ledger("p1")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    # Age every commit file by 40 days; the next checkpoint's cleanup then deletes them.
    old = time.time() - 40 * 86400
    logs = Path(path) / "_delta_log"
    for f in logs.glob("*.json"):
        os.utime(f, (old, old))
    make_log(100, keys=KEYS, start=RECORDS + 1)
    p2 = pipeline(tmp_path, log_dir, checkpoint="chk2")
    report = p2.run(spark, timeout=300)
    assert report.resumed_from == "ledger" and report.rows_committed == 100, report
    remaining = sorted(int(f.stem) for f in logs.glob("*.json"))
    assert remaining and remaining[0] > ledger[-1].seq + 1, f"no commit file expired: {remaining}"
    assert_each_record_once(rows(p2), RECORDS + 100)
    again = DeltaSink(tmp_path / "tables", table="out").ledger("p1")
    assert [(e.seq, e.ranges, e.row_count) for e in again[: len(ledger)]] == [
        (e.seq, e.ranges, e.row_count) for e in ledger
    ]


@pytest.mark.campaign_lane  # in the rotation: make test's budget
def test_upsert_update_mode_sums(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """Per-key sums in Spark's update mode, MERGEd by key: the table ends with the sums."""
    log_dir = make_log(RECORDS, keys=KEYS)
    p = pipeline(tmp_path, log_dir, transform=sums, mode="upsert", keys=["key"])
    report = p.run(spark, timeout=300)
    assert report.batches_committed >= 2
    got = {r["key"]: (r["total"], r["n"]) for r in rows(p)}
    assert got == expected_sums(RECORDS)
    # A replay of the last batch must not apply its MERGE twice (the sums would not change,
    # so check the Delta history: the rerun adds only its epoch's commit, no MERGE).
    path = p.sink.path  # type: ignore[attr-defined]

    def operations() -> list[str]:
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version")
        return [r["operation"] for r in history.collect()]

    before = operations()
    assert before.count("MERGE") == report.batches_committed
    commits = tmp_path / "chk" / "commits"
    forget_commit(tmp_path / "chk", max(int(f.name) for f in commits.iterdir() if f.name.isdigit()))
    again = p.run(spark, timeout=300)
    assert again.batches_skipped == 1 and again.batches_committed == 0, again
    after = operations()
    assert after[: len(before)] == before and after.count("MERGE") == before.count("MERGE"), after


def test_upsert_refuses_a_repeated_key(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(RECORDS, keys=KEYS)
    p = pipeline(tmp_path, log_dir, mode="upsert", keys=["key"])  # one row per record
    with pytest.raises(SinkError, match=r"repeats it \d+ times.*Nothing was committed"):
        p.run(spark, timeout=300)
    assert p.sink.ledger("p1") == []
    assert rows(p) == []


@pytest.mark.campaign_lane  # in the rotation: make test's budget
def test_complete_mode_replaces_the_table(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(RECORDS, keys=KEYS)
    p = pipeline(tmp_path, log_dir, transform=sums, output_mode="complete")
    p.run(spark, timeout=300)
    got = {r["key"]: (r["total"], r["n"]) for r in rows(p)}
    assert got == expected_sums(RECORDS)


def test_bad_tables_are_refused_before_the_epoch(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(RECORDS, keys=KEYS)
    target = tmp_path / "tables" / "out"
    schema = "partition int, offset string, key string, value long"
    spark.createDataFrame([], schema).write.format("delta").save(str(target))
    p = pipeline(tmp_path, log_dir)
    with pytest.raises(ConfigError, match=r"column 'offset' of Delta table .* is string"):
        p.run(spark, timeout=300)
    shutil.rmtree(target)

    spark.createDataFrame([], "partition int, offset long, key string, value long").write.format(
        "delta"
    ).save(str(target))
    spark.sql(
        f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES "
        "('delta.setTransactionRetentionDuration' = 'interval 7 days')"
    )
    with pytest.raises(ConfigError, match="setTransactionRetentionDuration"):
        pipeline(tmp_path, log_dir).run(spark, timeout=300)
    assert not (target / "_sparkonce").exists(), "an epoch was taken before the check"


def test_txn_version_packing() -> None:
    assert unpack(pack(3, 17)) == (3, 17)
    assert pack(2, 0) > pack(1, 2**32 - 1)  # any newer epoch outranks any older progress
    assert DeltaTxn().entry is None
    assert json.loads(json.dumps({"v": pack(1, 1)}))["v"] == 2**32 + 1


def test_a_table_another_process_created_is_seen_by_a_session_that_looked_before(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The verify campaign's lost-rows report: its session looked at the store while the
    killed driver had not created the table yet, and Delta's cached log kept answering
    "no table" after the restarted driver (another process) wrote every batch. Here the
    other writer's files are copied in under the session's feet."""
    from sparkonce.spark.delta import DeltaTable

    made, later = str(tmp_path / "made"), str(tmp_path / "later")
    spark.range(3).write.format("delta").save(made)
    assert not DeltaTable(spark, later).exists()  # the session caches "no table" here
    shutil.copytree(made, later)
    assert DeltaTable(spark, later).exists()
    sink = DeltaSink(tmp_path, table="later")
    sink.open()
    try:
        assert sorted(r["id"] for r in inspector_for(sink).rows()) == [0, 1, 2]
    finally:
        sink.close()
