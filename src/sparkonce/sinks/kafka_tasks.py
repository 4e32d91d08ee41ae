"""The executor side of :class:`~sparkonce.sinks.kafka.KafkaSink`: step 3 in each Spark task.

Each task of a batch (:func:`write_task`, run through ``mapInArrow``) starts its
transactional producer with ``transactional.id`` ``sparkonce.<pipeline>.<topic>.<task key>``
(``init_transactions`` bumps the producer epoch, which fences and aborts any zombie attempt
of the same task), then reads the ledger topic from the batch's scan offset. The decisions
that follow are the executor-side commit helper's (:mod:`sparkonce.commit.tasks`): a newer
owner fences the task (it writes nothing), and a committed marker of this task for this
batch means its output is written already (a replay: it writes nothing again). Otherwise
it writes its records and its marker (:class:`~sparkonce.ledger.kafka_marker.Marker`) in one
Kafka transaction and commits it. The module docstring of :mod:`sparkonce.sinks.kafka` has
the whole protocol.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sparkonce.commit.tasks import CORRECT_TASK_STEPS, Task, TaskSteps, one_result
from sparkonce.errors import SinkError, SinkUnavailableError
from sparkonce.faults import worker_faults
from sparkonce.kafka.client import KafkaConnection
from sparkonce.ledger.kafka_marker import Marker
from sparkonce.ledger.kafka_topic import TIMEOUT_S, LedgerState, LedgerTopic
from sparkonce.ledger.kafka_topic import transactional_id as _transactional_id
from sparkonce.offsets import BatchRanges


@dataclass(frozen=True)
class TaskPlan:
    """Everything a task needs, pickled to the executors (holds client secrets: never log)."""

    conn: KafkaConnection
    topic: str
    ledger_topic: str
    pipeline: str
    epoch: int
    ranges: dict[str, Any]
    seq: int
    scan_from: int  # ledger offset from which this batch's markers can appear
    spark_batch_id: int
    checkpoint_id: str | None
    transaction_timeout_ms: int
    value_is_binary: bool
    key_column: bool
    partition_column: bool
    # The task key of each Spark partition, when it is not the partition number
    # (sparkonce.spark.kafka_lineage.task_keys).
    task_keys: tuple[str, ...] | None = None
    # The tasks' decisions (sparkonce.commit.tasks); only the simulation's tests plant others.
    steps: TaskSteps = CORRECT_TASK_STEPS

    def task_key(self, pid: int) -> str:
        return self.task_keys[pid] if self.task_keys is not None else str(pid)


# How much of a task's input it reads ahead while its producer starts (Arrow bytes).
PREFETCH_BYTES = 64 << 20


def _start_task(plan: TaskPlan, key: str, on_delivery: Any) -> tuple[Any, LedgerState]:
    """Step 3's start: the task's transactional producer, its epoch bump, then the ledger.

    The order matters and is kept: ``init_transactions`` bumps the producer epoch first, so
    any zombie attempt of this task is fenced from here on and its open transaction aborted;
    only then is the ledger read (take over by writing before reading).
    """
    from confluent_kafka import Producer

    producer = Producer(
        {
            **plan.conn.transactional_config(
                _transactional_id(plan.pipeline, plan.topic, key),
                plan.transaction_timeout_ms,
                partitioner="murmur2_random",
                linger_ms=20,
            ),
            # Reports of failed deliveries only: a Python call per delivered record cost
            # about a third of this task's CPU per record (measured on 400k records). A
            # failed record also fails commit_transaction, whatever is reported.
            "delivery.report.only.error": True,
            "on_delivery": on_delivery,
        }
    )
    producer.init_transactions(TIMEOUT_S)
    ledger = LedgerTopic(plan.conn, plan.ledger_topic)
    records, _ = ledger.read(plan.scan_from)
    return producer, LedgerTopic.fold(LedgerState(), plan.pipeline, records)


def prefetch(
    batches: Iterator[Any], started: Future[Any], limit: int = PREFETCH_BYTES
) -> list[Any]:
    """Read the task's input while its producer starts, up to ``limit`` bytes.

    Starting a transactional producer (``init_transactions``) and reading the ledger take
    0.1 to 0.6 s per task; the Spark rows upstream of this task are computed meanwhile
    instead of waiting for it. Nothing is written before ``started`` is done. The check
    comes between Arrow batches, so a task whose batch turns out committed already (a
    replay) has read at most one batch more than it needed.
    """
    buffered: list[Any] = []
    size = 0
    while not started.done() and size < limit:
        rb = next(batches, None)
        if rb is None:
            break
        buffered.append(rb)
        size += rb.nbytes
    return buffered


def write_task(plan: TaskPlan, batches: Iterator[Any]) -> Iterator[Any]:
    """Write this task's records and marker in one Kafka transaction (step 3)."""
    task = Task.current(plan.pipeline, plan.epoch, plan.seq, key=plan.task_key, steps=plan.steps)
    key = task.key
    errors: list[Any] = []  # confluent-kafka KafkaError objects

    def on_delivery(err: Any, _msg: Any) -> None:
        errors.append(err)

    batches = iter(batches)
    with ThreadPoolExecutor(1, thread_name_prefix=f"sparkonce-task-{task.partition}") as pool:
        started = pool.submit(_start_task, plan, key, on_delivery)
        read_ahead = prefetch(batches, started)
        producer, state = started.result()
    # The owner epoch this task sees: a newer run's owner record read after the batch was
    # planned, or (none read since) the plan's. A fenced task (a zombie's) writes nothing; the
    # driver's owner check raises FencedError. A newer run that took the pipeline after this
    # read fences this producer: its task's init_transactions comes before any batch of its
    # own can commit.
    fenced = task.fenced(plan.epoch if state.owner is None else state.owner.epoch)
    if fenced is not None:
        yield from one_result(fenced)
        return
    batch = BatchRanges.from_json_obj(plan.ranges)
    mine = next(
        (
            m
            for m in state.pending
            if m.task == key and m.is_for(batch, plan.spark_batch_id, plan.checkpoint_id)
        ),
        None,
    )
    written = task.already_written(None if mine is None else mine.rows)
    if written is not None:
        yield from one_result(written)
        return

    producer.begin_transaction()
    rows = 0
    produce, topic = producer.produce, plan.topic
    for rb in itertools.chain(read_ahead, batches):
        cols = rb.to_pydict()
        values = cols["value"]
        n = len(values)
        keys = cols["key"] if plan.key_column else [None] * n
        # -1: librdkafka's "no partition given", so the partitioner picks it.
        parts = (
            [-1 if p is None else int(p) for p in cols["partition"]]
            if plan.partition_column
            else None
        )
        if parts is None:
            for v, k in zip(values, keys, strict=True):
                try:
                    produce(topic, v, k)
                except BufferError:  # the local queue is full: deliver some, then again
                    _produce_when_room(producer, topic, v, k, -1)
        else:
            for v, k, part in zip(values, keys, parts, strict=True):
                try:
                    produce(topic, v, k, part)
                except BufferError:
                    _produce_when_room(producer, topic, v, k, part)
        rows += n
        producer.poll(0)
    marker = Marker(
        pipeline=plan.pipeline,
        partition=task.partition,
        task=key,
        seq=plan.seq,
        ranges=batch,
        epoch=plan.epoch,
        rows=rows,
        attempt=task.attempt,
        spark_batch_id=plan.spark_batch_id,
        checkpoint_id=plan.checkpoint_id,
    )
    producer.produce(
        plan.ledger_topic,
        key=f"m:{plan.pipeline}:{key}",
        value=marker.encode(),
        partition=0,
    )
    producer.flush(TIMEOUT_S)
    if errors:
        raise _delivery_failed(plan, key, producer, errors)
    # Fault injection: a pause here leaves the transaction open (a test kills the driver).
    worker_faults().pause_task("write", f"{plan.pipeline}:{plan.seq}:{key}", task.attempt)
    # Fault injection: the records and marker are sent, the transaction not committed;
    # Spark's retry fences this attempt (init_transactions) and writes them again.
    task.inject_failure(
        rows,
        f"injected task failure before the commit of task {key}",
        before=lambda: producer.abort_transaction(TIMEOUT_S),
    )
    producer.commit_transaction(TIMEOUT_S)
    yield from one_result(task.written(rows))


