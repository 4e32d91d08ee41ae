"""The Kafka target: the real KafkaLedgerStore and KafkaSink against a real broker.

Each target (lane) has its own output topic (2 partitions) and ledger topic, and one
pipeline. A run's endpoint is a :class:`~sparkonce.sinks.kafka.KafkaSink` whose ledger
store is :class:`ObservedKafkaStore` (the real store, reporting what each driver
transaction committed); the sink's stager's own ``prepare`` runs, and so does its task
function ``write_task`` (:mod:`sparkonce.sinks.kafka_tasks`), once per task, on a
:class:`~sparkonce.verify.sim.target.TaskFrame`: each task initialises its transactional
producer (fencing any earlier attempt), reads its marker from the ledger topic, and writes
its records and marker in one Kafka transaction, exactly as in a Spark executor.

A batch has two tasks (task ``p % 2`` writes log partition ``p``'s records; task 0 also
writes a no-data batch's timer row; a task with no rows writes only its marker). Records are
JSON ``[p, o, v, epoch]`` values, keyed ``p/o``; readers use ``read_committed``.

Faults: the ledger store does not retry a lost connection (a retry would need a new
driver producer, and its ``init_transactions`` could fence a newer run). An injected
drop therefore stops the run with ``KafkaUnavailableError`` (nothing of the driver's
transaction commits), and a lost acknowledgement stops it after its transaction
committed; the next run must finish or skip the batch.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

from sparkonce.commit import Staged
from sparkonce.kafka.client import KafkaConnection, KafkaUnavailableError
from sparkonce.ledger.kafka_topic import KafkaLedgerStore
from sparkonce.verify.sim.target import (
    Endpoint,
    Entry,
    FrameStage,
    ObservedStore,
    Planned,
    Row,
    Running,
    StageFn,
    Target,
    TaskFrame,
)

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.ledger.base import BatchContext

OUTPUT_PARTITIONS = 2
TASKS = 2  # Spark tasks per batch: log partition p's rows go to task p % 2 (timer rows: 0)
READ_TIMEOUT_S = 30.0


class ObservedKafkaStore(ObservedStore, KafkaLedgerStore):
    """The real Kafka ledger store; it also reports each committed transaction's entries."""

    def _lost_ack(self) -> Exception:
        return self.conn.unavailable("committing the driver's transaction (injected: ack lost)")

    def lose_connection(self, txn: Any) -> None:
        """Fault injection: the broker cannot be reached mid-transaction."""
        raise self.conn.unavailable("writing to the ledger topic (injected: connection lost)")

    def rollback_if_open(self) -> None:
        """A dead run's driver producer is gone; the next ``acquire`` fences its id anyway."""
        self._driver = None


