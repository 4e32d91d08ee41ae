"""Stateful pipelines are recognised from what Spark records, for every stateful API.

A pipeline whose state lives in Spark's checkpoint must refuse to resume from the ledger
alone when the checkpoint is lost (``CheckpointLostError``), instead of silently restarting
its aggregates. sparkonce records, in each ledger entry, whether the query had state in
the checkpoint when the batch committed; the check then needs nothing but the ledger.
Each case below runs once, loses its checkpoint, and must be refused, with no new epoch
taken (a refused run fences nobody).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from tests.conftest import FAMILY_SINKS
from tests.spark.test_no_data_batches import make_event_log

from sparkonce import (
    CheckpointLostError,
    ConfigError,
    EmbeddedLogSource,
    Pipeline,
    sink_from_url,
)
from sparkonce.sinks.inspect import inspector_for

RECORDS = 300
LIMIT = 100


def _events(df: DataFrame) -> DataFrame:
    return df.select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("v"),
        F.timestamp_seconds(F.col("value").cast("string").cast("long")).alias("ts"),
        "record_id",
    )


def group_agg(df: DataFrame) -> DataFrame:
    return _events(df).groupBy("key").agg(F.sum("v").alias("total"))


def window_count(df: DataFrame) -> DataFrame:
    e = _events(df).withWatermark("ts", "0 seconds")
    return e.groupBy(F.window("ts", "60 seconds")).count().select(F.col("window.start"), "count")


def session_count(df: DataFrame) -> DataFrame:
    e = _events(df).withWatermark("ts", "0 seconds")
    s = e.groupBy("key", F.session_window("ts", "10 seconds")).count()
    return s.select("key", F.col("session_window.start").alias("start"), "count")


def drop_duplicates(df: DataFrame) -> DataFrame:
    return _events(df).select("key").dropDuplicates(["key"])


def drop_duplicates_within_watermark(df: DataFrame) -> DataFrame:
    e = _events(df).withWatermark("ts", "10 seconds")
    return e.dropDuplicatesWithinWatermark(["key"]).select("key", "v")


def stream_stream_join(df: DataFrame) -> DataFrame:
    e = _events(df)
    left = e.select(F.col("record_id").alias("rid"), F.col("v").alias("left_v"))
    right = e.select(F.col("record_id").alias("rid2"), F.col("key").alias("right_key"))
    return left.join(right, F.col("rid") == F.col("rid2")).select("rid", "left_v", "right_key")


def streaming_limit(df: DataFrame) -> DataFrame:
    return _events(df).select("key", "v").limit(150)


def pandas_state(df: DataFrame) -> DataFrame:
    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout

    def running_count(key: tuple[Any, ...], pdfs: Any, state: Any) -> Any:
        n = state.get[0] if state.exists else 0
        for pdf in pdfs:
            n += len(pdf)
        state.update((n,))
        yield pd.DataFrame({"key": [key[0]], "n": [n]})

    return (
        _events(df)
        .groupBy("key")
        .applyInPandasWithState(
            running_count, "key string, n long", "n long", "update", GroupStateTimeout.NoTimeout
        )
    )


def transform_with_state(df: DataFrame) -> DataFrame:
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    from pyspark.sql.types import LongType, StructField, StructType

    class RunningCount(StatefulProcessor):
        def init(self, handle: Any) -> None:
            schema = StructType([StructField("n", LongType(), True)])
            self.count = handle.getValueState("count", schema)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            n = self.count.get()[0] if self.count.exists() else 0
            for pdf in rows:
                n += len(pdf)
            self.count.update((n,))
            yield pd.DataFrame({"key": [key[0]], "n": [n]})

        def close(self) -> None:
            pass

    return (
        _events(df)
        .groupBy("key")
        .transformWithStateInPandas(
            RunningCount(), "key string, n long", outputMode="Update", timeMode="None"
        )
    )


STATEFUL: list[tuple[Callable[[DataFrame], DataFrame], str]] = [
    (group_agg, "update"),
    (window_count, "append"),
    (session_count, "append"),
    (drop_duplicates, "append"),
    (drop_duplicates_within_watermark, "append"),
    (stream_stream_join, "append"),
    (streaming_limit, "append"),
    (pandas_state, "update"),
    (transform_with_state, "update"),
]


def _pipeline(
    tmp_path: Path, transform: Callable[[DataFrame], DataFrame], mode: str, sink: Any
) -> Pipeline:
    return Pipeline(
        name="stateful",
        source=EmbeddedLogSource(tmp_path / "log", "events", max_records_per_partition=LIMIT),
        transform=transform,
        sink=sink,
        checkpoint=tmp_path / "chk",
        output_mode=mode,  # type: ignore[arg-type]
    )


def _ledger_and_owner(p: Pipeline) -> tuple[list[Any], Any]:
    p.sink.open()
    try:
        return p.sink.ledger(p.name), p.sink.owner(p.name)
    finally:
        p.sink.close()


def _lose_checkpoint_and_expect_refusal(spark: SparkSession, p: Pipeline) -> None:
    entries, owner = _ledger_and_owner(p)
    assert entries, "the first run committed nothing"
    assert all(e.stateful is True for e in entries), [e.stateful for e in entries]
    shutil.rmtree(p.checkpoint_path)
    with pytest.raises(CheckpointLostError, match="records that the query kept state") as err:
        p.run(spark, timeout=300)
    # stateful=False would be refused for this plan: the advice is to restore the checkpoint.
    assert "stateful=False" not in str(err.value)
    assert "restore the checkpoint" in str(err.value)
    after, owner_after = _ledger_and_owner(p)
    assert owner_after.epoch == owner.epoch, "a refused run must not take an epoch"
    assert after == entries


@pytest.mark.parametrize(("transform", "mode"), STATEFUL, ids=[t.__name__ for t, _ in STATEFUL])
def test_every_stateful_api_refuses_a_lost_checkpoint(
    spark: SparkSession,
    tmp_path: Path,
    transform: Callable[[DataFrame], DataFrame],
    mode: str,
) -> None:
    make_event_log(tmp_path / "log", RECORDS, keys=3)
    sink = sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", "out")
    p = _pipeline(tmp_path, transform, mode, sink)
    p.run(spark, timeout=300)
    _lose_checkpoint_and_expect_refusal(spark, p)


@pytest.mark.parametrize(("transform", "mode"), STATEFUL, ids=[t.__name__ for t, _ in STATEFUL])
def test_stateful_false_is_refused_on_every_stateful_api(
    spark: SparkSession,
    tmp_path: Path,
    transform: Callable[[DataFrame], DataFrame],
    mode: str,
) -> None:
    """stateful=False on a plan that keeps state would start that state empty after a lost
    checkpoint (a dedupe then lets duplicates through): refused from the plan alone,
    before the epoch. Nothing runs: the refusal comes while the query is being built."""
    make_event_log(tmp_path / "log", 10, keys=3)
    sink = sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", "out")
    p = dataclasses.replace(_pipeline(tmp_path, transform, mode, sink), stateful=False)
    with pytest.raises(ConfigError, match="stateful=False, but the query keeps state") as err:
        p.run(spark, timeout=60)
    assert "restore it" in str(err.value) and "no epoch was taken" in str(err.value)
    entries, owner = _ledger_and_owner(p)
    assert owner is None and entries == []
    assert not (tmp_path / "chk" / "offsets").exists(), "the query was started"


def test_dedupe_with_stateful_false_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    """The reported case: a dedupe pipeline told stateful=False let re-sent ids through."""
    from sparkonce.outputs import dedupe

    make_event_log(tmp_path / "log", 10, keys=3)
    sink = sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", "out")

    def deduped(df: DataFrame) -> DataFrame:
        return dedupe(_events(df), "record_id", within="10 minutes", event_time="ts")

    p = dataclasses.replace(_pipeline(tmp_path, deduped, "append", sink), stateful=False)
    with pytest.raises(ConfigError, match=r"DeduplicateWithinWatermark"):
        p.run(spark, timeout=60)
    assert _ledger_and_owner(p) == ([], None)


def test_lost_checkpoint_advice_names_every_output_and_the_flag_only_for_old_ledgers(
    tmp_path: Path,
) -> None:
    """CheckpointLostError names the outputs to delete when there are several, and suggests
    stateful=False only when the ledger does not record whether the query keeps state."""
    from datetime import UTC, datetime

    from sparkonce.ledger.base import LedgerEntry
    from sparkonce.offsets import BatchRanges, TopicPartition
    from sparkonce.pipeline.runner import _resume_point
    from sparkonce.spark.checkpoint import Checkpoint

    make_event_log(tmp_path / "log", 10)
    db = f"sqlite:///{tmp_path / 'sink.db'}"
    p = Pipeline(
        name="three",
        source=EmbeddedLogSource(tmp_path / "log", "events"),
        outputs={n: sink_from_url(db, n) for n in ("orders", "late", "rejects")},
        checkpoint=tmp_path / "chk",
    )
    end: dict[TopicPartition, int] = {("events", 0): 10}
    ranges = BatchRanges.from_json('{"events": {"0": [0, 10]}}')
    now = datetime.now(UTC)
    checkpoint = Checkpoint.open(p.checkpoint_location)
    p.sink.open()
    try:
        for recorded, flag in ((True, False), (None, True)):
            last = LedgerEntry("three", 0, ranges, 1, 10, now, 0, "q", recorded)
            with pytest.raises(CheckpointLostError) as err:
                _resume_point(p, checkpoint, end, last, None)
            text = str(err.value)
            assert ("stateful=False" in text) is flag, text
            assert all(f"{n}: " in text for n in ("orders", "late", "rejects")), text
    finally:
        p.sink.close()


def test_a_stateless_pipeline_resumes_from_the_ledger(spark: SparkSession, tmp_path: Path) -> None:
    make_event_log(tmp_path / "log", RECORDS, keys=3)
    sink = sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", "out")
    p = _pipeline(tmp_path, lambda df: _events(df).select("key", "v"), "append", sink)
    first = p.run(spark, timeout=300)
    entries, _ = _ledger_and_owner(p)
    assert [e.stateful for e in entries] == [False] * first.batches_committed
    shutil.rmtree(p.checkpoint_path)
    make_event_log(tmp_path / "log", 2 * RECORDS, keys=3)  # appends 600 more records
    again = p.run(spark, timeout=300)
    assert again.resumed_from == "ledger"
    p.sink.open()
    try:
        assert len(inspector_for(p.sink).rows()) == 3 * RECORDS
    finally:
        p.sink.close()


def _pandas_state_records(df: DataFrame) -> DataFrame:
    out = pandas_state(df)
    return out.select(
        F.col("key"), F.concat_ws(":", "key", F.col("n").cast("string")).alias("value")
    )


@pytest.mark.parametrize("family_sink", FAMILY_SINKS, indirect=True)
def test_lost_checkpoint_of_pandas_state_is_refused_by_every_sink_family(
    spark: SparkSession, tmp_path: Path, family_sink: Callable[[str], Any]
) -> None:
    """The case that was missed: applyInPandasWithState wrote a=500 instead of refusing."""
    make_event_log(tmp_path / "log", RECORDS, keys=3)
    kafka = family_sink.family == "kafka"  # type: ignore[attr-defined]
    transform = _pandas_state_records if kafka else pandas_state
    p = _pipeline(tmp_path, transform, "update", family_sink("counts"))
    p.run(spark, timeout=300)
    _lose_checkpoint_and_expect_refusal(spark, p)


def test_a_stateful_run_killed_before_its_first_offsets_were_in_place_can_start_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A driver killed between writing the first batch's offsets to a temporary file and
    renaming it (S3A copies, so the window is wide: the cluster campaign hit it) leaves
    that file in an offset log with no batch. Spark's new-checkpoint check refuses to start
    a stateful query on it; the run clears the debris once it owns the pipeline."""
    make_event_log(tmp_path / "log", RECORDS, keys=3)
    sink = sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", "sums", mode="upsert", keys=["key"])
    p = _pipeline(
        tmp_path,
        lambda df: _events(df).groupBy("key").agg(F.sum("v").alias("total")),
        "update",
        sink,
    )
    offsets = Path(p.checkpoint_path) / "offsets"
    offsets.mkdir(parents=True)
    (offsets / ".0.5f0c6b1e-killed.tmp").write_text("v1\n{}\n")
    report = p.run(spark, timeout=300)
    assert report.batches_committed == RECORDS // LIMIT
    assert not (offsets / ".0.5f0c6b1e-killed.tmp").exists()
    p.sink.open()
    try:
        rows = {r["key"]: r["total"] for r in inspector_for(p.sink).rows()}
    finally:
        p.sink.close()
    # Record i has value BASE + i and key k(i % 3): each key's sum, from the input alone.
    from tests.spark.test_no_data_batches import BASE

    assert rows == {f"k{k}": sum(BASE + i for i in range(RECORDS) if i % 3 == k) for k in range(3)}
