# examples/delta_to_delta.py: bronze -> silver, one Delta table into another, each row once
#
#   python examples/delta_to_delta.py     creates the bronze table under $EVENTS_DATA (once)
#   sparkonce run examples/delta_to_delta.py
import os
import sys

from pyspark.sql import functions as F

from sparkonce import DeltaSink, DeltaSource, Pipeline

DATA = os.environ.get("EVENTS_DATA", "data")
VERSIONS, ROWS = 4, 1500  # the bronze table: 4 appends (versions 0-3) of 1,500 rows


def silver(bronze):
    """Keep the paid events, with the amount in cents."""
    return bronze.where(F.col("amount") % 10 != 0).select(
        "event_id", "key", (F.col("amount") * 100).alias("amount_cents")
    )


pipeline = Pipeline(
    name="bronze-to-silver",
    # One data file per append, one append per batch: a batch ends on a version boundary.
    source=DeltaSource(f"{DATA}/bronze", max_files_per_batch=1),
    transform=silver,
    sink=DeltaSink(f"{DATA}/tables", table="silver"),
    checkpoint=f"{DATA}/checkpoint",
)


def make_bronze() -> None:
    """Append the bronze table's versions with Spark, one data file each."""
    from sparkonce.spark.session import build_session

    spark = build_session(conf=pipeline.spark_conf())
    for v in range(VERSIONS):
        first = v * ROWS + 1
        spark.range(first, first + ROWS, numPartitions=1).select(
            F.col("id").alias("event_id"),
            F.concat(F.lit("k"), (F.col("id") % 7).cast("string")).alias("key"),
            F.col("id").alias("amount"),
        ).write.format("delta").mode("append").save(f"{DATA}/bronze")
    spark.stop()


if __name__ == "__main__":
    if os.path.exists(f"{DATA}/bronze/_delta_log"):
        sys.exit(f"{DATA}/bronze exists already")
    make_bronze()
