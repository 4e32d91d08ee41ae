"""The executor side of sinks whose Spark tasks pre-commit: one helper for every such sink.

:class:`~sparkonce.sinks.twophase.PostgresTwoPhaseSink` and
:class:`~sparkonce.sinks.kafka.KafkaSink` run part of step 3 in Spark's Python workers:
each task writes its rows in a transaction of its own before the driver's commit. What
every such task decides is written here once:

* **fenced?** the run's epoch is no longer the pipeline owner's: the task writes nothing
  and says so (the driver's step 1 then raises ``FencedError``);
* **already written?** the task's output for this batch is committed already (a Kafka
  replay finds its marker): the task writes nothing again;
* **task-level faults:** the verifier's injected task failures (``SPARKONCE_FAULTS``),
  at the one point a sink names;
* **the task's result:** one :class:`TaskResult` per task, read back on the driver.

The two decisions go through a :class:`TaskSteps`, the tasks' counterpart of the
committer's :class:`~sparkonce.commit.CommitSteps` (whose ``tasks`` it is):
:data:`CORRECT_TASK_STEPS` is the protocol and what every sink uses. A stager whose tasks
pre-commit puts its ``task_steps`` into each task's plan; the protocol simulation's tests
plant a bug by passing another implementation (a task that skips its marker check, say),
never by overriding a sink's functions. The steps travel to the executors inside the
task's plan, so they must pickle (the correct ones hold no state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from sparkonce.faults import worker_faults

# The Spark schema of a task's result (mapInArrow's output); TaskResult's fields, in order.
TASK_RESULT_DDL = "partition INT, rows BIGINT, skipped BOOLEAN, fenced BOOLEAN, attempt BIGINT"


@dataclass(frozen=True)
class TaskResult:
    """What one Spark task of a pre-committing sink reports to the driver.

    ``partition``: the Spark partition. ``rows``: the rows of the batch this task's output
    holds (written now, or found written by an earlier attempt). ``skipped``: the task wrote
    nothing because its output was committed already (a replay). ``fenced``: the task wrote
    nothing because a newer run owns the pipeline. ``attempt``: the sink's id of the
    pre-commit this task made, when it has one (two-phase; 0: none).
    """

    partition: int
    rows: int = 0
    skipped: bool = False
    fenced: bool = False
    attempt: int = 0

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TaskResult:
        """A result read back on the driver (an Arrow row or a Spark ``Row.asDict()``)."""
        return cls(
            partition=int(row["partition"]),
            rows=int(row["rows"]),
            skipped=bool(row["skipped"]),
            fenced=bool(row["fenced"]),
            attempt=int(row["attempt"] or 0),
        )


def results_of(frame: Any) -> list[TaskResult]:
    """Run the tasks (``frame``: the sink's ``mapInArrow`` over the batch, with
    :data:`TASK_RESULT_DDL`) and read back one :class:`TaskResult` per task."""
    return [TaskResult.from_row(r) for r in frame.toArrow().to_pylist()]


def result_batch(result: TaskResult) -> Any:
    """The Arrow batch a task yields for ``result``."""
    import pyarrow as pa

    schema = pa.schema(
        [
            ("partition", pa.int32()),
            ("rows", pa.int64()),
            ("skipped", pa.bool_()),
            ("fenced", pa.bool_()),
            ("attempt", pa.int64()),
        ]
    )
    return pa.RecordBatch.from_pylist([result.to_row()], schema=schema)


class TaskSteps(Protocol):
    """What a pre-committing task calls at its two decisions (the seam for planted bugs)."""

    def fenced(self, task: Task, owner_epoch: int | None) -> bool:
        """Whether ``task``'s run is fenced, given the owner epoch the task read (None: no
        owner found)."""
        ...

    def already_written(self, task: Task, found: TaskResult | None) -> TaskResult | None:
        """What to report instead of writing, when ``found`` (this task's output for the
        batch, found committed; None: none) shows it was written already; None: write."""
        ...


class CorrectTaskSteps:
    """The tasks' decisions as the protocol states them (DESIGN.md section 6, step 3)."""

    def fenced(self, task: Task, owner_epoch: int | None) -> bool:
        return owner_epoch != task.epoch

    def already_written(self, task: Task, found: TaskResult | None) -> TaskResult | None:
        return found


CORRECT_TASK_STEPS = CorrectTaskSteps()


@dataclass(frozen=True)
class Task:
    """One running task of a pre-committing sink: who it is, and its decisions.

    Build it with :meth:`current` inside the task. ``key`` names the task's input in the
    batch (the Spark partition number, or a Kafka task key); faults are keyed by it.
    """

    pipeline: str
    epoch: int
    seq: int
    partition: int
    attempt: int  # Spark's attempt number of this task
    key: str
    steps: TaskSteps = CORRECT_TASK_STEPS

    @classmethod
    def current(
        cls,
        pipeline: str,
        epoch: int,
        seq: int,
        *,
        key: Callable[[int], str] = str,
        steps: TaskSteps = CORRECT_TASK_STEPS,
    ) -> Task:
        """The task running in this Python worker (partition 0, attempt 0 outside Spark)."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        return cls(pipeline, epoch, seq, partition, attempt, key(partition), steps)

    # -- the two decisions --------------------------------------------------------------
    def fenced(self, owner_epoch: int | None) -> TaskResult | None:
        """The fenced result when a newer run (or none) owns the pipeline; None: go on."""
        if self.steps.fenced(self, owner_epoch):
            return TaskResult(self.partition, skipped=True, fenced=True)
        return None

    def already_written(self, found_rows: int | None) -> TaskResult | None:
        """The skipped result when this task's output is committed already (``found_rows``:
        its row count; None: not found); None: write it."""
        found = (
            None
            if found_rows is None
            else TaskResult(self.partition, rows=found_rows, skipped=True)
        )
        return self.steps.already_written(self, found)

    def written(self, rows: int, attempt: int = 0) -> TaskResult:
        return TaskResult(self.partition, rows=rows, attempt=attempt)

    # -- faults ---------------------------------------------------------------------------
    def inject_failure(
        self, rows: int, message: str, before: Callable[[], None] | None = None
    ) -> None:
        """The verifier's task failure, where the sink calls it, for a task that wrote rows.

        ``message`` is the error's; ``before`` runs first when the task fails (to abort the
        task's open transaction). Only first attempts fail (:meth:`FaultPlan.fail_task`).
        """
        faults = worker_faults()  # this worker's plan, parsed once
        fault_key = f"{self.pipeline}:{self.seq}:{self.key}"
        if rows and faults.fail_task("write", fault_key, self.attempt):
            if before is not None:
                before()
            raise faults.task_failure(
                "write",
                fault_key,
                self.attempt,
                message,
            )


def one_result(result: TaskResult) -> Iterator[Any]:
    """A task's whole output: its one result."""
    yield result_batch(result)
