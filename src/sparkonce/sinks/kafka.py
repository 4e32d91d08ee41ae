"""Transactional Kafka sink: one Kafka transaction per Spark task, with its ledger marker.

Guarantee: **effectively-once for ``read_committed`` consumers**, when the
pipeline's transform is deterministic (the same input gives the same rows in
the same Spark partitions). Work may run more than once; only one attempt's
records per output partition of a batch ever become visible to
``read_committed`` readers.

How a batch commits: :class:`~sparkonce.commit.Committer` runs the steps of
:mod:`sparkonce.protocol` with the ledger topic as its ledger store
(:class:`~sparkonce.ledger.kafka_topic.KafkaLedgerStore`) and this sink as its
stager. Because Kafka commits per task, step 3 runs in the stager's
``prepare``, before the driver's transaction opens::

    driver   committer  steps 1-2 (early look): the run's epoch is still the owner's (so
                        a fenced run starts no task); a batch the ledger already covers
                        is a replay: nothing runs
    driver   stager     a partly committed batch must be this one
    tasks    stager     step 3, each Spark task, by its task key k (below): init_transactions()
                        with transactional.id "sparkonce.<pipeline>.<topic>.<k>" (bumps the
                        producer epoch, which
                        fences and aborts any zombie attempt of the same task), then reads
                        the ledger topic: if a newer run took the pipeline, it writes
                        nothing (the driver raises FencedError); if its marker for this
                        batch is committed it does nothing; otherwise it writes its
                        records and its marker (pipeline, batch offsets, task key, Spark
                        batch) in ONE transaction and commits it. While the producer
                        starts and the ledger is read (a thread of the task), the task
                        reads its input ahead; it writes nothing before they are done
    driver   committer  step 1: the run's epoch is still the owner's (ledger topic; the
                        driver's transactional producer is fenced by any newer run)
    driver   committer  step 2: a replay is skipped; publish (step 3) has nothing left to do
    driver   committer  step 4: the batch's ledger entry, in the driver's own Kafka transaction
    driver   committer  step 5: commit it (and wait until it is readable); only then does
                        Spark write its commit log

A crash between step 3 and step 5 leaves some tasks' transactions committed.
The replay (same offsets, from Spark's checkpoint) runs every task again; the
tasks that find their marker skip, the others write, and step 4 completes the
batch. The owner epochs and ledger live in the sink's own store: the ledger
topic ``<topic>.sparkonce-ledger`` (one partition, kept forever), created when
missing. A start reads it from the pipeline's newest snapshot on, not from offset 0
(:mod:`sparkonce.ledger.kafka_topic`), so it takes the same time after a year of batches.

**Task keys.** A replay recognises the tasks that already committed by their task key,
which must name the same input in the run that replays a batch as in the run that planned
it. It is the Spark partition number (``"3"``) when that holds: after a shuffle (partition
numbers are hash buckets), and for sparkonce's own sources, which number a batch's input
partitions in sorted order. Spark's Kafka connector (``SparkKafkaSource``) numbers them in
the order of an unordered set, which can differ between the two runs; when a task reads one
of its input ranges without a shuffle between, the driver names the task after that range
instead (``"orders-3"``, or ``"orders-3.1"`` for the second split of partition 3 under
``minPartitions``), found by walking the batch's RDD lineage down to the connector's input
partitions (:func:`task_keys`). A transform that merges the connector's input partitions
without a shuffle (``coalesce``, ``union``) is refused with :class:`SinkError`.

Limits, stated plainly:

* **Batch atomicity is per output partition.** ``read_committed`` readers can
  see some partitions of a batch before the others (until the replay after a
  crash finishes it); they never see a record twice or an aborted one.
* **Determinism.** A replay rewrites only the partitions whose marker is
  missing, so the transform must put the same rows in the same Spark
  partitions on a replay (the same input, code and ``spark.sql.shuffle.partitions``).
  A non-deterministic transform is only effectively-once per partition.
* **Transaction timeout.** A task whose transaction stays open longer than
  ``transaction_timeout_ms`` (a paused executor, say) is aborted by the
  coordinator: nothing of it becomes visible, the task fails, Spark retries it.
  The timeout aborts before the commit decision, so it never loses data that
  was reported committed.
* **``read_uncommitted`` readers** see the records of aborted and zombie
  attempts too: duplicates are possible for them. Only ``read_committed``
  consumers get the guarantee.
* **Lost checkpoint mid-batch.** If the checkpoint is lost while a batch is
  partly committed, the new run stops with a :class:`~sparkonce.errors.LedgerError`
  naming the batch, unless it plans exactly the same batch again. A no-data batch
  (a stateful query's timers, no new input) counts as the same only with the same
  checkpoint and Spark batch id, so restoring the checkpoint is the fix there.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sparkonce.commit import Committer, Staged, Stager
from sparkonce.config import Guarantee, OutputMode, check_pipeline_name
from sparkonce.errors import (
    ConfigError,
    LedgerError,
    SinkError,
    SinkUnavailableError,
    TopicNotFoundError,
)
from sparkonce.faults import FaultPlan, worker_faults
from sparkonce.kafka.client import KafkaConnection
from sparkonce.ledger.base import BatchContext, CommitResult, LedgerEntry, Owner
from sparkonce.ledger.kafka_topic import (
    TIMEOUT_S,
    KafkaLedgerStore,
    LedgerState,
    LedgerTopic,
)
from sparkonce.ledger.kafka_topic import transactional_id as _transactional_id
from sparkonce.offsets import BatchRanges, Coverage, TopicPartition, classify
from sparkonce.sinks.base import Sink

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

LEDGER_SUFFIX = ".sparkonce-ledger"


# --- the task side (runs in Spark's Python workers) -----------------------------------------


@dataclass(frozen=True)
class _TaskPlan:
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
    # The task key of each Spark partition, when it is not the partition number (task_keys).
    task_keys: tuple[str, ...] | None = None

    def task_key(self, pid: int) -> str:
        return self.task_keys[pid] if self.task_keys is not None else str(pid)


def _marker_task(marker: Mapping[str, Any]) -> str:
    """A task marker's task key (markers from before task keys name the partition only)."""
    return str(marker.get("task", marker["partition"]))


