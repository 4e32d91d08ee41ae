"""A Kafka ledger topic with a long history: starts read from the newest snapshot.

The histories here are written the fast way (a plain producer, records in the sink's own
format, as ``benchmarks/history.py`` does), so a topic "written by an older sparkonce" is
one without snapshot records; the stores then read and extend them for real.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from sparkonce import FencedError
from sparkonce.commit import Committer, Staged
from sparkonce.kafka.client import KafkaConnection
from sparkonce.ledger.base import BatchContext
from sparkonce.ledger.kafka_topic import SNAPSHOT_ENTRIES, KafkaLedgerStore
from sparkonce.offsets import BatchRanges, OffsetRange
from tests.commit.test_committer import RecordingStager

P = "hist"
STEP = 10


def ranges(seq: int) -> BatchRanges:
    return BatchRanges(
        tuple(OffsetRange("events", p, seq * STEP, (seq + 1) * STEP) for p in (0, 1))
    )


def write_old_history(bootstrap: str, ledger_topic: str, batches: int, tasks: int = 2) -> None:
    """An owner record (epoch 1) and ``batches`` batches with their task markers, in the
    record format of the sink, with no snapshot: a topic an older sparkonce wrote."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    at = datetime.now(UTC).isoformat()

    def send(key: str, value: dict[str, Any]) -> None:
        producer.produce(ledger_topic, json.dumps(value), key, partition=0)

    send(f"o:{P}", {"type": "owner", "pipeline": P, "epoch": 1, "holder": "old", "at": at})
    for seq in range(batches):
        r = ranges(seq).to_json_obj()
        common = {"pipeline": P, "seq": seq, "ranges": r, "epoch": 1, "spark_batch_id": seq}
        for t in range(tasks):
            send(f"m:{P}:{t}", {"type": "marker", "partition": t, "rows": 5, **common, "at": at})
        send(
            f"b:{P}",
            {"type": "batch", "rows": 10, "checkpoint_id": "q-old", "at": at, **common},
        )
        if seq % 500 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


@pytest.fixture
def ledger(kafka_broker, kafka_topic: Callable[..., str]) -> dict[str, Any]:
    out = kafka_topic("hist", partitions=1)
    return {"bootstrap": kafka_broker.bootstrap, "topic": out, "ledger": f"{out}.sparkonce-ledger"}


def new_store(ledger: dict[str, Any], **kw: Any) -> KafkaLedgerStore:
    store = KafkaLedgerStore(
        KafkaConnection(ledger["bootstrap"], {}), ledger["ledger"], topic=ledger["topic"], **kw
    )
    store.open()
    return store


def commit(store: KafkaLedgerStore, epoch: int, batch: BatchRanges, batch_id: int) -> Any:
    ctx = BatchContext(P, epoch, batch, batch_id, checkpoint_id="q-new")
    return Committer(store, RecordingStager()).commit_with(ctx, lambda seq: Staged(3))


def test_an_old_topic_is_read_whole_once_then_starts_read_from_its_snapshot(ledger) -> None:
    batches = 3_000  # 9,001 records: more than two backward windows
    first = new_store(ledger)  # creates the topic as the sink does
    write_old_history(ledger["bootstrap"], ledger["ledger"], batches)

    # The first start reads everything (there is no snapshot), and writes one.
    owner = first.acquire(P)
    assert owner.epoch == 2
    assert first.last_load[P] >= 3 * batches
    first_last = first.last(P)
    assert first_last is not None and first_last.seq == batches - 1

    # Every later start reads a bounded number of offsets, whatever the history's length:
    # back to the snapshot (windows of 64, 128... offsets), then the few records after it.
    again = new_store(ledger, search_window=64)
    last = again.last(P)
    assert again.last_load[P] <= 64 + 10
    assert last is not None
    assert (last.seq, last.end_offsets) == (batches - 1, ranges(batches - 1).ends())
    again_owner = again.owner(P)
    assert again_owner is not None and again_owner.epoch == 2
    assert len(again.folded(P).entries) <= SNAPSHOT_ENTRIES
    # The whole history is still there for whoever asks for it (status, verify).
    assert [e.seq for e in again.entries(P)] == list(range(batches))


def test_commits_write_snapshots_and_a_start_after_many_batches_stays_bounded(ledger) -> None:
    old = 2_000
    store = new_store(ledger, snapshot_every=20)
    write_old_history(ledger["bootstrap"], ledger["ledger"], old)
    epoch = store.acquire(P).epoch
    at_acquire = store.refresh(P).snapshot_at
    n = old + 25  # three offsets per commit: the batch, a snapshot now and then, the marker
    for seq in range(old, n):
        assert not commit(store, epoch, ranges(seq), seq).skipped
    assert store.refresh(P).snapshot_at > at_acquire  # the commits wrote snapshots

    later = new_store(ledger, search_window=16)
    later_last = later.last(P)
    assert later_last is not None and later_last.seq == n - 1
    # The newest snapshot is at most ~snapshot_every offsets behind the end: the windows
    # (16, 32) and the fold after the snapshot read far fewer than the ~6,000 offsets.
    assert later.last_load[P] <= 16 + 32 + 20 + 10
    assert [e.seq for e in later.entries(P)] == list(range(n))

    # The pipeline goes on from the snapshot's state: a new run fences the old one, the
    # replay of its last batch is skipped, the next batch gets the next seq.
    later = new_store(ledger, search_window=16)
    epoch2 = later.acquire(P).epoch
    with pytest.raises(FencedError):
        commit(store, epoch, ranges(n), n)
    replay = commit(later, epoch2, ranges(n - 1), n - 1)
    assert replay.skipped and replay.seq == n - 1
    result = commit(later, epoch2, ranges(n), n)
    assert (result.skipped, result.seq) == (False, n)


