"""dedupe on a skewed topic read with a cap per partition (issue 40, item C).

The records are produced in event-time order (event time = produce serial, in seconds), with
a few re-sends just behind and a few records sent far too late, onto three partitions of the
embedded log, three quarters of them on partition 0. The oracle is plain Python over the
produced order: a record is truly late when an earlier-produced record's event time is more
than ``within`` ahead of its own. With a cap per partition, the small partitions would run
ahead in event time and the watermark would pass partition 0's unread, on-time records; with
the limit shared out by backlog, exactly the truly late records reach the late output.
"""

from __future__ import annotations

import logging
import random
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink
from sparkonce.log import IdempotentProducer, Topic
from sparkonce.outputs import dedupe
from sparkonce.outputs.late import late_records

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

BASE_US = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z
WITHIN_S = 60


def _produce(root: Path) -> list[tuple[str, int]]:
    """2,400 orders in event-time order, 40 re-sends 5 s behind, 12 orders sent at the end
    with event times near the start; (record id, event time in s) in produced order."""
    rng = random.Random(40)
    sent: list[tuple[str, int, int]] = []  # id, event time, partition
    for i in range(2400):
        part = 0 if rng.random() < 0.75 else rng.choice((1, 2))
        sent.append((f"o{i}", i, part))
        if i % 60 == 59:  # the producer crashed and re-sent a record of 5 s ago
            rid, t, p = sent[-6]
            sent.append((rid, t, p))
    sent += [(f"stale{k}", k, k % 3) for k in range(12)]
    with (
        Topic.create(root, "orders", 3) as topic,
        IdempotentProducer(topic, "shop") as producer,
    ):
        for rid, t, part in sent:
            producer.send(
                rid.encode(), partition=part, record_id=rid, timestamp_us=BASE_US + t * 1_000_000
            )
    return [(rid, t) for rid, t, _ in sent]


def _truly_late(sent: list[tuple[str, int]]) -> set[str]:
    """Ids whose event time is behind the greatest one produced before them by more than
    ``within`` (Spark drops a record at or behind the watermark)."""
    late: set[str] = set()
    top: int | None = None
    for rid, t in sent:
        if top is not None and t <= top - WITHIN_S:
            late.add(rid)
        top = t if top is None else max(top, t)
    return late


@pytest.mark.crash_lane  # a real Pipeline.run of about 6 batches: 40 s on a busy machine
def test_a_cap_per_partition_does_not_route_on_time_records_to_late(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from pyspark.sql import functions as F

    sent = _produce(tmp_path / "log")
    late = _truly_late(sent)
    assert late == {f"stale{k}" for k in range(12)}  # the re-sends are only 5 s behind
    on_time = {rid for rid, _ in sent} - late

    def transform(df: DataFrame) -> dict[str, DataFrame]:
        events = df.select(F.col("record_id").alias("id"), F.col("timestamp").alias("ts"))
        events = events.withWatermark("ts", f"{WITHIN_S} seconds")
        return {
            "orders": dedupe(events, "id", within=f"{WITHIN_S} seconds", event_time="ts"),
            "late": late_records(events.where(F.col("id").isNotNull()), "ts"),
        }

    store = f"sqlite:///{tmp_path / 'out.db'}"
    pipeline = Pipeline(
        name="skew",
        source=EmbeddedLogSource(tmp_path / "log", "orders", max_records_per_partition=150),
        transform=transform,
        outputs={"orders": SQLiteSink(store, "orders"), "late": SQLiteSink(store, "late")},
        checkpoint=tmp_path / "checkpoint",
        output_mode="append",
    )
    caplog.set_level(logging.WARNING, logger="sparkonce.run")
    report = pipeline.run(spark, timeout=300)

    with sqlite3.connect(tmp_path / "out.db") as conn:
        orders = [i for (i,) in conn.execute("SELECT id FROM orders")]
        routed = [i for (i,) in conn.execute("SELECT id FROM late")]
    assert sorted(routed) == sorted(late), f"{len(set(routed) - late)} on-time records in late"
    assert sorted(orders) == sorted(on_time)
    assert len(report.batches) <= 7  # a few batches: 450 records each, shared by backlog
    assert any("max_records_per_partition=150" in m for m in caplog.messages), caplog.messages