# --- task keys (driver side) ------------------------------------------------------------------

KAFKA_INPUT_PARTITION = "org.apache.spark.sql.kafka010.KafkaBatchInputPartition"


def task_keys(df: DataFrame) -> tuple[str, ...] | None:
    """The task key of each Spark partition of ``df``'s action, or None where the partition
    number is one (see the module docstring).

    Walks ``df``'s RDD lineage from the action's RDD along one-to-one dependencies. If it
    reaches the input of Spark's Kafka connector, task ``i`` reads that input's partition
    ``i``, and is keyed by its Kafka range: ``topic-partition``, with ``.k`` added when the
    connector split one Kafka partition into several ranges (``minPartitions``; ``k`` in
    offset order). If it reaches a shuffle or another source first, the numbers are stable.
    A lineage that merges or reorders the connector's partitions without a shuffle has no
    stable key, and is refused with :class:`SinkError`.
    """
    jdf = getattr(df, "_jdf", None)
    if jdf is None:  # no JVM plan: the protocol simulation's frames number tasks as given
        return None
    rdd = jdf.queryExecution().toRdd()
    while True:
        if rdd.getClass().getName().endswith(".DataSourceRDD"):
            return _kafka_range_keys(rdd)
        deps = rdd.dependencies()
        if deps.size() != 1 or not deps.head().getClass().getName().endswith(".OneToOneDependency"):
            break
        rdd = deps.head().rdd()
    # Not one-to-one: the numbers are stable unless the connector's input is reached
    # through narrow dependencies (a shuffle in between renumbers by hash buckets).
    if _reaches_connector_without_shuffle(rdd):
        raise SinkError(
            "KafkaSink cannot recognise this batch's tasks on a replay: its transform merges "
            "or reorders the partitions of Spark's Kafka connector (SparkKafkaSource) without "
            f"a shuffle ({rdd.getClass().getSimpleName()}: coalesce or union, say), and the "
            "connector can number them differently when it replays the batch. Use "
            "repartition(N) instead of coalesce(N), or read with KafkaSource, whose task "
            "numbers are stable. Nothing of this batch was written."
        )
    return None


