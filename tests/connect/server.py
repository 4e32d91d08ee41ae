"""A local Spark Connect server for the tests: a classic session with Spark's Connect
plugin (the installed PySpark's own jars) and Delta Lake (sparkonce's pinned jars, extension
and catalog: :func:`sparkonce.sinks.delta.delta_spark_conf`), serving gRPC on the port given
as argv[1]. Prints "ready" once it listens and runs until its stdin closes."""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession

from sparkonce.sinks.delta import delta_spark_conf


def main(port: int) -> None:
    builder = SparkSession.builder
    for key, value in delta_spark_conf().items():
        builder = builder.config(key, value)
    spark = (
        builder.master("local[2]")
        .appName("sparkonce-connect-tests")
        .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
        .config("spark.connect.grpc.binding.port", str(port))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    print("ready", flush=True)
    sys.stdin.read()
    spark.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]))
