# examples/delta_events.py: events from the embedded log -> a Delta Lake table, each once
import os

from pyspark.sql import functions as F

from sparkonce import DeltaSink, EmbeddedLogSource, Pipeline

DATA = os.environ.get("EVENTS_DATA", "data")


def transform(events):
    return events.select(
        "record_id",
        "partition",
        "offset",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("amount"),
    )


pipeline = Pipeline(
    name="delta-events",
    source=EmbeddedLogSource(f"{DATA}/log", "events", max_records_per_partition=500),
    transform=transform,
    sink=DeltaSink(f"{DATA}/tables", table="events"),
    checkpoint=f"{DATA}/checkpoint",
)
