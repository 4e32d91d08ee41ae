"""A local Spark Connect server for the tests: a classic session with Spark's Connect
plugin (the installed PySpark's own jars), Spark's Kafka connector (the pinned jars,
scripts/fetch-jars.sh) and Delta Lake (sparkonce's pinned jars, extension and catalog:
:func:`sparkonce.sinks.delta.delta_spark_conf`), serving gRPC on the port given as argv[1].
Prints "ready" once it listens and runs until its stdin closes.
``SPARKONCE_TEST_CONNECT_CONF`` (JSON, optional) holds more settings, such as S3A's for a
server that writes checkpoints on S3; its ``spark.jars`` are added to the others."""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession

from sparkonce.sinks.delta import delta_spark_conf
from sparkonce.spark.jars import find_jars


def main(port: int) -> None:
    conf = delta_spark_conf()
    extra = json.loads(os.environ.get("SPARKONCE_TEST_CONNECT_CONF", "{}"))
    jars = [
        *find_jars("spark-kafka"),
        *filter(None, conf.pop("spark.jars", "").split(",")),
        *filter(None, extra.pop("spark.jars", "").split(",")),
    ]
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("sparkonce-connect-tests")
        .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
        .config("spark.connect.grpc.binding.port", str(port))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.jars", ",".join(jars))
    )
    for key, value in {**conf, **extra}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print("ready", flush=True)
    sys.stdin.read()
    spark.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]))
