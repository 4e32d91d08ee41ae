"""Transactional Kafka sink: one Kafka transaction per Spark task, with its ledger marker.

Guarantee: **effectively-once for ``read_committed`` consumers**, when the
pipeline's transform is deterministic (the same input gives the same rows in
the same Spark partitions). Work may run more than once; only one attempt's
records per output partition of a batch ever become visible to
``read_committed`` readers.

How a batch commits (the steps of :mod:`sparkonce.protocol`, adapted to a store
that commits per task)::

    driver   step 1   the run's epoch is still the owner's (ledger topic; the driver's
                      transactional producer is fenced by any newer run)
    driver   step 2   a batch the ledger already covers is a replay: nothing runs
    tasks    step 3   each Spark task p: init_transactions() with transactional.id
                      "sparkonce.<pipeline>.<topic>.<p>" (bumps the producer epoch, which
                      fences and aborts any zombie attempt of the same task), then reads
                      the ledger topic: if its marker for this batch is committed it does
                      nothing; otherwise it writes its records and its marker (pipeline,
                      batch offsets, partition) in ONE transaction and commits it
    driver   step 4   the batch's ledger entry, in the driver's own transaction
    driver   step 5   commit; only then does Spark write its commit log

A crash between step 3 and step 5 leaves some tasks' transactions committed.
The replay (same offsets, from Spark's checkpoint) runs every task again; the
tasks that find their marker skip, the others write, and step 4 completes the
batch. The owner epochs and ledger live in the sink's own store: the ledger
topic ``<topic>.sparkonce-ledger`` (one partition, kept forever), created when
missing.

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
  naming the batch, unless it plans exactly the same batch again.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sparkonce.config import Guarantee, OutputMode, check_pipeline_name
from sparkonce.errors import ConfigError, FencedError, LedgerError, SinkError, TopicNotFoundError
from sparkonce.kafka.client import KafkaConnection, KafkaUnavailableError
from sparkonce.ledger.base import BatchContext, CommitResult, LedgerEntry, Owner
from sparkonce.offsets import BatchRanges, Coverage, TopicPartition, classify
from sparkonce.protocol import CrashPoint, crash_point
from sparkonce.sinks.base import Sink

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

LEDGER_SUFFIX = ".sparkonce-ledger"
TIMEOUT_S = 30.0
_FENCED_CODES = ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "_FENCED")


# --- the ledger topic -----------------------------------------------------------------------


@dataclass
class LedgerState:
    """What the ledger topic says about one pipeline, folded from its records."""

    owner: Owner | None = None
    entries: list[LedgerEntry] = field(default_factory=list)
    markers: dict[int, dict[str, Any]] = field(default_factory=dict)  # partition -> last marker
    after_last_entry: int = 0  # ledger offset just after the last batch entry


class LedgerTopic:
    """Reads and folds the ledger topic (``read_committed``) from an offset onwards."""

    def __init__(self, conn: KafkaConnection, topic: str) -> None:
        self.conn = conn
        self.topic = topic

    def read(self, start: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Committed ledger records from ``start`` to the last stable offset, and that offset."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            self.conn.client_config(
                group_id="sparkonce-ledger-reader",
                enable_auto_commit=False,
                isolation_level="read_committed",
                enable_partition_eof=True,
            )
        )
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(self.topic, 0), timeout=TIMEOUT_S, cached=False
            )
            pos = max(start, low)
            records: list[dict[str, Any]] = []
            if pos >= high:
                return records, max(pos, high)
            consumer.assign([TopicPartition(self.topic, 0, pos)])
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                msgs = consumer.consume(num_messages=1000, timeout=1.0)
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() == -191:  # _PARTITION_EOF
                            continue
                        raise SinkError(f"reading ledger topic {self.topic!r}: {err}")
                    offset = m.offset() or 0
                    if offset < high:
                        record = json.loads(m.value() or b"{}")
                        record["_offset"] = offset
                        records.append(record)
                now = consumer.position([TopicPartition(self.topic, 0)])[0].offset
                if now >= high:
                    return records, high
                if time.monotonic() > deadline:
                    raise self.conn.unavailable(
                        f"reading ledger topic {self.topic!r} up to offset {high}"
                    )
        except KafkaUnavailableError:
            raise
        except Exception as exc:
            from confluent_kafka import KafkaException

            if isinstance(exc, KafkaException):
                raise self.conn.unavailable(f"reading ledger topic {self.topic!r}", exc) from None
            raise
        finally:
            consumer.close()

    @staticmethod
    def fold(state: LedgerState, pipeline: str, records: list[dict[str, Any]]) -> LedgerState:
        for r in records:
            if r.get("pipeline") != pipeline:
                continue
            kind = r.get("type")
            if kind == "owner":
                state.owner = Owner(
                    pipeline,
                    int(r["epoch"]),
                    datetime.fromisoformat(r["at"]),
                    r.get("holder", ""),
                    r.get("source"),
                )
            elif kind == "batch":
                state.entries.append(
                    LedgerEntry(
                        pipeline,
                        int(r["seq"]),
                        BatchRanges.from_json_obj(r["ranges"]),
                        int(r["epoch"]),
                        int(r["rows"]),
                        datetime.fromisoformat(r["at"]),
                        r.get("spark_batch_id"),
                        r.get("checkpoint_id"),
                        r.get("stateful"),
                    )
                )
                state.after_last_entry = int(r.get("_offset", -1)) + 1
            elif kind == "marker":
                state.markers[int(r["partition"])] = r
        return state


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


def _transactional_id(pipeline: str, topic: str, partition: int | str) -> str:
    return f"sparkonce.{pipeline}.{topic}.{partition}"


def _is_fenced(exc: BaseException) -> bool:
    err = exc.args[0] if exc.args else None
    name = getattr(err, "name", lambda: "")()
    return any(code in str(name) for code in _FENCED_CODES) or "fenced" in str(exc).lower()


def _marker_is_for(marker: Mapping[str, Any], plan: _TaskPlan) -> bool:
    """Whether this task's marker (read after the last batch entry) commits ``plan``'s batch.

    A batch with offsets is identified by its ranges. A no-data batch (empty ranges:
    the watermark moved or a timeout fired, no new input) by its Spark identity,
    the checkpoint's query id and batch id, so one no-data batch's marker never
    passes for the next one's.
    """
    ranges = BatchRanges.from_json_obj(marker["ranges"])
    batch = BatchRanges.from_json_obj(plan.ranges)
    if not batch.empty:
        return classify(batch, ranges.ends()) is Coverage.COMMITTED
    return (
        ranges == batch
        and marker.get("spark_batch_id") == plan.spark_batch_id
        and marker.get("checkpoint_id") == plan.checkpoint_id
    )


def _write_task(plan: _TaskPlan, batches: Iterator[Any]) -> Iterator[Any]:
    """Write this task's records and marker in one Kafka transaction (step 3)."""
    import pyarrow as pa
    from confluent_kafka import Producer
    from pyspark import TaskContext

    ctx = TaskContext.get()
    pid = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    out_schema = pa.schema(
        [("partition", pa.int32()), ("rows", pa.int64()), ("skipped", pa.bool_())]
    )
    producer = Producer(
        plan.conn.client_config(
            transactional_id=_transactional_id(plan.pipeline, plan.topic, pid),
            transaction_timeout_ms=plan.transaction_timeout_ms,
            enable_idempotence=True,
            acks="all",
            partitioner="murmur2_random",
            linger_ms=20,
        )
    )
    # Bump the producer epoch first: any zombie attempt of this task is fenced from here on,
    # and its open transaction aborted (take over by writing before reading).
    producer.init_transactions(TIMEOUT_S)
    ledger = LedgerTopic(plan.conn, plan.ledger_topic)
    records, _ = ledger.read(plan.scan_from)
    state = LedgerTopic.fold(LedgerState(), plan.pipeline, records)
    mine = state.markers.get(pid)
    if mine is not None and _marker_is_for(mine, plan):
        rows = int(mine["rows"])
        yield pa.RecordBatch.from_pylist(
            [{"partition": pid, "rows": rows, "skipped": True}], out_schema
        )
        return

    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    producer.begin_transaction()
    rows = 0
    for rb in batches:
        cols = rb.to_pydict()
        values = cols["value"]
        keys = cols.get("key") if plan.key_column else None
        parts = cols.get("partition") if plan.partition_column else None
        for i, v in enumerate(values):
            kwargs: dict[str, Any] = {"value": v, "on_delivery": on_delivery}
            if keys is not None and keys[i] is not None:
                kwargs["key"] = keys[i]
            if parts is not None and parts[i] is not None:
                kwargs["partition"] = int(parts[i])
            while True:
                try:
                    producer.produce(plan.topic, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)
            rows += 1
        producer.poll(0)
    marker = {
        "type": "marker",
        "pipeline": plan.pipeline,
        "partition": pid,
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
        key=f"m:{plan.pipeline}:{pid}",
        value=json.dumps(marker),
        partition=0,
        on_delivery=on_delivery,
    )
    producer.flush(TIMEOUT_S)
    if errors:
        producer.abort_transaction(TIMEOUT_S)
        raise SinkError(
            f"pipeline {plan.pipeline!r}: task {pid} could not write {len(errors)} record(s) to "
            f"Kafka topic {plan.topic!r} (first: {errors[0]}); its transaction was aborted and "
            "Spark retries the task"
        )
    producer.commit_transaction(TIMEOUT_S)
    yield pa.RecordBatch.from_pylist(
        [{"partition": pid, "rows": rows, "skipped": False}], out_schema
    )


