"""Several sources in one pipeline, on a real broker and PostgreSQL: a watermarked LEFT OUTER
stream-stream join of two Kafka topics (orders with their payments, tests/kafka/orders_payments.py)
into PostgreSQL, in append mode.

The output read back with psycopg must equal the oracle computed in plain Python from the two
inputs, each row once, including the unmatched orders that Spark's no-data batch emits once
the last input moved the watermark. The ledger's entries hold both topics' ranges, Spark's
offset log holds one line per source (the join's left side first, measured here), ``explain``
and ``status`` name both sources, a run with nothing new commits nothing, and a lost
checkpoint of the (stateful) join is refused before the epoch.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sparkonce import CheckpointLostError, DeltaSink, KafkaSource, Pipeline, Sink, sink_from_url
from sparkonce.offsets import check_chain
from sparkonce.pipeline.status import pipeline_status
from sparkonce.spark.checkpoint import Checkpoint
from tests.delta.test_source import delta_rows
from tests.kafka import orders_payments as op
from tests.spark.test_pipeline import forget_commit

pytestmark = pytest.mark.spark

PARTITIONS = 2
LIMIT = 40  # records per partition per batch: about three batches of each topic


def join_pipeline(
    bootstrap: str, orders: str, payments: str, sink: str | Sink, checkpoint: Path
) -> Pipeline:
    """The join into ``sink`` (a PostgreSQL URL: its table ``joined``; or a sink)."""
    return Pipeline(
        name="orders-payments",
        sources={
            "orders": KafkaSource(
                bootstrap, orders, value_format="utf8", max_records_per_partition=LIMIT
            ),
            "payments": KafkaSource(
                bootstrap, payments, value_format="utf8", max_records_per_partition=LIMIT
            ),
        },
        transform=op.join,
        sink=sink_from_url(sink, "joined") if isinstance(sink, str) else sink,
        checkpoint=checkpoint,
        output_mode="append",
    )


@pytest.mark.crash_lane  # about 100 s: explain, two runs of the join, a refused run
def test_join_of_two_topics_into_postgres_equals_the_oracle(
    spark: SparkSession,
    tmp_path: Path,
    kafka_broker: Any,
    kafka_topic: Callable[..., str],
    pg_url: str,
) -> None:
    orders, payments = kafka_topic("orders", PARTITIONS), kafka_topic("pays", PARTITIONS)
    op.produce(kafka_broker.bootstrap, orders, payments, PARTITIONS)
    chk = tmp_path / "chk"

    def pipeline() -> Pipeline:
        return join_pipeline(kafka_broker.bootstrap, orders, payments, pg_url, chk)

    explained = pipeline().explain(spark)
    parts = {p.part: p for p in explained.parts}
    assert orders in parts["source orders"].what and payments in parts["source payments"].what
    assert "all 2 sources together" in parts["source orders"].why

    report = pipeline().run(spark)
    got = op.read_pairs(pg_url, "joined")
    want = op.expected()
    assert got == want, (
        f"missing {want - got}, extra {got - want}; batches "
        f"{[(b.spark_batch_id, str(b.ranges), b.result.row_count) for b in report.batches]}"
    )
    assert report.rows_committed == sum(want.values())

    p = pipeline()
    p.sink.open()
    try:
        ledger = p.sink.ledger(p.name)
        status = pipeline_status(p.sink, p.name)
    finally:
        p.sink.close()
    assert not check_chain(e.ranges for e in ledger)
    assert all({r.topic for r in e.ranges.ranges} == {orders, payments} for e in ledger)
    assert ledger[-1].ranges.ends() == {
        **{
            (orders, q): len(op.orders()) // PARTITIONS + (q < len(op.orders()) % PARTITIONS)
            for q in range(PARTITIONS)
        },
        **{
            (payments, q): len(op.payments()) // PARTITIONS + (q < len(op.payments()) % PARTITIONS)
            for q in range(PARTITIONS)
        },
    }
    # The last entry is the no-data batch after the sentinels: no offsets, the last orders
    # that found no payment.
    last = ledger[-1]
    assert last.ranges.empty and last.row_count > 0, [(str(e.ranges), e.row_count) for e in ledger]
    assert ledger[-2].ranges.count > 0
    # A batch in which only one topic had records covers an empty range of the other.
    assert all(e.stateful for e in ledger)
    # status names both sources; lag is read from each.
    assert status.source.startswith("SourceSet(orders: KafkaSource(")
    assert "payments: KafkaSource(" in status.source
    assert {pt.topic for pt in status.partitions} == {orders, payments}
    assert status.total_lag == 0

    # Spark's offset log: one line per source, the join's left side (orders) first.
    text = (chk / "offsets" / "0").read_text().splitlines()
    lines = [json.loads(x) for x in text[2:] if x.strip()]
    assert [list(x) for x in lines] == [[orders], [payments]]
    offset = Checkpoint(chk).source_offset(0, p.source)
    assert offset is not None and list(json.loads(offset)) == ["orders", "payments"]

    # Nothing new: a run commits nothing and the output stays the same.
    again = pipeline().run(spark)
    assert again.rows_committed == 0 and op.read_pairs(pg_url, "joined") == want

    # The join keeps state in the checkpoint: a lost checkpoint is refused before the epoch.
    shutil.rmtree(chk)
    with pytest.raises(CheckpointLostError, match="kept state"):
        pipeline().run(spark)
    assert op.read_pairs(pg_url, "joined") == want


def delta_pairs(table: Path) -> Counter[tuple[int, int | None]]:
    """A Delta output table as ``(order_id, pay_id)`` pairs, read with pyarrow on the files
    its log names (no Spark)."""
    rows = delta_rows(table, ["order_id", "pay_id"])
    return Counter((int(o), None if p is None else int(p)) for o, p in rows)


@pytest.mark.crash_lane  # about 100 s: two runs of the join into Delta
def test_join_of_two_topics_into_delta_equals_the_oracle(
    spark: SparkSession,
    tmp_path: Path,
    kafka_broker: Any,
    kafka_topic: Callable[..., str],
) -> None:
    """The same LEFT OUTER join into a DeltaSink (append): the table read with pyarrow equals
    the plain-Python oracle, each row once, the no-data batch's unmatched orders included;
    a replay of that no-data batch (Spark forgot its commit) is skipped by its identity."""
    orders, payments = kafka_topic("orders", PARTITIONS), kafka_topic("pays", PARTITIONS)
    op.produce(kafka_broker.bootstrap, orders, payments, PARTITIONS)
    chk, tables = tmp_path / "chk", tmp_path / "tables"

    def pipeline() -> Pipeline:
        sink = DeltaSink(tables, table="joined")
        return join_pipeline(kafka_broker.bootstrap, orders, payments, sink, chk)

    report = pipeline().run(spark)
    got, want = delta_pairs(tables / "joined"), op.expected()
    assert got == want, (
        f"missing {want - got}, extra {got - want}; batches "
        f"{[(b.spark_batch_id, str(b.ranges), b.result.row_count) for b in report.batches]}"
    )
    assert report.rows_committed == sum(want.values())
    p = pipeline()
    ledger = p.sink.ledger(p.name)
    assert not check_chain(e.ranges for e in ledger)
    assert all({r.topic for r in e.ranges.ranges} == {orders, payments} for e in ledger)
    # The last entry is the no-data batch: no offsets, the last unmatched orders.
    assert ledger[-1].ranges.empty and ledger[-1].row_count > 0, [
        (str(e.ranges), e.row_count) for e in ledger
    ]
    assert sum(e.row_count for e in ledger) == sum(want.values())

    forget_commit(chk, max(e.spark_batch_id or 0 for e in ledger))
    again = pipeline().run(spark)
    assert again.batches_skipped == 1 and again.rows_committed == 0, again
    assert delta_pairs(tables / "joined") == want
