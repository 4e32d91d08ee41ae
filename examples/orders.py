# examples/orders.py: JSON orders -> totals and dead letters (PostgreSQL) + an audit (SQLite)
import os

from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, Pipeline, PostgresSink, SQLiteSink
from sparkonce.outputs import mark_bad, parse_json, then

PG = os.environ.get("ORDERS_PG", "postgresql://sparkonce@127.0.0.1:5432/orders")
DATA = os.environ.get("ORDERS_DATA", "data")


def transform(orders):
    parsed = parse_json(
        orders, "order_id STRING, customer STRING, amount DECIMAL(12,2)",
        required=("order_id", "customer", "amount"),
    )
    checked = then(parsed, lambda df: mark_bad(
        df, F.col("data.amount") <= 0, "NON_POSITIVE_AMOUNT", "amount must be positive"))
    accepted = checked.good.select(
        "record_id", "data.order_id", "data.customer", "data.amount",
        F.expr("uuid()").alias("audit_id"),             # non-deterministic on purpose
    )
    totals = accepted.groupBy("customer").agg(
        F.sum("amount").alias("total"), F.count("*").alias("orders"))
    return {"totals": totals, "dead_letters": checked.bad, "audit": accepted}


pipeline = Pipeline(
    name="orders",
    source=EmbeddedLogSource(f"{DATA}/log", "orders", max_records_per_partition=500),
    transform=transform,
    outputs={
        "totals": PostgresSink(PG, "customer_totals", mode="upsert", keys=["customer"]),
        "dead_letters": PostgresSink(PG, "order_dead_letters"),
        "audit": SQLiteSink(f"sqlite:///{DATA}/audit.db", "accepted_orders"),
    },
    checkpoint=f"{DATA}/checkpoint",
)