def _delivery_failed(plan: TaskPlan, key: str, producer: Any, errors: list[Any]) -> SinkError:
    """The error for a task whose records failed: its transaction is aborted first.

    When every cause says the cluster could not be reached (a record that timed out in the
    local queue, a lost connection), it is :class:`SinkUnavailableError`, exit 4, as the same
    outage is on the driver; a record the cluster refused is a :class:`SinkError`.
    """
    from confluent_kafka import KafkaError, KafkaException

    unreachable = {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
    }
    causes = _causes(errors)
    down = bool(causes) and all(_code(e) in unreachable for e in causes)
    try:
        producer.abort_transaction(TIMEOUT_S)
    except KafkaException:
        if not down:
            raise
        # The abort cannot reach the cluster either; the transaction is aborted by the
        # coordinator when it times out, or by the retry's init_transactions.
    if down:
        return SinkUnavailableError(
            f"pipeline {plan.pipeline!r}: task {key} could not reach Kafka at "
            f"{plan.conn.bootstrap} to write {len(errors)} record(s) to topic {plan.topic!r} "
            f"({_cause(errors)}); its transaction was not committed, so read_committed readers "
            "see none of them. Check that the brokers are running and reachable from every "
            "executor, then run again: the batch is replayed"
        )
    return SinkError(
        f"pipeline {plan.pipeline!r}: task {key} could not write {len(errors)} record(s) to "
        f"Kafka topic {plan.topic!r} ({_cause(errors)}); its transaction was aborted and "
        "Spark retries the task"
    )


def _code(err: Any) -> Any:
    return getattr(err, "code", lambda: None)()


def _causes(errors: list[Any]) -> list[Any]:
    """The delivery errors other than purged records. A refused record fails the transaction,
    and librdkafka then purges the records still queued: their reports (``_PURGE_QUEUE``,
    ``_PURGE_INFLIGHT``) can come first and say nothing of the cause."""
    from confluent_kafka import KafkaError

    purged = {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}
    return [e for e in errors if _code(e) not in purged]


def _cause(errors: list[Any]) -> str:
    """The delivery error that says why a task's records failed (see :func:`_causes`)."""
    causes = _causes(errors)
    first = (causes or errors)[0]
    note = "" if causes else "; every report was of a purged record"
    return f"first cause: {first}{note}"


def _produce_when_room(producer: Any, topic: str, value: Any, key: Any, partition: int) -> None:
    while True:
        producer.poll(0.05)
        try:
            producer.produce(topic, value, key, partition)
            return
        except BufferError:
            continue
