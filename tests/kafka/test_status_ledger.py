"""``sparkonce status`` on a kafka:// URL reads the ledger topic's store directly (the URL
registry, sparkonce.sinks.registry), against the real broker."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from sparkonce.errors import ConfigError
from sparkonce.kafka.client import KafkaConnection
from sparkonce.ledger.base import LedgerEntry
from sparkonce.ledger.kafka_topic import KafkaLedgerStore
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.pipeline.status import open_status_sink, pipeline_status


def test_status_reads_the_kafka_ledger_and_creates_no_ledger_for_a_missing_topic(
    kafka_broker, kafka_topic: Callable[..., str]
) -> None:
    out = kafka_topic("out", partitions=1)
    conn = KafkaConnection(kafka_broker.bootstrap, {})
    writer = KafkaLedgerStore(conn, f"{out}.sparkonce-ledger", topic=out)
    writer.open()
    epoch = writer.acquire("p", "kafka://src/events").epoch
    entry = LedgerEntry(
        "p", 0, BatchRanges((OffsetRange("events", 0, 0, 7),)), epoch, 7, datetime.now(UTC)
    )
    with writer.transaction() as txn:
        writer.check_owner(txn, "p", epoch)
        writer.record(txn, entry)
    writer.close()

    url = f"kafka://{kafka_broker.bootstrap}/{out}"
    ledger, label = open_status_sink(url)
    try:
        st = pipeline_status(ledger, "p")
        assert ledger.pipelines() == ["p"]
    finally:
        ledger.close()
    assert label == url
    assert st.sink == f"Kafka ledger topic '{out}.sparkonce-ledger' at {kafka_broker.bootstrap}"
    assert (st.batches, st.rows_committed, st.owner and st.owner.epoch) == (1, 7, epoch)

    missing = f"{out}-none"
    with pytest.raises(ConfigError, match=f"its output topic '{missing}' does not exist"):
        open_status_sink(f"kafka://{kafka_broker.bootstrap}/{missing}")
    assert f"{missing}.sparkonce-ledger" not in conn.topics()
