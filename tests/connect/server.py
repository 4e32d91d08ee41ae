"""A local Spark Connect server for the tests: a classic session with Spark's Connect
plugin (the installed PySpark's own jars) and Spark's Kafka connector (the pinned jars,
scripts/fetch-jars.sh), serving gRPC on the port given as argv[1]. Prints "ready" once it
listens and runs until its stdin closes."""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession

from sparkonce.spark.jars import find_jars


def main(port: int) -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sparkonce-connect-tests")
        .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
        .config("spark.connect.grpc.binding.port", str(port))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.jars", ",".join(find_jars("spark-kafka")))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    print("ready", flush=True)
    sys.stdin.read()
    spark.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]))
