"""The Kafka sink's task marker: one codec for the record a task commits with its output.

Each task of :class:`~sparkonce.sinks.kafka.KafkaSink` writes, in the same Kafka
transaction as its records, one marker record to the ledger topic (key
``m:<pipeline>:<task key>``). A replay of the batch finds it and writes nothing again; the
driver reads the markers written after the last batch entry as the batch's partial commit
(:class:`~sparkonce.ledger.kafka_topic.LedgerState` ``pending``). The tasks encode it and
the ledger decodes it here, and nowhere else.

The record is JSON::

    {"type": "marker", "v": 1, "pipeline", "partition", "task", "seq", "ranges", "epoch",
     "rows", "attempt", "spark_batch_id", "checkpoint_id", "at"}

Older records still decode: those without ``v`` (written before the version field, with
the same fields otherwise), and older ones still without ``task`` (the task key was the
Spark partition number) or without ``attempt``, ``spark_batch_id``, ``checkpoint_id`` or
``at``. A record of a newer version raises :class:`~sparkonce.errors.LedgerError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sparkonce.errors import LedgerError
from sparkonce.offsets import BatchRanges, Coverage, classify

MARKER_VERSION = 1


@dataclass(frozen=True)
class Marker:
    """A task's marker: its batch, its task key and the rows it committed."""

    pipeline: str
    partition: int  # the Spark partition of the task that wrote it
    task: str  # the task key (the partition number, or a Kafka input range: "orders-3")
    seq: int
    ranges: BatchRanges
    epoch: int
    rows: int
    attempt: int = 0  # Spark's attempt number of the task
    spark_batch_id: int | None = None
    checkpoint_id: str | None = None
    at: str = ""  # when it was written, ISO 8601 (UTC)

    # -- the codec ------------------------------------------------------------------------
    def to_record(self) -> dict[str, Any]:
        """The ledger record (a JSON object) of this marker, at :data:`MARKER_VERSION`."""
        return {
            "type": "marker",
            "v": MARKER_VERSION,
            "pipeline": self.pipeline,
            "partition": self.partition,
            "task": self.task,
            "seq": self.seq,
            "ranges": self.ranges.to_json_obj(),
            "epoch": self.epoch,
            "rows": self.rows,
            "attempt": self.attempt,
            "spark_batch_id": self.spark_batch_id,
            "checkpoint_id": self.checkpoint_id,
            "at": self.at or datetime.now(UTC).isoformat(),
        }

    def encode(self) -> str:
        """The record's value as written to the ledger topic."""
        return json.dumps(self.to_record())

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Marker:
        """Decode a marker record (any version this code knows; see the module docstring)."""
        version = record.get("v", 0)
        if not isinstance(version, int) or version > MARKER_VERSION:
            raise LedgerError(
                f"a task marker of pipeline {record.get('pipeline')!r} in the Kafka ledger "
                f"topic has record version {version!r}, newer than this sparkonce reads "
                f"(up to {MARKER_VERSION}): a newer sparkonce wrote it. Run this pipeline with "
                "that sparkonce version or a later one."
            )
        try:
            partition = int(record["partition"])
            return cls(
                pipeline=str(record["pipeline"]),
                partition=partition,
                task=str(record.get("task", partition)),
                seq=int(record["seq"]),
                ranges=BatchRanges.from_json_obj(record["ranges"]),
                epoch=int(record["epoch"]),
                rows=int(record.get("rows", 0)),
                attempt=int(record.get("attempt", 0)),
                spark_batch_id=record.get("spark_batch_id"),
                checkpoint_id=record.get("checkpoint_id"),
                at=str(record.get("at", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LedgerError(
                f"a task marker of pipeline {record.get('pipeline')!r} in the Kafka ledger "
                f"topic cannot be read ({type(exc).__name__}: {exc}); the ledger topic holds a "
                "record sparkonce did not write. Check what else writes to it."
            ) from exc

    @classmethod
    def decode(cls, value: bytes | str) -> Marker:
        """A marker from the ledger record's value."""
        return cls.from_record(json.loads(value))

    # -- what it says -----------------------------------------------------------------------
    def is_for(
        self, batch: BatchRanges, spark_batch_id: int | None, checkpoint_id: str | None
    ) -> bool:
        """Whether this marker (read after the last batch entry) commits this batch.

        A batch with offsets is identified by its ranges (a marker whose ranges cover
        them). A no-data batch (empty ranges: the watermark moved or a timeout fired,
        no new input) by its Spark identity, the checkpoint's query id and batch id, so
        one no-data batch's marker never passes for the next one's. A marker of another
        batch (a zombie attempt's, behind the ledger) is not this batch's.
        """
        if not batch.empty:
            try:
                return classify(batch, self.ranges.ends()) is Coverage.COMMITTED
            except LedgerError:  # the marker's ranges end before this batch starts
                return False
        return (
            self.ranges == batch
            and self.spark_batch_id == spark_batch_id
            and self.checkpoint_id == checkpoint_id
        )
