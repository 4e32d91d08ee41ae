"""Orders joined with their payments: the stream-stream join of two Kafka topics that the
several-sources tests run (tests/kafka/test_source_set.py, tests/crash/test_source_set_crash.py),
with its input and its oracle in plain Python.

Orders ``order_id,epoch_seconds`` and payments ``pay_id,order_id,epoch_seconds`` (UTF-8
values), each topic produced in event-time order, round-robin over its partitions. The join
is a LEFT OUTER join of orders with the payments made 0 to ``BOUND_S`` seconds after the
order, both sides watermarked ``DELAY_S`` seconds behind. An order with a payment in that
window comes out once per such payment, as soon as both are read; an order with none comes
out once with no payment, once the watermark has passed the end of its window. The last
order and its payment are ``SENTINEL_GAP_S`` seconds after the others: they move the
watermark past every other order, so every unmatched order comes out, the last ones in
Spark's no-data batch after the sentinels' batch.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ORDERS = 240
BASE = 1_764_000_000  # epoch seconds of order 0
BOUND_S = 20
DELAY_S = 30
SENTINEL_GAP_S = 1000
SENTINEL = ORDERS  # the last order's id

Order = tuple[int, int]  # order_id, ts
Payment = tuple[int, int, int]  # pay_id, order_id, ts


def orders() -> list[Order]:
    out = [(i, BASE + i) for i in range(ORDERS)]
    return [*out, (SENTINEL, BASE + ORDERS + SENTINEL_GAP_S)]


def payments() -> list[Payment]:
    """In event-time order: one in the window for i % 3 == 1 (a second one for i % 15 == 1),
    one just after the window for i % 3 == 2, one before the order for i % 7 == 0, none
    otherwise; and the sentinel order's payment."""
    made: list[tuple[int, int]] = []
    for i, ts in orders()[:-1]:
        if i % 3 == 1:
            made.append((i, ts + (i * 7) % (BOUND_S + 1)))
            if i % 15 == 1:
                made.append((i, ts + 2))
        elif i % 3 == 2:
            made.append((i, ts + BOUND_S + 5))
        if i % 7 == 0:
            made.append((i, ts - 3))
    made.append((SENTINEL, BASE + ORDERS + SENTINEL_GAP_S))
    made.sort(key=lambda p: (p[1], p[0]))
    return [(10_000 + n, oid, ts) for n, (oid, ts) in enumerate(made)]


def expected() -> Counter[tuple[int, int | None]]:
    """The join's output as ``(order_id, pay_id)`` pairs (``pay_id`` None: unmatched)."""
    out: Counter[tuple[int, int | None]] = Counter()
    pays = payments()
    for oid, ots in orders():
        matched = [pid for pid, poid, pts in pays if poid == oid and ots <= pts <= ots + BOUND_S]
        for pid in matched:
            out[(oid, pid)] += 1
        if not matched:
            out[(oid, None)] += 1
    return out


def produce(bootstrap: str, orders_topic: str, payments_topic: str, partitions: int) -> None:
    """Write both inputs, round-robin over ``partitions`` partitions, and wait for the acks."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for n, (oid, ts) in enumerate(orders()):
        producer.produce(orders_topic, f"{oid},{ts}".encode(), partition=n % partitions)
    for n, (pid, oid, ts) in enumerate(payments()):
        producer.produce(payments_topic, f"{pid},{oid},{ts}".encode(), partition=n % partitions)
    assert producer.flush(30) == 0


def join(dfs: dict[str, DataFrame]) -> DataFrame:
    """The pipeline's transform: orders LEFT OUTER JOIN payments in the time window."""
    from pyspark.sql import functions as F

    def fields(df: DataFrame) -> Any:
        return F.split(df["value"], ",")

    o = dfs["orders"]
    o = o.select(
        fields(o)[0].cast("long").alias("order_id"),
        F.timestamp_seconds(fields(o)[1].cast("long")).alias("order_ts"),
    ).withWatermark("order_ts", f"{DELAY_S} seconds")
    p = dfs["payments"]
    p = p.select(
        fields(p)[0].cast("long").alias("pay_id"),
        fields(p)[1].cast("long").alias("pay_order"),
        F.timestamp_seconds(fields(p)[2].cast("long")).alias("pay_ts"),
    ).withWatermark("pay_ts", f"{DELAY_S} seconds")
    window = (
        f"order_id = pay_order AND pay_ts >= order_ts AND "
        f"pay_ts <= order_ts + INTERVAL {BOUND_S} SECONDS"
    )
    return o.join(p, F.expr(window), "leftOuter").select("order_id", "order_ts", "pay_id", "pay_ts")


def read_pairs(pg_url: str, table: str) -> Counter[tuple[int, int | None]]:
    """The output table as ``(order_id, pay_id)`` pairs, read with psycopg."""
    import psycopg

    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(f"SELECT order_id, pay_id FROM {table}").fetchall()
    return Counter((int(o), None if p is None else int(p)) for o, p in rows)
