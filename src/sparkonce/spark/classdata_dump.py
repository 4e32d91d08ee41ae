"""The build of the class-data archive (:mod:`sparkonce.spark.classdata`): ``python -m
sparkonce.spark.classdata_dump TARGET`` starts a driver the way :func:`build_session` does, runs
the kind of work a pipeline's driver does, and lets the JVM write the classes it loaded to
``TARGET`` as it exits. :func:`~sparkonce.spark.classdata.ensure_archive` runs it in a
process of its own.

A module of its own, above both: :mod:`sparkonce.spark.session` maps the archive that
:mod:`sparkonce.spark.classdata` names, and this build starts a session.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from sparkonce.spark.classdata import BUILD_TIMEOUT_S, QUIET
from sparkonce.spark.session import QUICK_START_JAVA_OPTIONS, build_session


def _count(batch: Any, _batch_id: int) -> None:
    batch.count()


def _dump(target: str) -> None:
    """Run the kind of work a pipeline's driver does, then let the JVM write the classes it
    loaded to ``target`` as it exits."""
    from pyspark import SparkContext
    from pyspark.sql import functions as F

    # Dumped with the quick-start options; an archive maps under other GC and JIT settings too.
    spark = build_session(
        master="local[2]",
        app_name="sparkonce-class-data",
        conf={
            "spark.driver.extraJavaOptions": (
                f"-XX:ArchiveClassesAtExit={target} {QUIET} {QUICK_START_JAVA_OPTIONS}"
            )
        },
    )
    df = spark.range(1000).withColumn("k", F.col("id") % 7)
    df.groupBy("k").agg(F.sum("id"), F.count("*")).collect()
    df.select(F.udf(lambda x: x + 1, "long")("id")).collect()
    df.toPandas()
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "in").mkdir()
        (Path(scratch) / "in" / "part.json").write_text('{"v": 1}\n{"v": 2}\n')
        query = (
            spark.readStream.schema("v long")
            .json(str(Path(scratch) / "in"))
            .writeStream.foreachBatch(_count)
            .option("checkpointLocation", str(Path(scratch) / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
    spark.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        proc = gateway.proc  # the JVM writes the archive in its exit path
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=BUILD_TIMEOUT_S)


if __name__ == "__main__":
    _dump(sys.argv[1])
