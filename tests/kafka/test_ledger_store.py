"""KafkaLedgerStore against the real broker: epochs, fencing, and the driver's transaction."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from sparkonce import FencedError
from sparkonce.errors import KafkaUnavailableError
from sparkonce.kafka.client import KafkaConnection
from sparkonce.ledger.base import BatchContext, LedgerEntry
from sparkonce.ledger.kafka_topic import KafkaLedgerStore, transactional_id
from sparkonce.offsets import BatchRanges, OffsetRange

P = "ls1"
BATCH = BatchRanges(tuple(OffsetRange("events", p, 0, 100) for p in range(2)))
NO_DATA = BatchRanges(tuple(OffsetRange("events", p, 100, 100) for p in range(2)))


@pytest.fixture
def new_store(kafka_broker, kafka_topic: Callable[..., str]) -> Callable[[], KafkaLedgerStore]:
    """``new_store()``: a new store (its own producer and reads) on one fresh ledger topic."""
    out = kafka_topic("out", partitions=1)

    def make() -> KafkaLedgerStore:
        return KafkaLedgerStore(
            KafkaConnection(kafka_broker.bootstrap, {}),
            f"{out}.sparkonce-ledger",
            topic=out,
            inspect_hint="status --pipeline {pipeline}",
        )

    return make


def entry(seq: int, epoch: int, ranges: BatchRanges, **kw: Any) -> LedgerEntry:
    return LedgerEntry(P, seq, ranges, epoch, 10 * seq, datetime.now(UTC), **kw)


def test_acquire_bumps_the_epoch_and_fences_the_older_run(new_store) -> None:
    a, b = new_store(), new_store()
    ea = a.acquire(P, "kafka://src/events").epoch
    owner = b.acquire(P)
    assert owner.epoch == ea + 1 and new_store().owner(P) == owner
    # Step 1 of the older run: fenced, naming the holder of the newer epoch.
    with pytest.raises(FencedError) as info, a.transaction() as txn:
        a.check_owner(txn, P, ea)
    assert info.value.owner_epoch == owner.epoch and info.value.holder == owner.holder
    assert "status --pipeline ls1" in str(info.value)
    # Even past step 1, the older run's producer is fenced: its commit fails, writes nothing.
    with pytest.raises(FencedError), a.transaction() as txn:
        a.record(txn, entry(0, ea, BATCH))
    with b.transaction() as txn:
        b.check_owner(txn, P, owner.epoch)
        assert b.last_in(txn, P) is None
    assert new_store().entries(P) == []


def test_recorded_entry_is_read_back_and_an_error_leaves_none(new_store) -> None:
    store = new_store()
    epoch = store.acquire(P).epoch
    first = entry(0, epoch, BATCH, spark_batch_id=3, checkpoint_id="q1", stateful=False)
    with store.transaction() as txn:
        store.check_owner(txn, P, epoch)
        store.record(txn, first)
    assert store.entries(P) == [first] and store.last(P) == first  # readable on return
    reader = new_store()
    assert reader.entries(P) == [first] and reader.last(P) == first

    # An error inside the block aborts the Kafka transaction: no entry.
    with pytest.raises(RuntimeError, match="boom"), store.transaction() as txn:
        store.record(txn, entry(1, epoch, BATCH))
        raise RuntimeError("boom")
    assert new_store().entries(P) == [first]
    # The producer is still usable afterwards.
    second = entry(1, epoch, NO_DATA, spark_batch_id=4, checkpoint_id="q1", stateful=True)
    with store.transaction() as txn:
        store.record(txn, second)
    assert new_store().entries(P) == [first, second]


def test_find_by_ranges_and_no_data_batches_by_spark_identity(new_store) -> None:
    store = new_store()
    epoch = store.acquire(P).epoch
    with store.transaction() as txn:
        store.record(txn, entry(0, epoch, BATCH, spark_batch_id=0, checkpoint_id="q1"))
    with store.transaction() as txn:
        store.record(txn, entry(1, epoch, NO_DATA, spark_batch_id=1, checkpoint_id="q1"))

    def find(ranges: BatchRanges, batch_id: int, checkpoint: str | None) -> int | None:
        reader = new_store()
        reader.last(P)  # reads the topic; find() uses what was read
        with reader.transaction() as txn:
            found = reader.find(txn, P, BatchContext(P, epoch, ranges, batch_id, checkpoint))
        return None if found is None else found.seq

    assert find(BATCH, 9, None) == 0  # a data batch: by its ranges alone
    assert find(NO_DATA, 1, "q1") == 1  # a no-data batch: by the query and batch ids
    assert find(NO_DATA, 2, "q1") is None  # the next no-data batch is not this one
    assert find(NO_DATA, 1, "q2") is None  # nor is another query's
    assert find(NO_DATA, 1, None) is None  # no checkpoint id: never found


def test_the_driver_store_reads_through_one_consumer_until_closed(
    new_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read of a batch's commit (owner check, last entry, the wait until the entry is
    readable) goes through one kept consumer; close() ends it and the next read opens
    another. A second store sees every commit of the first."""
    from sparkonce.kafka import consumer as consumer_module

    opened: list[Any] = []
    real_init = consumer_module.KafkaReader.__init__

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(consumer_module.KafkaReader, "__init__", counting_init)
    store = new_store()
    epoch = store.acquire(P).epoch
    # acquire's look at open transactions (read_uncommitted) has its own, closed at once.
    [uncommitted] = [r for r in opened if r.isolation_level == "read_uncommitted"]
    assert uncommitted._closed
    opened.remove(uncommitted)
    for seq in range(3):
        ranges = BatchRanges(
            tuple(OffsetRange("events", p, 100 * seq, 100 * seq + 100) for p in range(2))
        )
        assert store.last(P) == (None if seq == 0 else store.entries(P)[-1])
        with store.transaction() as txn:
            store.check_owner(txn, P, epoch)
            store.record(txn, entry(seq, epoch, ranges))
    assert len(opened) == 1 and not opened[0]._closed
    assert opened[0].consumer.assignment() == []  # nothing fetched between reads
    assert [e.seq for e in new_store().entries(P)] == [0, 1, 2]
    store.close()
    assert opened[0]._closed
    assert store.last(P) is not None and store.last(P).seq == 2
    assert len(opened) == 3  # the reading store's own, and a new one after close()


