"""The Kafka sink's task marker codec, and the task-side decisions of pre-committing sinks."""

from __future__ import annotations

import json

import pytest

from sparkonce.commit.tasks import CORRECT_TASK_STEPS, Task, TaskResult
from sparkonce.errors import LedgerError
from sparkonce.ledger.kafka_marker import MARKER_VERSION, Marker
from sparkonce.ledger.kafka_topic import LedgerState, LedgerTopic
from sparkonce.offsets import BatchRanges, OffsetRange

RANGES = BatchRanges((OffsetRange("orders", 0, 0, 5), OffsetRange("orders", 1, 3, 7)))

# A marker as the sink wrote it before markers had a version (json.dumps of its dict).
UNVERSIONED = (
    b'{"type": "marker", "pipeline": "p", "partition": 1, "task": "orders-1", "seq": 4, '
    b'"ranges": {"orders": {"0": [0, 5], "1": [3, 7]}}, "epoch": 2, "rows": 4, "attempt": 1, '
    b'"spark_batch_id": 7, "checkpoint_id": "q-1", "at": "2026-11-28T09:00:00+00:00"}'
)
# Older still: before task keys (the partition number was the key) and attempts.
BEFORE_TASK_KEYS = (
    b'{"type": "marker", "partition": 0, "rows": 5, "pipeline": "p", "seq": 3, '
    b'"ranges": {"t": {"0": [10, 15]}}, "epoch": 1, "spark_batch_id": 3, '
    b'"at": "2026-11-01T00:00:00+00:00"}'
)


def test_a_marker_written_before_the_version_field_still_decodes() -> None:
    m = Marker.decode(UNVERSIONED)
    assert m == Marker(
        "p", 1, "orders-1", 4, RANGES, 2, 4, 1, 7, "q-1", "2026-11-28T09:00:00+00:00"
    )


def test_a_marker_written_before_task_keys_is_keyed_by_its_partition() -> None:
    m = Marker.decode(BEFORE_TASK_KEYS)
    assert (m.task, m.partition, m.rows, m.attempt, m.checkpoint_id) == ("0", 0, 5, 0, None)
    assert m.ranges == BatchRanges((OffsetRange("t", 0, 10, 15),))


def test_a_marker_round_trips_with_its_version() -> None:
    m = Marker("p", 1, "orders-1", 4, RANGES, 2, 4, 1, 7, "q-1", "2026-11-28T09:00:00+00:00")
    record = json.loads(m.encode())
    assert record["v"] == MARKER_VERSION and record["type"] == "marker"
    assert Marker.decode(m.encode()) == m
    # Every field the unversioned record had is still written, under the same name.
    assert set(json.loads(UNVERSIONED)) | {"v"} == set(record)


def test_a_marker_of_a_newer_version_is_refused_by_name() -> None:
    record = {**json.loads(UNVERSIONED), "v": MARKER_VERSION + 1}
    with pytest.raises(LedgerError, match=r"record version 2, newer than this sparkonce reads"):
        Marker.from_record(record)
    with pytest.raises(LedgerError, match="cannot be read"):
        Marker.from_record({"type": "marker", "pipeline": "p"})


def test_the_ledger_fold_and_snapshot_decode_markers_through_the_codec() -> None:
    records = [json.loads(UNVERSIONED), json.loads(BEFORE_TASK_KEYS)]
    state = LedgerTopic.fold(LedgerState(), "p", records)
    assert [m.task for m in state.pending] == ["orders-1", "0"]
    snap = LedgerTopic.snapshot("p", state)
    assert snap is not None
    again = LedgerTopic.from_snapshot("p", json.loads(json.dumps(snap)), 0)
    assert again.pending == state.pending


def test_a_marker_is_for_its_batch_only() -> None:
    m = Marker.decode(UNVERSIONED)
    assert m.is_for(RANGES, 7, "q-1")
    assert not m.is_for(BatchRanges((OffsetRange("orders", 0, 5, 9),)), 7, "q-1")
    empty = Marker("p", 0, "0", 1, BatchRanges(()), 1, 0, 0, 8, "q-1")
    assert empty.is_for(BatchRanges(()), 8, "q-1")
    assert not empty.is_for(BatchRanges(()), 9, "q-1")


def test_a_task_is_fenced_unless_its_epoch_owns_the_pipeline() -> None:
    task = Task("p", 3, 0, 2, 0, "2", CORRECT_TASK_STEPS)
    assert task.fenced(3) is None
    assert task.fenced(4) == TaskResult(2, skipped=True, fenced=True)
    assert task.fenced(None) == TaskResult(2, skipped=True, fenced=True)  # no owner row


def test_a_task_whose_output_is_committed_writes_nothing_again() -> None:
    task = Task("p", 3, 0, 2, 0, "2")
    assert task.already_written(None) is None
    assert task.already_written(5) == TaskResult(2, rows=5, skipped=True)
    written = task.written(7, attempt=99)
    assert TaskResult.from_row(written.to_row()) == written
