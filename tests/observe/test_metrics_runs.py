"""Metrics of a replayed batch and of a fenced run, on the shared local[2] session.

The runs are real (embedded log -> SQLite through ``Pipeline.run``); what the metrics say
is read from their exposition, parsed by prometheus_client's own parser, and compared
with what the sink's API reads back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, FencedError, Pipeline, SQLiteSink
from sparkonce.observe.metrics import MetricsObserver
from sparkonce.observe.report import BatchReport


def values(df: DataFrame) -> DataFrame:
    return df.select("record_id", F.col("value").cast("string").cast("long").alias("value"))


def make_pipeline(tmp_path: Path, log_dir: Path, name: str, limit: int | None) -> Pipeline:
    return Pipeline(
        name=name,
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=limit),
        transform=values,
        sink=SQLiteSink(f"sqlite:///{tmp_path / 'out.db'}", "out"),
        checkpoint=tmp_path / "chk",
    )


def metric(observer: MetricsObserver, sample: str) -> float:
    """The value of ``sample`` for the observer's pipeline, from its exposition."""
    for family in text_string_to_metric_families(observer.exposition()):
        for s in family.samples:
            if s.name == sample and s.labels == {"pipeline": observer.pipeline}:
                return float(s.value)
    raise AssertionError(f"no sample {sample} in:\n{observer.exposition()}")


def forget_commit(checkpoint: Path, batch_id: int) -> None:
    """Make Spark forget a finished batch, as a crash before its commit log would."""
    (checkpoint / "commits" / str(batch_id)).unlink()
    (checkpoint / "commits" / f".{batch_id}.crc").unlink(missing_ok=True)


def test_a_replayed_batch_counts_as_skipped(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    p = make_pipeline(tmp_path, make_log(300, partitions=3), "replayed", None)  # one batch
    first = MetricsObserver(p.name)
    report = p.run(spark, observer=first)
    with SQLiteSink(f"sqlite:///{tmp_path / 'out.db'}", "out") as sink:
        ledger = sink.ledger(p.name)
    assert report.batches_committed == len(ledger) == 1
    assert metric(first, "sparkonce_batches_committed_total") == len(ledger)
    assert metric(first, "sparkonce_rows_committed_total") == 300
    assert metric(first, "sparkonce_batches_skipped_total") == 0

    # A crash after the sink's commit but before Spark's commit log looks like this:
    last = max(int(f.name) for f in (p.checkpoint_path / "commits").iterdir() if f.name.isdigit())
    forget_commit(p.checkpoint_path, last)
    second = MetricsObserver(p.name)
    report = p.run(spark, observer=second)
    assert (report.batches_skipped, report.batches_committed) == (1, 0)
    assert metric(second, "sparkonce_batches_skipped_total") == 1
    assert metric(second, "sparkonce_batches_committed_total") == 0
    assert metric(second, "sparkonce_rows_committed_total") == 0
    assert metric(second, "sparkonce_commit_seconds_count") == 0  # a skip is no commit
    with SQLiteSink(f"sqlite:///{tmp_path / 'out.db'}", "out") as sink:
        owner = sink.owner(p.name)
        assert sink.ledger(p.name) == ledger
    assert owner is not None
    assert metric(second, "sparkonce_owner_epoch") == owner.epoch == 2


class TakenOverAfterFirstCommit(MetricsObserver):
    """The real metrics, and a newer run of the pipeline that takes it over (a real
    ``acquire`` on the same store) right after this run's first commit."""

    def __init__(self, pipeline: str, url: str) -> None:
        super().__init__(pipeline)
        self.url = url
        self.taken_over = False

    def on_batch(self, report: BatchReport) -> None:
        super().on_batch(report)
        if not self.taken_over:
            with SQLiteSink(self.url, "out") as newer:
                newer.acquire(self.pipeline)
            self.taken_over = True


def test_a_fenced_run_counts_as_fenced(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    url = f"sqlite:///{tmp_path / 'out.db'}"
    p = make_pipeline(tmp_path, make_log(300, partitions=3), "fenced", 60)  # 2 batches or more
    observer = TakenOverAfterFirstCommit(p.name, url)
    with pytest.raises(FencedError):
        p.run(spark, observer=observer)
    assert observer.taken_over
    assert metric(observer, "sparkonce_fenced_total") == 1
    assert metric(observer, "sparkonce_batches_committed_total") == 1
    assert metric(observer, "sparkonce_owner_epoch") == 1  # the epoch this run took
    with SQLiteSink(url, "out") as sink:
        owner, ledger = sink.owner(p.name), sink.ledger(p.name)
    assert owner is not None and owner.epoch == 2
    assert [e.epoch for e in ledger] == [1]
