"""The stand-in for Spark's executors that the two-phase and Kafka sinks' ``prepare`` runs on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from sparkonce.verify.sim import TaskFrame

SCHEMA = pa.schema([("x", pa.int64())])


def _task(log: list[tuple[int, int, int]]) -> Any:
    """A task function: reads its input, reports (partition, attempt, rows) via TaskContext."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None  # inside a task
        rows = sum(b.num_rows for b in batches)
        log.append((ctx.partitionId(), ctx.attemptNumber(), rows))
        yield pa.RecordBatch.from_pylist([{"partition": ctx.partitionId(), "rows": rows}])

    return run


def _batch(n: int) -> Any:
    return pa.RecordBatch.from_pylist([{"x": i} for i in range(n)], schema=SCHEMA)


def test_each_task_runs_once_with_its_partition_id() -> None:
    log: list[tuple[int, int, int]] = []
    frame = TaskFrame(None, [_batch(2), None, _batch(3)])
    out = frame.mapInArrow(_task(log), "partition INT, rows BIGINT").collect()
    assert log == [(0, 0, 2), (1, 0, 0), (2, 0, 3)]
    assert out == [
        {"partition": 0, "rows": 2},
        {"partition": 1, "rows": 0},
        {"partition": 2, "rows": 3},
    ]
    assert frame.failed == []


def test_failed_first_attempts_are_retried() -> None:
    """Even partitions fail while reading their input; odd ones after their work is done."""
    log: list[tuple[int, int, int]] = []
    frame = TaskFrame(None, [_batch(2), _batch(3)], fail=True)
    out = frame.mapInArrow(_task(log), "partition INT, rows BIGINT").toArrow().to_pylist()
    # Partition 0's first attempt never finished reading (no log line); partition 1's did.
    assert log == [(0, 1, 2), (1, 0, 3), (1, 1, 3)]
    assert out == [{"partition": 0, "rows": 2}, {"partition": 1, "rows": 3}]
    assert frame.failed == [{"partition": 1, "rows": 3}]


def test_outside_a_task_the_real_task_context_answers() -> None:
    from pyspark import TaskContext

    TaskFrame(None, [])  # installs the stand-in
    assert TaskContext.get() is None