def test_markers_of_a_partly_committed_batch_survive_the_snapshot(ledger) -> None:
    from confluent_kafka import Producer

    store = new_store(ledger)
    write_old_history(ledger["bootstrap"], ledger["ledger"], 5)
    # A task of batch 5 committed its marker, and the driver died before the batch entry.
    marker = {"type": "marker", "pipeline": P, "partition": 0, "seq": 5, "rows": 5}
    producer = Producer({"bootstrap.servers": ledger["bootstrap"]})
    producer.produce(
        ledger["ledger"],
        json.dumps({**marker, "ranges": ranges(5).to_json_obj(), "epoch": 1}),
        f"m:{P}:0",
        partition=0,
    )
    producer.flush(30)
    store.acquire(P)  # writes a snapshot holding the pending marker

    later = new_store(ledger, search_window=4)
    state = later.refresh(P)
    assert state.snapshot_at >= 0 and later.last_load[P] < 3 * 5 + 4  # from the snapshot
    assert [m.seq for m in state.pending] == [5]
    assert state.after_last_entry == store.folded(P).after_last_entry


def test_find_reads_the_whole_history_only_for_a_batch_older_than_the_window(ledger) -> None:
    batches = SNAPSHOT_ENTRIES + 50
    new_store(ledger)
    write_old_history(ledger["bootstrap"], ledger["ledger"], batches)
    new_store(ledger).acquire(P)

    store = new_store(ledger)
    epoch = store.acquire(P).epoch
    state = store.folded(P)
    assert not state.complete and state.entries[0].seq > 0  # a window of the history

    def find(batch: BatchRanges, batch_id: int = 0, checkpoint: str | None = "q-old") -> Any:
        with store.transaction() as txn:
            found = store.find(txn, P, BatchContext(P, epoch, batch, batch_id, checkpoint))
        return None if found is None else found.seq

    assert find(ranges(batches - 2)) == batches - 2  # in the window
    assert store.folded(P).complete is False
    assert find(ranges(3)) == 3  # older than the window: read from offset 0
    assert store.folded(P).complete is True
    # A new no-data batch at the ledger's end: not found, without reading every entry.
    at_end = BatchRanges.at(ranges(batches - 1).ends())
    assert find(at_end, 10**6, "q-new") is None


def test_the_benchmarks_synthesized_ledger_reads_like_one_the_sink_wrote(ledger) -> None:
    """``benchmarks/history.py`` measures start-up on a ledger it writes the fast way, with
    snapshot records made as the sink makes them. A start must read it from the newest
    snapshot (a bounded number of offsets), and see what a read from offset 0 sees."""
    import importlib.util
    from pathlib import Path

    from sparkonce.ledger.kafka_topic import SNAPSHOT_EVERY

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "history.py"
    spec = importlib.util.spec_from_file_location("bench_history", path)
    assert spec is not None and spec.loader is not None
    history = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(history)

    batches = 6_000  # 18,001 records and 9 snapshots
    new_store(ledger)  # creates the topic as the sink does
    history.build_kafka(ledger["bootstrap"], ledger["ledger"], batches, 2, snapshots=True)
    pipeline = history.PIPELINE
    store = new_store(ledger, search_window=512)
    last = store.last(pipeline)
    # The windows back to the newest snapshot (512, 1024, 2048 offsets: it is at most
    # SNAPSHOT_EVERY + 3 behind the end), then the fold of what follows it.
    assert store.last_load[pipeline] <= 512 + 1024 + 2048 + SNAPSHOT_EVERY + 3
    owner = store.owner(pipeline)
    assert last is not None and owner is not None
    assert last.seq == batches - 1 and owner.epoch == 1
    assert last.end_offsets == BatchRanges.from_json_obj(history.batch_ranges(batches - 1)).ends()
    assert not store.folded(pipeline).complete  # loaded from a snapshot, not from offset 0
    assert [e.seq for e in store.entries(pipeline)] == list(range(batches))
    # The same ledger without snapshot records: the first start reads it whole.
    ledger2 = dict(ledger, ledger=ledger["ledger"] + "-old")
    old = new_store(ledger2)
    history.build_kafka(ledger2["bootstrap"], ledger2["ledger"], 100, 2, snapshots=False)
    old_last = old.last(pipeline)
    assert old_last is not None and old_last.seq == 99 and old.last_load[pipeline] >= 301
