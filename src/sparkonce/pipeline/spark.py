"""Building a SparkSession suited to sparkonce pipelines (used by the CLI and tests).

Library code never creates a session by itself: ``Pipeline.run`` takes one.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def build_session(
    master: str = "local[2]",
    app_name: str = "sparkonce",
    shuffle_partitions: int = 2,
    jars: list[str] | None = None,
) -> SparkSession:
    """A session with RocksDB state (changelog checkpointing) and few shuffle partitions.

    Sets ``PYSPARK_PYTHON`` to this interpreter first, so Python workers use the
    same virtualenv as the driver. ``jars`` go to ``spark.jars`` (for example Spark's
    own Kafka connector, fetched by ``scripts/fetch-jars.sh``); they only take
    effect when this call creates the session.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    spark = (
        builder.master(master)
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=warn")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