def _kafka_range_keys(rdd: Any) -> tuple[str, ...] | None:
    # Spark 4.2's classes (pyspark is pinned): a DataSourceRDDPartition holds an
    # Option[InputPartition]; the connector's is a KafkaBatchInputPartition with its
    # KafkaOffsetRange. tests/kafka/test_spark_kafka_source.py checks the keys against the
    # rows each task holds, so a Spark that changes them fails there.
    ranges: list[tuple[str, int, int]] = []
    for part in rdd.partitions():
        found = part.inputPartition()
        ip = found.get() if found.getClass().getName() == "scala.Some" else None
        if ip is None or ip.getClass().getName() != KAFKA_INPUT_PARTITION:
            return None  # another source (sparkonce's own plan their partitions in order)
        r = ip.offsetRange()
        tp = r.topicPartition()
        ranges.append((tp.topic(), int(tp.partition()), int(r.fromOffset())))
    split: dict[tuple[str, int], list[int]] = {}
    for topic, partition, start in ranges:
        split.setdefault((topic, partition), []).append(start)
    keys = []
    for topic, partition, start in ranges:
        starts = sorted(split[(topic, partition)])
        suffix = f".{starts.index(start)}" if len(starts) > 1 else ""
        keys.append(f"{topic}-{partition}{suffix}")
    return tuple(keys)


def _reaches_connector_without_shuffle(rdd: Any) -> bool:
    todo, seen = [rdd], set()
    while todo:
        node = todo.pop()
        if int(node.id()) in seen:
            continue
        seen.add(int(node.id()))
        if node.getClass().getName().endswith(".DataSourceRDD"):
            if _kafka_range_keys(node) is not None:
                return True
            continue
        deps = node.dependencies()
        for i in range(deps.size()):
            dep = deps.apply(i)
            if not dep.getClass().getName().endswith(".ShuffleDependency"):
                todo.append(dep.rdd())
    return False


def _marker_is_for(
    marker: Mapping[str, Any],
    batch: BatchRanges,
    spark_batch_id: int | None,
    checkpoint_id: str | None,
) -> bool:
    """Whether a task marker (read after the last batch entry) commits this batch.

    A batch with offsets is identified by its ranges (a marker whose ranges cover
    them). A no-data batch (empty ranges: the watermark moved or a timeout fired,
    no new input) by its Spark identity, the checkpoint's query id and batch id, so
    one no-data batch's marker never passes for the next one's. A marker of another
    batch (a zombie attempt's, behind the ledger) is not this batch's.
    """
    ranges = BatchRanges.from_json_obj(marker["ranges"])
    if not batch.empty:
        try:
            return classify(batch, ranges.ends()) is Coverage.COMMITTED
        except LedgerError:  # the marker's ranges end before this batch starts
            return False
    return (
        ranges == batch
        and marker.get("spark_batch_id") == spark_batch_id
        and marker.get("checkpoint_id") == checkpoint_id
    )


# How much of a task's input it reads ahead while its producer starts (Arrow bytes).
PREFETCH_BYTES = 64 << 20


def _start_task(plan: _TaskPlan, key: str, on_delivery: Any) -> tuple[Any, LedgerState]:
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