def _find_no_data_batch(entries: list[LedgerEntry], ctx: BatchContext) -> int | None:
    """The seq of the committed no-data batch with ``ctx``'s Spark identity, if any."""
    if ctx.checkpoint_id is None:
        return None
    for e in reversed(entries):
        if (
            e.ranges.empty
            and e.checkpoint_id == ctx.checkpoint_id
            and e.spark_batch_id == ctx.spark_batch_id
        ):
            return e.seq
    return None


# --- the sink (driver side) -------------------------------------------------------------------


class KafkaSink(Sink):
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
        self._ledger = LedgerTopic(self.conn, self.ledger_topic)
        self._states: dict[str, LedgerState] = {}
        self._position = 0  # ledger offset read so far
        self._records: list[dict[str, Any]] = []
        self._driver: Any = None  # transactional producer of the current run
        self._driver_pipeline: str | None = None
        self._epoch: int | None = None
        self._opened = False
        self._schema: StructType | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        if self._opened:
            return
        self._check_output_topic()  # ConfigError / KafkaUnavailableError
        self.conn.ensure_topic(self.ledger_topic, 1, config={"retention.ms": "-1"})
        self._opened = True

    def close(self) -> None:
        if self._driver is not None:
            self._driver.flush(5)
            self._driver = None
        self._opened = False

    def describe(self) -> str:
        return f"KafkaSink({self.conn.bootstrap} topic={self.topic})"

    def __repr__(self) -> str:
        return self.describe()

    def relocated(self, url: str | Any) -> KafkaSink:
        """The same sink on another cluster or topic: ``kafka://HOST:PORT[,...]/TOPIC``."""
        return kafka_sink_from_uri(
            str(url),
            client_config=self.conn.config,
            transaction_timeout_ms=self.transaction_timeout_ms,
        )

    def fresh(self) -> KafkaSink:
        return KafkaSink(
            self.conn.bootstrap,
            self.topic,
            client_config=self.conn.config,
            ledger_topic=self.ledger_topic,
            transaction_timeout_ms=self.transaction_timeout_ms,
        )

    def _status_hint(self, pipeline: str) -> str:
        return f"sparkonce status --pipeline {pipeline} --sink 'kafka://{self.conn.bootstrap}/{self.topic}'"

    # -- the ledger, folded ---------------------------------------------------------------
    def _refresh(self, pipeline: str) -> LedgerState:
        """Fold the ledger records written since the last read into every pipeline's state."""
        if not self._opened:
            self.open()
        new, self._position = self._ledger.read(self._position)
        self._records.extend(new)
        if pipeline not in self._states:
            self._states[pipeline] = LedgerTopic.fold(LedgerState(), pipeline, self._records)
        else:
            LedgerTopic.fold(self._states[pipeline], pipeline, new)
        for other, st in self._states.items():
            if other != pipeline:
                LedgerTopic.fold(st, other, new)
        return self._states[pipeline]

    def _driver_producer(self, pipeline: str) -> Any:
        from confluent_kafka import Producer

        if self._driver is None or self._driver_pipeline != pipeline:
            self._driver = Producer(
                self.conn.client_config(
                    transactional_id=_transactional_id(pipeline, self.topic, "driver"),
                    transaction_timeout_ms=self.transaction_timeout_ms,
                    enable_idempotence=True,
                    acks="all",
                )
            )
            self._driver_pipeline = pipeline
            try:
                # Fences every older run's driver producer, and aborts its open transaction.
                self._driver.init_transactions(TIMEOUT_S)
            except Exception as exc:
                self._driver = None
                raise self.conn.unavailable(
                    "initializing the sink's transactional producer", exc
                ) from None
        return self._driver

    def _append_ledger(self, pipeline: str, record: dict[str, Any], *, crash: bool = False) -> None:
        producer = self._driver_producer(pipeline)
        written: list[int] = []
        try:
            producer.begin_transaction()
            producer.produce(
                self.ledger_topic,
                key=f"{record['type'][0]}:{pipeline}",
                value=json.dumps(record),
                partition=0,
                on_delivery=lambda err, msg: written.append(-1 if err else msg.offset()),
            )
            producer.flush(TIMEOUT_S)
            if crash:
                crash_point(CrashPoint.BEFORE_LEDGER_COMMIT)
            producer.commit_transaction(TIMEOUT_S)
        except Exception as exc:
            if _is_fenced(exc):
                self._driver = None
                owner = self._refresh(pipeline).owner
                raise FencedError(
                    pipeline,
                    self._epoch or 0,
                    owner.epoch if owner else 0,
                    self._status_hint(pipeline),
                    owner.holder if owner else "",
                ) from None
            with_abort = getattr(producer, "abort_transaction", None)
            if with_abort is not None:
                try:
                    with_abort(5)
                except Exception:
                    self._driver = None
            raise self.conn.unavailable(
                f"writing to ledger topic {self.ledger_topic!r}", exc
            ) from None
        self._await_visible(written[0] if written else -1)

    def _await_visible(self, offset: int) -> None:
        """Wait until read_committed readers see the ledger up to ``offset``.

        The last stable offset moves only once the coordinator has written the
        transaction markers, a moment after ``commit_transaction`` returns.
        """
        deadline = time.monotonic() + TIMEOUT_S
        while offset >= 0 and time.monotonic() < deadline:
            new, pos = self._ledger.read(self._position)
            self._records.extend(new)
            for name, st in self._states.items():
                LedgerTopic.fold(st, name, new)
            self._position = pos
            if pos > offset:
                return
            time.sleep(0.05)
        if offset >= 0:
            raise self.conn.unavailable(f"waiting for ledger offset {offset} to become readable")

    # -- ownership and progress -------------------------------------------------------------
    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        check_pipeline_name(pipeline)
        self._driver = None
        self._driver_producer(pipeline)  # write before read: the fencing write comes first
        state = self._refresh(pipeline)
        epoch = (state.owner.epoch if state.owner else 0) + 1
        now = datetime.now(UTC)
        holder = f"{socket.gethostname()}:{os.getpid()}"
        self._epoch = epoch
        self._append_ledger(
            pipeline,
            {
                "type": "owner",
                "pipeline": pipeline,
                "epoch": epoch,
                "holder": holder,
                "source": source,
                "at": now.isoformat(),
            },
        )
        state = self._refresh(pipeline)
        assert state.owner is not None
        log.info("pipeline %r took epoch %d in %s", pipeline, epoch, self.describe())
        return state.owner

    def owner(self, pipeline: str) -> Owner | None:
        return self._refresh(pipeline).owner

    def ledger(self, pipeline: str) -> list[LedgerEntry]:
        return list(self._refresh(pipeline).entries)

    def end_offsets(self, pipeline: str) -> dict[TopicPartition, int]:
        entries = self._refresh(pipeline).entries
        return entries[-1].end_offsets if entries else {}

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

    # -- the commit protocol ----------------------------------------------------------------
    def commit(self, ctx: BatchContext, df: DataFrame) -> CommitResult:
        """Commit one micro-batch: steps 1-2 and 4-5 on the driver, step 3 in the tasks."""
        from pyspark.sql.types import BinaryType

        state = self._refresh(ctx.pipeline)
        # Step 1: this run's epoch must still be the owner's.
        if state.owner is not None and state.owner.epoch != ctx.epoch:
            raise FencedError(
                ctx.pipeline,
                ctx.epoch,
                state.owner.epoch,
                self._status_hint(ctx.pipeline),
                state.owner.holder,
            )
        # Step 2: a batch the ledger already covers is a replay: do nothing.
        last = state.entries[-1] if state.entries else None
        coverage = classify(ctx.ranges, {} if last is None else last.end_offsets)
        if coverage is Coverage.COMMITTED:
            seq = next((e.seq for e in reversed(state.entries) if e.ranges == ctx.ranges), None)
            return CommitResult(True, 0, seq, "offsets already in the ledger (replay)")
        if coverage is Coverage.NO_DATA:
            # A no-data batch can still emit rows (closed windows, timeouts); it is
            # identified by the checkpoint's query id and Spark's batch id.
            found = _find_no_data_batch(state.entries, ctx)
            if found is not None:
                return CommitResult(True, 0, found, "no-data batch already committed (replay)")
        seq = 0 if last is None else last.seq + 1
        self._check_pending(ctx, state, last)
        crash_point(CrashPoint.BEFORE_COMMIT)

        # Step 3: every task writes its records and marker in one transaction.
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
        stats = (
            df.mapInArrow(
                lambda it: _write_task(plan, it),
                "partition INT, rows BIGINT, skipped BOOLEAN",
            )
            .toArrow()
            .to_pylist()
        )
        rows = sum(int(s["rows"]) for s in stats)
        skipped = sum(1 for s in stats if s["skipped"])
        crash_point(CrashPoint.AFTER_ROWS)
        if coverage is Coverage.NO_DATA and rows == 0:
            # Nothing to make visible and no offsets to record (the tasks' empty
            # markers are told apart from the next batch's by their Spark identity).
            return CommitResult(True, 0, None, "no new offsets and no rows")

        # Steps 4 and 5: the batch's ledger entry, in the driver's transaction.
        state = self._refresh(ctx.pipeline)
        if state.owner is not None and state.owner.epoch != ctx.epoch:
            raise FencedError(
                ctx.pipeline,
                ctx.epoch,
                state.owner.epoch,
                self._status_hint(ctx.pipeline),
                state.owner.holder,
            )
        self._append_ledger(
            ctx.pipeline,
            {
                "type": "batch",
                "pipeline": ctx.pipeline,
                "seq": seq,
                "ranges": ctx.ranges.to_json_obj(),
                "epoch": ctx.epoch,
                "rows": rows,
                "tasks": len(stats),
                "tasks_skipped": skipped,
                "spark_batch_id": ctx.spark_batch_id,
                "checkpoint_id": ctx.checkpoint_id,
                "stateful": ctx.stateful,
                "at": datetime.now(UTC).isoformat(),
            },
            crash=True,
        )
        self._refresh(ctx.pipeline)
        crash_point(CrashPoint.AFTER_LEDGER_COMMIT)
        return CommitResult(False, rows, seq)

    def _check_pending(
        self, ctx: BatchContext, state: LedgerState, last: LedgerEntry | None
    ) -> None:
        """Refuse a batch that differs from a partly committed one (lost checkpoint)."""
        after = last.end_offsets if last else {}
        for pid, marker in state.markers.items():
            ranges = BatchRanges.from_json_obj(marker["ranges"])
            if ranges.ends() == after or classify(ranges, after) is Coverage.COMMITTED:
                continue
            if ranges != ctx.ranges:
                raise LedgerError(
                    f"pipeline {ctx.pipeline!r}: batch {ranges} is partly committed in "
                    f"{self.describe()} (task {pid} committed, the batch's ledger entry is "
                    f"missing), but this run planned {ctx.ranges} instead. This happens when "
                    "the checkpoint was lost mid-batch. Operator action: restore the checkpoint "
                    "directory, or re-run with the same read limits so the same batch is planned."
                )

    # -- administration ----------------------------------------------------------------------
    def reset(self, pipeline: str) -> None:
        """Make the output and ledger topics look empty (``delete_records`` up to their end).

        Destructive, for ``sparkonce verify`` trials only: it drops every record of
        both topics, whichever pipeline wrote them.
        """
        from confluent_kafka import Consumer, TopicPartition

        self.open()
        consumer = Consumer(
            self.conn.client_config(group_id="sparkonce-reset", isolation_level="read_uncommitted")
        )
        try:
            targets = []
            for topic in (self.topic, self.ledger_topic):
                for p in range(self.conn.partitions(topic)):
                    _low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=TIMEOUT_S
                    )
                    if high > 0:
                        targets.append(TopicPartition(topic, p, high))
        finally:
            consumer.close()
        if targets:
            admin = self.conn.admin()
            futures = admin.delete_records(
                targets, request_timeout=TIMEOUT_S, operation_timeout=TIMEOUT_S
            )
            for f in futures.values():
                f.result(timeout=TIMEOUT_S)
        self._states.clear()
        self._records.clear()
        self._position = 0
        self._driver = None

    def rows(self) -> list[dict[str, Any]]:
        """Every record ``read_committed`` consumers see in the output topic: key, value."""
        from confluent_kafka import Consumer, TopicPartition

        self.open()
        out: list[dict[str, Any]] = []
        consumer = Consumer(
            self.conn.client_config(
                group_id="sparkonce-rows",
                enable_auto_commit=False,
                isolation_level="read_committed",
            )
        )
        try:
            for p in range(self.conn.partitions(self.topic)):
                tp = TopicPartition(self.topic, p)
                low, high = consumer.get_watermark_offsets(tp, timeout=TIMEOUT_S, cached=False)
                if low >= high:
                    continue
                consumer.assign([TopicPartition(self.topic, p, low)])
                deadline = time.monotonic() + TIMEOUT_S
                while consumer.position([tp])[0].offset < high:
                    for m in consumer.consume(num_messages=1000, timeout=0.5):
                        if m.error() is None and (m.offset() or 0) < high:
                            out.append({"key": _text(m.key()), "value": _text(m.value())})
                    if time.monotonic() > deadline:
                        raise self.conn.unavailable(f"reading topic {self.topic!r}")
        finally:
            consumer.close()
        return out


def _text(b: bytes | None) -> str | bytes | None:
    if b is None:
        return None
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


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
