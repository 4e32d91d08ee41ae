"""Library use (``Pipeline.run`` on a session of the user's own, logging to the console with
Spark's default log4j profile): a fenced run raises ``FencedError`` and prints no Java stack.

The shared test session is such a session (no log4j configuration file). The fencing is
real: a newer run takes the epoch just before this run's commit, so the protocol's step 0
fences it. What reaches the process's stderr (file descriptor 2, which the JVM writes to)
is read with pytest's ``capfd``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from sparkonce import EmbeddedLogSource, FencedError, Pipeline, SQLiteSink
from sparkonce.ledger.base import BatchContext, CommitResult
from sparkonce.pipeline.spark import QUERY_ERROR_LOGGERS


class UsurpedSink(SQLiteSink):
    """The real sink, taken over by a newer run just before this run's commit."""

    def commit(self, ctx: BatchContext, df: DataFrame) -> CommitResult:
        with SQLiteSink(self.url, "out") as newer:
            newer.acquire(ctx.pipeline)
        return super().commit(ctx, df)


def _levels(spark: SparkSession) -> list[str]:
    jvm: Any = spark._jvm
    manager = jvm.org.apache.logging.log4j.LogManager
    return [str(manager.getLogger(name).getLevel()) for name in QUERY_ERROR_LOGGERS]


def test_a_fenced_library_run_prints_no_spark_stack(
    spark: SparkSession,
    tmp_path: Path,
    make_log: Any,
    capfd: pytest.CaptureFixture[str],
) -> None:
    log_dir = make_log(5, partitions=1)
    p = Pipeline(
        name="usurped",
        source=EmbeddedLogSource(log_dir, "events"),
        transform=lambda df: df.selectExpr("CAST(value AS STRING) AS v"),
        sink=UsurpedSink(f"sqlite:///{tmp_path / 'out.db'}", "out"),
        checkpoint=tmp_path / "chk",
    )
    levels = _levels(spark)
    capfd.readouterr()
    with pytest.raises(FencedError, match="this run holds epoch 1, but the sink's owner epoch"):
        p.run(spark, timeout=300)
    err = capfd.readouterr().err
    assert "terminated with error" not in err, err
    assert "\tat org.apache.spark" not in err and "Traceback" not in err, err
    assert _levels(spark) == levels  # the session's logging is as it was
