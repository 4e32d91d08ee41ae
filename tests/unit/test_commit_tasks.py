"""The executor-side helper of pre-committing sinks (commit/tasks.py), without Spark: the
task result's Arrow round trip, the two decisions and the injected task failure. The
simulation's two-phase and Kafka worlds run the same code against real stores; these pin
it where the fast tests (and mutation testing) see it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import sparkonce.faults as faults_module
from sparkonce.commit.tasks import (
    CORRECT_TASK_STEPS,
    TASK_RESULT_DDL,
    CorrectTaskSteps,
    Task,
    TaskResult,
    one_result,
    result_batch,
    results_of,
)
from sparkonce.faults import FaultPlan, InjectedTaskFailure


class _Frame:
    """What results_of reads: an object with toArrow(), here over real Arrow batches."""

    def __init__(self, batches: list[pa.RecordBatch]) -> None:
        self.batches = batches

    def toArrow(self) -> pa.Table:  # Spark DataFrame method name
        return pa.Table.from_batches(self.batches)


def test_a_task_result_survives_the_arrow_round_trip_in_the_ddls_column_order() -> None:
    results = [
        TaskResult(3, rows=7, attempt=12),
        TaskResult(1, skipped=True, fenced=True),
        TaskResult(0, rows=5, skipped=True),
    ]
    batches = [b for r in results for b in one_result(r)]
    assert results_of(_Frame(batches)) == results
    batch = result_batch(results[0])
    ddl = [(c.split()[0], c.split()[1]) for c in TASK_RESULT_DDL.split(", ")]
    assert [f.name for f in batch.schema] == [name for name, _ in ddl]
    spark_types = {"INT": pa.int32(), "BIGINT": pa.int64(), "BOOLEAN": pa.bool_()}
    assert [f.type for f in batch.schema] == [spark_types[t] for _, t in ddl]


def test_a_result_read_back_from_a_row_takes_each_field_and_a_missing_attempt_is_0() -> None:
    row: dict[str, Any] = {
        "partition": 2,
        "rows": 9,
        "skipped": False,
        "fenced": True,
        "attempt": None,
    }
    assert TaskResult.from_row(row) == TaskResult(2, rows=9, fenced=True, attempt=0)
    row["attempt"] = 4
    assert TaskResult.from_row(row).attempt == 4


def test_outside_spark_the_task_is_partition_0_attempt_0_keyed_by_its_function() -> None:
    task = Task.current("p", 3, 8, key=lambda part: f"key-{part}")
    assert task == Task("p", 3, 8, 0, 0, "key-0", CORRECT_TASK_STEPS)
    assert Task.current("p", 3, 8).key == "0"


def test_a_task_built_with_other_steps_decides_with_them() -> None:
    class NeverFenced(CorrectTaskSteps):  # a planted bug's steps (tests/sim)
        def fenced(self, task: Task, owner_epoch: int | None) -> bool:
            return False

    steps = NeverFenced()
    task = Task.current("p", 3, 8, steps=steps)
    assert task.steps is steps and task.fenced(4) is None


def test_a_task_is_fenced_unless_its_epoch_is_the_owners() -> None:
    task = Task("p", 3, 8, partition=5, attempt=0, key="5")
    assert task.fenced(3) is None
    for owner in (4, 2, None):
        assert task.fenced(owner) == TaskResult(5, skipped=True, fenced=True)


def test_a_task_whose_output_is_found_reports_it_skipped_with_its_rows() -> None:
    task = Task("p", 3, 8, partition=5, attempt=0, key="5")
    assert task.already_written(None) is None
    assert task.already_written(0) == TaskResult(5, rows=0, skipped=True)
    assert task.already_written(11) == TaskResult(5, rows=11, skipped=True)
    assert task.written(11, attempt=42) == TaskResult(5, rows=11, attempt=42)
    assert task.written(11) == TaskResult(5, rows=11)


def _keys(plan: FaultPlan, failing: bool) -> str:
    for n in range(100):
        if plan.fail_task("write", f"p:8:{n}", 0) is failing:
            return str(n)
    raise AssertionError("no such key in 100")


def test_an_injected_write_failure_hits_first_attempts_that_wrote_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = tmp_path / "events.jsonl"
    plan = FaultPlan(fail_tasks=frozenset({"write"}), events=events)
    monkeypatch.setattr(faults_module, "_worker_plan", plan)
    key = _keys(plan, failing=True)
    aborted: list[str] = []
    task = Task("p", 3, 8, partition=0, attempt=0, key=key)
    with pytest.raises(InjectedTaskFailure, match=r"^boom$"):
        task.inject_failure(4, "boom", before=lambda: aborted.append("abort"))
    assert aborted == ["abort"]
    (line,) = [json.loads(x) for x in events.read_text().splitlines()]
    assert line["event"] == "task-failure"
    assert (line["stage"], line["task"], line["attempt"]) == ("write", f"p:8:{key}", 0)
    # No rows, a retry, or a key the plan spares: the task goes on, and nothing is aborted.
    task.inject_failure(0, "boom", before=lambda: aborted.append("abort"))
    Task("p", 3, 8, 0, 1, key).inject_failure(4, "boom", before=lambda: aborted.append("x"))
    Task("p", 3, 8, 0, 0, _keys(plan, failing=False)).inject_failure(4, "boom")
    assert aborted == ["abort"]
    assert len(events.read_text().splitlines()) == 1
