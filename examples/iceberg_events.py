# examples/iceberg_events.py: events from the embedded log -> an Apache Iceberg table, each once
#
#   sparkonce run examples/iceberg_events.py   (EVENTS_DATA: the data directory, default data)
#
# Spark's tasks write each batch as Parquet files; PyIceberg adds them, with the batch's
# ledger entry, in one snapshot of the table. The catalog is a SQLite file beside the
# warehouse; read the table with PyIceberg (catalog.load_table("lake.events").scan()) or
# any Iceberg reader.
import os

from pyiceberg.catalog.sql import SqlCatalog
from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, IcebergSink, Pipeline

DATA = os.path.abspath(os.environ.get("EVENTS_DATA", "data"))
os.makedirs(DATA, exist_ok=True)


def transform(events):
    return events.select(
        "record_id",
        "partition",
        "offset",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("amount"),
        F.col("timestamp").alias("at"),
    )


catalog = SqlCatalog("events", uri=f"sqlite:///{DATA}/catalog.db", warehouse=f"file://{DATA}/lake")

pipeline = Pipeline(
    name="iceberg-events",
    source=EmbeddedLogSource(f"{DATA}/log", "events", max_records_per_partition=500),
    transform=transform,
    sink=IcebergSink(catalog, "lake.events"),
    checkpoint=f"{DATA}/checkpoint",
)