def _dead_task(store: KafkaLedgerStore, pipeline: str, task: str, epoch: int) -> Any:
    """A task of a run that died before its commit: its output record and its marker sent in
    a Kafka transaction that stays open (timeout 5 min). Returns its producer (a zombie)."""
    from confluent_kafka import Producer

    from sparkonce.ledger.kafka_marker import Marker

    producer = Producer(
        store.conn.transactional_config(transactional_id(pipeline, store.topic, task), 300_000)
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(store.topic, value=f"row of task {task}".encode())
    marker = Marker(pipeline, int(task), task, 0, BATCH, epoch, rows=1)
    producer.produce(
        store.ledger_topic, key=f"m:{pipeline}:{task}", value=marker.encode(), partition=0
    )
    assert producer.flush(30) == 0
    return producer


def test_a_new_owner_aborts_the_open_task_transactions_of_a_dead_run(new_store) -> None:
    """Two tasks of run 1 sent their records and markers, and the run died before they
    committed (transaction timeout 5 min): the ledger's last stable offset stays behind their
    markers. The next run's acquire aborts both through their transactional ids and takes
    epoch 2 within seconds; nothing of the dead tasks becomes visible, and a task that wakes
    up later cannot commit (its producer is fenced)."""
    from confluent_kafka import KafkaException

    from sparkonce.kafka.consumer import KafkaReader

    first = new_store()
    assert first.acquire(P).epoch == 1
    zombies = [_dead_task(first, P, task, 1) for task in ("0", "1")]
    started = time.monotonic()
    second = new_store()
    owner = second.acquire(P)
    took = time.monotonic() - started
    assert owner.epoch == 2 and took < 10, f"acquire took {took:.1f} s"
    assert sorted(second.last_fenced) == [transactional_id(P, second.topic, t) for t in "01"]
    assert new_store().folded(P).pending == []  # no dead marker became visible
    for zombie in zombies:
        with pytest.raises(KafkaException, match=r"(?i)fenc"):
            zombie.commit_transaction(30)
    with KafkaReader(second.conn) as reader:  # read_committed: nothing of the dead tasks
        low, high = reader.watermarks(second.topic, 0)
        assert list(reader.read(second.topic, 0, low, high)) == []
    # A clean start finds nothing to abort.
    third = new_store()
    assert third.acquire(P).epoch == 3 and third.last_fenced == []


def test_an_open_transaction_it_cannot_abort_stops_the_start_naming_it(new_store) -> None:
    """Another pipeline's task left its marker open on a shared ledger topic: a new owner of
    P does not abort it (it is not P's), waits, then stops with a message that says a
    transaction is still open and whose it is, and writes no owner record."""
    first = new_store()
    assert first.acquire(P).epoch == 1
    other = _dead_task(first, "other", "4", 7)
    try:
        second = new_store()
        second.clear_timeout_s = 1.0
        with pytest.raises(KafkaUnavailableError) as info:
            second.acquire(P)
        message = str(info.value)
        assert "a transaction is still open on the ledger topic" in message, message
        assert "task 4 of pipeline 'other'" in message, message
        assert transactional_id("other", second.topic, "4") in message, message
        assert "did not answer" not in message, message
        assert second.last_fenced == []
    finally:
        other.abort_transaction(30)
    third = new_store()
    assert third.owner(P) is not None and third.owner(P).epoch == 1  # no owner record
    assert third.acquire(P).epoch == 2