class KafkaTarget(Target):
    """One pipeline, its output topic and its ledger topic on a Kafka broker."""

    store_name = "kafka"
    sink = "kafka"
    retries_connection_faults = False
    connection_fault_error = KafkaUnavailableError
    tasks_commit_early = True

    def __init__(self, bootstrap: str, *, name: str = "sim") -> None:
        self.conn = KafkaConnection(bootstrap, {})
        self.pipeline = name.replace("-", "_")
        self.topic = name
        self.ledger_topic = f"{name}.sparkonce-ledger"
        self.conn.ensure_topic(self.topic, OUTPUT_PARTITIONS)
        self._pool: list[Endpoint] = []
        self._admin = self._new_endpoint()
        self._admin.store._opened = False
        self._admin.store.open()  # creates the ledger topic (the other endpoints skip this)
        self._admin_client = self.conn.admin()
        self._reader: Any = None
        self._owner: int | None = None

    # -- endpoints -----------------------------------------------------------------------
    def _new_endpoint(self) -> Endpoint:
        from sparkonce.sinks.kafka import KafkaSink

        sink = KafkaSink(self.conn.bootstrap, self.topic, ledger_topic=self.ledger_topic)
        store = ObservedKafkaStore(
            self.conn,
            self.ledger_topic,
            topic=self.topic,
            transaction_timeout_ms=sink.transaction_timeout_ms,
            inspect_hint=sink._status_hint("{pipeline}"),
        )
        store._opened = True  # the ledger topic exists (created with the first endpoint)
        sink.store = sink.stager.store = store
        sink._opened = True
        return Endpoint(store, sink.stager)

    def take(self) -> Endpoint:
        return self._pool.pop() if self._pool else self._new_endpoint()

    def give_back(self, ep: Endpoint) -> None:
        ep.store.observer = None
        ep.store.lose_ack = 0
        ep.store.rollback_if_open()
        self._pool.append(ep)

    # -- the namespace -------------------------------------------------------------------
    def reset(self) -> None:
        """Make both topics look empty (``delete_records`` up to their ends)."""
        from confluent_kafka import TopicPartition

        targets = []
        for topic, parts in ((self.topic, OUTPUT_PARTITIONS), (self.ledger_topic, 1)):
            for p in range(parts):
                _low, high = self._watermarks(topic, p)
                if high > _low:
                    targets.append(TopicPartition(topic, p, high))
        if targets:
            futures = self._admin_client.delete_records(
                targets, request_timeout=READ_TIMEOUT_S, operation_timeout=READ_TIMEOUT_S
            )
            for f in futures.values():
                f.result(timeout=READ_TIMEOUT_S)
        for ep in [*self._pool, self._admin]:
            ep.store.forget()
        self._owner = None

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """(low, high) of one partition; waits while a new topic's metadata spreads."""
        from confluent_kafka import KafkaException, TopicPartition

        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            try:
                low, high = self._reader_consumer().get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=READ_TIMEOUT_S, cached=False
                )
                return int(low), int(high)
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _reader_consumer(self) -> Any:
        if self._reader is None:
            from confluent_kafka import Consumer

            self._reader = Consumer(
                self.conn.client_config(
                    group_id=f"{self.topic}-reader",
                    enable_auto_commit=False,
                    isolation_level="read_committed",
                    enable_partition_eof=True,
                )
            )
        return self._reader

    def visible_rows(self) -> list[Row]:
        """Every record ``read_committed`` consumers see in the output topic."""
        from confluent_kafka import TopicPartition

        c = self._reader_consumer()
        assign = []
        highs: dict[int, int] = {}
        for p in range(OUTPUT_PARTITIONS):
            low, high = self._watermarks(self.topic, p)
            if high > low:
                assign.append(TopicPartition(self.topic, p, low))
                highs[p] = high
        rows: list[Row] = []
        if not assign:
            return rows
        c.assign(assign)
        try:
            pending = set(highs)
            deadline = time.monotonic() + READ_TIMEOUT_S
            while pending:
                for m in c.consume(num_messages=1000, timeout=0.05):
                    err = m.error()
                    if err is not None:
                        if err.code() == -191:  # _PARTITION_EOF
                            pending.discard(m.partition())
                            continue
                        raise RuntimeError(f"reading {self.topic!r}: {err}")
                    p, o, v, epoch = json.loads(m.value())
                    rows.append((p, o, v, epoch))
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"reading {self.topic!r}: partitions {sorted(pending)} did not reach "
                        "their end (a transaction left open?)"
                    )
            positions = c.position([TopicPartition(self.topic, p) for p in highs])
            for tp in positions:
                if tp.offset < highs[tp.partition]:
                    raise RuntimeError(
                        f"{self.topic}[{tp.partition}]: read_committed readers stop at "
                        f"{tp.offset}, before the end {highs[tp.partition]}: a transaction "
                        "was left open"
                    )
        finally:
            c.unassign()
        return rows

    def ledger(self) -> list[Entry]:
        state = self._admin.store.refresh(self.pipeline)
        self._owner = state.owner.epoch if state.owner is not None else None
        return [Entry.of(e) for e in state.entries]

    def owner_epoch(self) -> int | None:
        return self._owner

    # -- staging -------------------------------------------------------------------------
    def stage(
        self, run: Running, ctx: BatchContext, batch: Planned, rows: list[Row], fail: bool
    ) -> tuple[StageFn, list[int], list[int]]:
        import pyarrow as pa

        sink = run.endpoint.stager
        per_task: list[list[Row]] = [[] for _ in range(TASKS)]
        for r in rows:
            per_task[max(r[0], 0) % TASKS].append(r)
        schema = _arrow_schema()
        tasks = [
            pa.RecordBatch.from_pydict(
                {
                    "key": [f"{r[0]}/{r[1]}" for r in task],
                    "value": [json.dumps(r) for r in task],
                },
                schema=schema,
            )
            if task
            else None
            for task in per_task
        ]
        frame = TaskFrame(_spark_schema(), tasks, fail=fail)

        def stage(seq: int) -> Staged:
            return sink.prepare(ctx, frame, seq)  # type: ignore[arg-type]

        return FrameStage(stage, frame), [], []

    def close(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(Exception):
                self._reader.close()
            self._reader = None
        for ep in [*self._pool, self._admin]:
            ep.store._driver = None
        self._pool.clear()


_schemas: dict[str, Any] = {}


def _arrow_schema() -> Any:
    s = _schemas.get("arrow")
    if s is None:
        import pyarrow as pa

        s = _schemas["arrow"] = pa.schema([("key", pa.string()), ("value", pa.string())])
    return s


def _spark_schema() -> Any:
    s = _schemas.get("spark")
    if s is None:
        from pyspark.sql import types as T

        s = _schemas["spark"] = T.StructType(
            [T.StructField("key", T.StringType()), T.StructField("value", T.StringType())]
        )
    return s
