"""What a run reports of Delta outputs, checked against readers independent of sparkonce.

- Every batch commit of a Delta table carries its ledger entry as ``userMetadata``: read
  from the table's ``_delta_log/*.json`` files directly, line by line, as JSON.
- A Delta append output among several outputs is counted with its rows (the run's report,
  each batch's per-output counts and ``sparkonce_rows_committed_total``), and Spark's input
  rows are counted once per record, not once per output branch that reads the source.

The oracle is the input: the log holds the values 1..N, so each output's row count is
computed here from the numbers.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import DeltaSink, EmbeddedLogSource, Pipeline, RunStopped, SQLiteSink
from sparkonce.ledger.delta import app_id
from sparkonce.observe import Observers, RunObserver
from sparkonce.observe.metrics import MetricsObserver
from tests.spark.test_pipeline import values

RECORDS = 400
SMALL = RECORDS // 100  # values divisible by 100 go to the second output too


def delta_commits(table: Path) -> list[dict[str, Any]]:
    """Each commit of the table, read from ``_delta_log/<version>.json``: its version, its
    ``commitInfo`` and its ``txn`` actions."""
    commits = []
    for path in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        txns = [a["txn"] for a in actions if "txn" in a]
        commits.append({"version": int(path.stem), "info": info, "txns": txns})
    return commits


def batch_commits(table: Path, pipeline: str) -> list[dict[str, Any]]:
    """The commits that carry a batch of ``pipeline`` (a ``txn`` of its application id and
    data written: appends, not the epoch commits, which add no file)."""
    return [
        c
        for c in delta_commits(table)
        if any(t["appId"] == app_id(pipeline) for t in c["txns"])
        and int(c["info"].get("operationMetrics", {}).get("numOutputRows", 0)) > 0
    ]


@pytest.mark.campaign_lane  # in the rotation: make test's budget
def test_every_append_commit_carries_its_ledger_entry(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(300)
    p = Pipeline(
        name="meta",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=50),
        transform=lambda df: values(df).drop("record_id"),
        sink=DeltaSink(tmp_path / "t"),
        checkpoint=tmp_path / "chk",
    )
    report = p.run(spark, timeout=300)
    assert report.batches_committed >= 2 and report.rows_committed == 300, report
    commits = batch_commits(tmp_path / "t", "meta")
    assert len(commits) == report.batches_committed, commits
    for seq, commit in enumerate(commits):
        meta = commit["info"].get("userMetadata")
        assert meta is not None, f"append commit {commit['version']} has no userMetadata"
        entry = json.loads(meta)
        assert (entry["sparkonce"], entry["pipeline"], entry["seq"]) == ("batch", "meta", seq)
        assert entry["epoch"] == report.epoch
        spans = [b - a for parts in entry["ranges"].values() for a, b in parts.values()]
        assert sum(spans) == int(commit["info"]["operationMetrics"]["numOutputRows"])


class _StopWhenSeen(RunObserver):
    """Stops the run once Spark's progress of the batch that read the last record came
    (its listener event comes after the batch's commit)."""

    def __init__(self, stop: threading.Event, records: int) -> None:
        self.stop = stop
        self.records = records
        self.last_batch: int | None = None

    def on_batch(self, report: Any) -> None:
        if sum(report.ranges.ends().values()) >= self.records:
            self.last_batch = report.spark_batch_id

    def on_progress(self, progress: Any) -> None:
        if self.last_batch is not None and progress.batchId >= self.last_batch:
            self.stop.set()


def two_outputs(df: DataFrame) -> dict[str, DataFrame]:
    rows = values(df).drop("record_id")
    return {"rows": rows, "small": rows.where(F.col("value") % 100 == 0)}


@pytest.mark.campaign_lane  # in the rotation: make test's budget
def test_a_delta_output_among_several_is_counted(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(RECORDS)
    p = Pipeline(
        name="counts",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=50),
        transform=two_outputs,
        outputs={
            "rows": DeltaSink(tmp_path / "t"),
            "small": SQLiteSink(f"sqlite:///{tmp_path / 'small.db'}", "small"),
        },
        checkpoint=tmp_path / "chk",
        trigger="processingTime=1 second",
    )
    metrics = MetricsObserver("counts")
    stop = threading.Event()
    batches: list[Any] = []
    with pytest.raises(RunStopped):
        p.run(
            spark,
            timeout=300,
            stop=stop,
            on_batch=batches.append,
            observer=Observers(metrics, _StopWhenSeen(stop, RECORDS)),
        )
    committed = [b for b in batches if not b.result.skipped]
    assert sum(b.result.per_output["rows"] for b in committed) == RECORDS, committed
    assert sum(b.result.per_output["small"] for b in committed) == SMALL
    assert sum(b.result.row_count for b in committed) == RECORDS + SMALL
    # The Delta table's own commits say the same (read from its log, not through sparkonce).
    written = sum(
        int(c["info"]["operationMetrics"]["numOutputRows"])
        for c in batch_commits(tmp_path / "t", "counts")
    )
    assert written == RECORDS
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(metrics.exposition())
        for s in family.samples
    }
    assert samples["sparkonce_rows_committed_total"] == RECORDS + SMALL, samples
    assert samples["sparkonce_input_rows_total"] == RECORDS, samples