def _prefetch(
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


def _write_task(plan: _TaskPlan, batches: Iterator[Any]) -> Iterator[Any]:
    """Write this task's records and marker in one Kafka transaction (step 3)."""
    import pyarrow as pa
    from pyspark import TaskContext

    ctx = TaskContext.get()
    pid = ctx.partitionId() if ctx is not None else 0
    key = plan.task_key(pid)
    attempt = ctx.attemptNumber() if ctx is not None else 0
    out_schema = pa.schema(
        [
            ("partition", pa.int32()),
            ("rows", pa.int64()),
            ("skipped", pa.bool_()),
            ("fenced", pa.bool_()),
        ]
    )
    errors: list[Any] = []  # confluent-kafka KafkaError objects

    def on_delivery(err: Any, _msg: Any) -> None:
        errors.append(err)

    batches = iter(batches)
    with ThreadPoolExecutor(1, thread_name_prefix=f"sparkonce-task-{pid}") as pool:
        started = pool.submit(_start_task, plan, key, on_delivery)
        read_ahead = _prefetch(batches, started)
        producer, state = started.result()
    if state.owner is not None and state.owner.epoch != plan.epoch:
        # A newer run took the pipeline after this batch was planned (this is a zombie's
        # task): write nothing; the driver's owner check raises FencedError. A newer run
        # that took it after this read fences this producer: its task p's init_transactions
        # comes before any batch of its own can commit.
        yield pa.RecordBatch.from_pylist(
            [{"partition": pid, "rows": 0, "skipped": True, "fenced": True}], out_schema
        )
        return
    batch = BatchRanges.from_json_obj(plan.ranges)
    mine = next(
        (
            m
            for m in state.pending
            if _marker_task(m) == key
            and _marker_is_for(m, batch, plan.spark_batch_id, plan.checkpoint_id)
        ),
        None,
    )
    if mine is not None:
        rows = int(mine["rows"])
        yield pa.RecordBatch.from_pylist(
            [{"partition": pid, "rows": rows, "skipped": True, "fenced": False}], out_schema
        )
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
    marker = {
        "type": "marker",
        "pipeline": plan.pipeline,
        "partition": pid,
        "task": key,
        "seq": plan.seq,
        "ranges": plan.ranges,
        "epoch": plan.epoch,
        "rows": rows,
        "attempt": attempt,
        "spark_batch_id": plan.spark_batch_id,
        "checkpoint_id": plan.checkpoint_id,
        "at": datetime.now(UTC).isoformat(),
    }
    producer.produce(
        plan.ledger_topic,
        key=f"m:{plan.pipeline}:{key}",
        value=json.dumps(marker),
        partition=0,
    )
    producer.flush(TIMEOUT_S)
    if errors:
        raise _delivery_failed(plan, key, producer, errors)
    faults = worker_faults()  # this worker's plan, parsed once
    fault_key = f"{plan.pipeline}:{plan.seq}:{key}"
    if rows and faults.fail_task("write", fault_key, attempt):
        # Fault injection: the records and marker are sent, the transaction not committed;
        # Spark's retry fences this attempt (init_transactions) and writes them again.
        producer.abort_transaction(TIMEOUT_S)
        raise faults.task_failure(
            "write", fault_key, attempt, f"injected task failure before the commit of task {key}"
        )
    producer.commit_transaction(TIMEOUT_S)
    yield pa.RecordBatch.from_pylist(
        [{"partition": pid, "rows": rows, "skipped": False, "fenced": False}], out_schema
    )


def _delivery_failed(plan: _TaskPlan, key: str, producer: Any, errors: list[Any]) -> SinkError:
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


def _describe_batch(ranges: BatchRanges, who: Any) -> str:
    """``batch t[0]:0..5``, or a no-data batch's Spark identity (``who``: marker or context)."""
    if not ranges.empty:
        return f"batch {ranges}"
    if isinstance(who, Mapping):
        batch_id, query = who.get("spark_batch_id"), who.get("checkpoint_id")
    else:
        batch_id, query = who.spark_batch_id, who.checkpoint_id
    return f"no-data batch {batch_id} of checkpoint {query} (at {ranges})"


# --- the sink (driver side) -------------------------------------------------------------------


class KafkaSink(Sink, Stager):
    """Transactional sink into a Kafka topic (see the module docstring for the guarantee).

    The output DataFrame needs a ``value`` column (string or binary) and may have
    a ``key`` column (string or binary) and a ``partition`` column (int); other
    columns are refused. Keys are hashed like Java clients do (murmur2), so a key
    always lands in the same partition. ``client_config`` holds extra librdkafka
    settings (security...); its secrets never appear in reprs or logs.

    The output topic must exist (``sparkonce kafka create BOOTSTRAP TOPIC --partitions N``);
    :meth:`validate` refuses a missing one, and Spark's ``"complete"`` output mode (a topic
    can only be appended to), with :class:`ConfigError` before the run takes its epoch.
    """

    guarantee: ClassVar[Guarantee] = "effectively-once"

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        client_config: Mapping[str, Any] | None = None,
        ledger_topic: str | None = None,
        transaction_timeout_ms: int = 60_000,
    ) -> None:
        self.conn = KafkaConnection(bootstrap_servers, client_config or {})
        if not topic or not isinstance(topic, str):
            raise ConfigError("KafkaSink needs the output topic's name")
        self.topic = topic
        self.ledger_topic = ledger_topic or f"{topic}{LEDGER_SUFFIX}"
        if not isinstance(transaction_timeout_ms, int) or transaction_timeout_ms < 1000:
            raise ConfigError(
                f"transaction_timeout_ms must be an integer >= 1000, got {transaction_timeout_ms!r}"
            )
        self.transaction_timeout_ms = transaction_timeout_ms
        self._store = KafkaLedgerStore(
            self.conn,
            self.ledger_topic,
            topic=topic,
            transaction_timeout_ms=transaction_timeout_ms,
            inspect_hint=self._status_hint("{pipeline}"),
        )
        self._committer: Committer | None = None
        self._opened = False
        self._schema: StructType | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        if self._opened:
            return
        self._check_output_topic()  # ConfigError / KafkaUnavailableError
        self._store.open()
        if self._committer is None:
            self._committer = Committer(self._store, self, faults=self.faults)
        self._opened = True

    def close(self) -> None:
        self._store.close()
        self._opened = False

    def use_faults(self, faults: FaultPlan) -> None:
        super().use_faults(faults)
        if self._committer is not None:
            self._committer.faults = faults

    def describe(self) -> str:
        return f"KafkaSink({self.conn.bootstrap} topic={self.topic})"

    def __repr__(self) -> str:
        return self.describe()

    def _status_hint(self, pipeline: str) -> str:
        return f"sparkonce status --pipeline {pipeline} --sink 'kafka://{self.conn.bootstrap}/{self.topic}'"

    # -- ownership and progress (the ledger store) ------------------------------------------
    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        check_pipeline_name(pipeline)
        self.open()
        owner = self._store.acquire(pipeline, source)
        log.info("pipeline %r took epoch %d in %s", pipeline, owner.epoch, self.describe())
        return owner

    def owner(self, pipeline: str) -> Owner | None:
        self.open()
        return self._store.owner(pipeline)

    def ledger(self, pipeline: str) -> list[LedgerEntry]:
        self.open()
        return self._store.entries(pipeline)

    def pipelines(self) -> list[str]:
        self.open()
        return self._store.pipelines()

    def last_entry(self, pipeline: str) -> LedgerEntry | None:
        """The newest entry, from the pipeline's newest snapshot on (never the whole topic)."""
        self.open()
        return self._store.last(pipeline)

    def end_offsets(self, pipeline: str) -> dict[TopicPartition, int]:
        last = self.last_entry(pipeline)
        return last.end_offsets if last else {}

    def committer_parts(self) -> tuple[KafkaLedgerStore, KafkaSink]:
        """Each Kafka output keeps its own ledger topic, so it commits on its own."""
        self.open()
        return self._store, self

    # -- schema -------------------------------------------------------------------------------
    def validate(self, schema: StructType, output_mode: OutputMode = "append") -> None:
        """Check the output and the topic (driver, once per run, before the epoch is taken).

        Refuses, with :class:`ConfigError`: Spark's ``"complete"`` output mode (a topic
        cannot be replaced, only appended to), a missing output topic, and output
        columns other than ``key``, ``value`` and ``partition`` or of the wrong types.
        """
        from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType

        if output_mode == "complete":
            raise ConfigError(
                f"KafkaSink (topic {self.topic!r}) does not support Spark's output mode "
                "'complete': each batch would have to replace the whole topic, and a Kafka "
                "topic can only be appended to. Use output_mode='update' (each batch writes "
                "the rows that changed) or 'append', or write the complete result to "
                "SQLiteSink or PostgresSink, which replace the table's content each batch."
            )
        self._check_output_topic()
        names = {f.name: f.dataType for f in schema.fields}
        if "value" not in names:
            raise ConfigError(
                f"KafkaSink needs a 'value' column in the pipeline's output (columns: "
                f"{list(names)}); select value (and optionally key, partition)"
            )
        extra = [n for n in names if n not in ("key", "value", "partition")]
        if extra:
            raise ConfigError(
                f"KafkaSink writes only key, value and partition; the output also has {extra}. "
                "Serialize them into value (e.g. F.to_json(F.struct(...)))."
            )
        for name in ("key", "value"):
            if name in names and not isinstance(names[name], (StringType, BinaryType)):
                raise ConfigError(
                    f"KafkaSink column {name!r} must be string or binary, got "
                    f"{names[name].simpleString()}; cast it first"
                )
        if "partition" in names and not isinstance(names["partition"], (IntegerType, LongType)):
            raise ConfigError("KafkaSink column 'partition' must be an integer")
        self._schema = schema

    def _check_output_topic(self) -> int:
        """The output topic's partition count; ConfigError (exit 2) when it does not exist."""
        try:
            return self.conn.partitions(self.topic)
        except TopicNotFoundError as exc:
            raise ConfigError(
                f"KafkaSink: output topic {self.topic!r} does not exist at "
                f"{self.conn.bootstrap}; the sink does not create it (its partition count is "
                f"yours to choose). Create it first: `sparkonce kafka create "
                f"{self.conn.bootstrap} {self.topic} --partitions N`, then run again. Nothing "
                "was written and no epoch was taken."
            ) from exc

    # -- the commit protocol: the committer runs steps 1-5; this sink stages (step 3) ----------
    def commit(self, ctx: BatchContext, df: DataFrame) -> CommitResult:
        """Commit one micro-batch: the committer on the driver, step 3 in the tasks."""
        self.open()
        assert self._committer is not None
        return self._committer.commit(ctx, df)

    def prepare(self, ctx: BatchContext, df: DataFrame, seq: int) -> Staged:
        """Step 3, in Spark tasks: each task commits its records and marker (driver starts them).

        First, on the driver: a partly committed batch must be this one (the committer
        has already checked that the run still owns the pipeline, so a fenced run starts
        no task). Returns the batch's row count; the payload is the tasks' stats.
        """
        from pyspark.sql.types import BinaryType

        state = self._store.folded(ctx.pipeline)
        self._check_pending(ctx, state, state.entries[-1] if state.entries else None)

        schema = df.schema
        plan = _TaskPlan(
            conn=self.conn,
            topic=self.topic,
            ledger_topic=self.ledger_topic,
            pipeline=ctx.pipeline,
            epoch=ctx.epoch,
            ranges=ctx.ranges.to_json_obj(),
            seq=seq,
            scan_from=state.after_last_entry,
            spark_batch_id=ctx.spark_batch_id,
            checkpoint_id=ctx.checkpoint_id,
            transaction_timeout_ms=self.transaction_timeout_ms,
            value_is_binary=isinstance(schema["value"].dataType, BinaryType),
            key_column="key" in schema.names,
            partition_column="partition" in schema.names,
        )
        # The keys go to the tasks with the plan, so they are found on df, before the write
        # is planned; then again on the write's own plan, which the action below runs. Both
        # see the one RDD Spark made of the batch (foreachBatch hands it over as such), so
        # they agree; if they did not, nothing is written.
        keys = task_keys(df)
        plan = dataclasses.replace(plan, task_keys=keys)
        written = df.mapInArrow(
            lambda it: _write_task(plan, it),
            "partition INT, rows BIGINT, skipped BOOLEAN, fenced BOOLEAN",
        )
        if keys is not None and task_keys(written) != keys:
            raise SinkError(
                f"pipeline {ctx.pipeline!r}: Spark planned this batch's Kafka input in two "
                "orders within one run, so KafkaSink cannot name its tasks; nothing was "
                "written, and the batch is replayed by the next run. Read with KafkaSource, "
                "whose task numbers are stable"
            )
        stats = written.toArrow().to_pylist()
        # A task that found a newer owner wrote nothing ("fenced"); the committer's step 1
        # reads that owner record too and raises FencedError.
        return Staged(rows=sum(int(s["rows"]) for s in stats), payload=stats)

    def after_failed_commit(self) -> str:
        return (
            "The ledger is unchanged, but tasks of the batch may already have committed their "
            "Kafka transactions: read_committed readers can see some of its output partitions. "
            "The replay writes only the partitions whose marker is missing, so nothing is "
            "duplicated."
        )

    def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        """Nothing to make visible: the tasks' transactions already did, per output partition.

        Adds the task counts to the batch's ledger record (``txn`` is the driver's
        :class:`~sparkonce.ledger.kafka_topic.KafkaLedgerTxn`).
        """
        stats = staged.payload
        txn.extra.update(tasks=len(stats), tasks_skipped=sum(1 for s in stats if s["skipped"]))

    def _check_pending(
        self, ctx: BatchContext, state: LedgerState, last: LedgerEntry | None
    ) -> None:
        """Refuse a batch that differs from a partly committed one (lost checkpoint).

        The markers written after the last batch entry belong to a batch whose tasks
        committed and whose entry did not land, unless they lie behind the ledger's end
        (a fenced attempt's, written too late; nothing can complete that batch). A
        no-data batch's markers sit at the ledger's end and name their Spark batch; those
        of its tasks that wrote no record do not count.
        """
        after = last.end_offsets if last else {}
        for marker in state.pending:
            ranges = BatchRanges.from_json_obj(marker["ranges"])
            if ranges.empty:
                mine = _marker_is_for(marker, ctx.ranges, ctx.spark_batch_id, ctx.checkpoint_id)
                if (ctx.ranges.empty and mine) or int(marker.get("rows", 0)) == 0:
                    # This batch's own, from an earlier attempt; or another no-data batch's
                    # task that wrote no record (an empty no-data batch gets no entry).
                    continue
                behind = any(o < after.get(tp, 0) for tp, o in ranges.ends().items())
            else:
                if ranges == ctx.ranges:
                    continue
                try:
                    behind = classify(ranges, after) is Coverage.COMMITTED
                except LedgerError:
                    behind = False
            if behind:
                continue
            raise LedgerError(
                f"pipeline {ctx.pipeline!r}: {_describe_batch(ranges, marker)} is partly "
                f"committed in {self.describe()} (task {_marker_task(marker)} committed, the "
                f"batch's ledger entry is missing), but this run planned "
                f"{_describe_batch(ctx.ranges, ctx)} instead. This happens when the checkpoint "
                "was lost mid-batch. Operator action: restore the checkpoint directory, or "
                "re-run with the same read limits so the same batch is planned."
            )

    def _output_dropped(self) -> None:
        """Both topics were emptied (an inspector's reset): forget what was read of them."""
        self._store.forget()


def kafka_sink_from_uri(uri: str, **kwargs: Any) -> KafkaSink:
    """``kafka://host:port[,host:port]/topic`` → :class:`KafkaSink`."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    topic = parts.path.lstrip("/")
    if parts.scheme != "kafka" or not parts.netloc or not topic:
        raise ConfigError(
            f"{uri!r} is not a Kafka sink URI: use kafka://HOST:PORT[,HOST:PORT]/TOPIC"
        )
    return KafkaSink(parts.netloc, topic, **kwargs)
