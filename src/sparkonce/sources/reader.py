"""The Spark side shared by sparkonce's sources (Python Data Source API).

Both sources define a micro-batch as per-partition offset ranges (see
:mod:`sparkonce.sources.base`). :class:`RangeStreamReader` holds the planning
they share: where a query starts, how read limits cut a batch, the end target
of ``Trigger.AvailableNow``, and one Spark input partition per non-empty range.
A source's reader adds how to find a partition's log start and end, and how to
read a range.

Spark's Python workers import this module; it imports pyspark at the top.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Mapping

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from sparkonce.errors import ConfigError
from sparkonce.faults import InjectedTaskFailure, worker_faults
from sparkonce.offsets import BatchRanges, OffsetRange, ReadLimits, plan_batch

# The reader option that tells how read limits cut a batch. Set (by Source.aligned) when the
# query has an event-time watermark: the limits then cap the batch's total, shared out in
# proportion to each partition's backlog (sparkonce.offsets.proportional_shares).
CAP_OPTION = "readLimitSharing"
CAP_PROPORTIONAL = "proportional"


def limit_options(limits: ReadLimits) -> dict[str, str]:
    """The reader options that carry ``limits`` (what
    :meth:`RangeStreamReader._configure_limits` reads back)."""
    opts = {}
    if limits.max_records_per_partition:
        opts["maxRecordsPerPartition"] = str(limits.max_records_per_partition)
    if limits.max_records_per_batch:
        opts["maxRecordsPerBatch"] = str(limits.max_records_per_batch)
    if limits.proportional:
        opts[CAP_OPTION] = CAP_PROPORTIONAL
    return opts


def parse_starting(value: str, topic: str) -> dict[int, int] | str:
    """``startingOffsets``: ``earliest``, ``latest`` or JSON ``{"partition": offset}``."""
    if value in ("earliest", "latest"):
        return value
    try:
        obj = json.loads(value)
        if not isinstance(obj, dict):
            raise ValueError
        parsed = {int(p): int(o) for p, o in obj.items()}
        if any(p < 0 or o < 0 for p, o in parsed.items()):
            raise ValueError
        return parsed
    except (ValueError, TypeError):
        raise ConfigError(
            f"starting_offsets {value!r} for topic {topic!r}: use 'earliest', 'latest' or a "
            'JSON object of partition -> offset such as {"0": 42, "1": 17}'
        ) from None


def opt_int(options: Mapping[str, str], name: str) -> int | None:
    """A positive integer reader option, or None when it is not set."""
    raw = options.get(name)
    if raw in (None, ""):
        return None
    try:
        value = int(str(raw))
    except ValueError:
        raise ConfigError(f"option {name}={raw!r} must be a positive integer") from None
    if value < 1:
        raise ConfigError(f"option {name}={raw!r} must be a positive integer")
    return value


def _read_task_key(topic: str, partition: int, start: int, end: int) -> tuple[str, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return f"{topic}:{partition}:{start}:{end}", ctx.attemptNumber() if ctx is not None else 0


def injected_failure_offset(topic: str, partition: int, start: int, end: int) -> int | None:
    """Where a read task of ``start..end`` fails halfway, when this worker's fault plan
    (:func:`~sparkonce.faults.worker_faults`) asks for it on this attempt; None otherwise."""
    plan = worker_faults()
    if "read" not in plan.fail_tasks or end - start < 2:
        return None
    key, attempt = _read_task_key(topic, partition, start, end)
    if not plan.fail_task("read", key, attempt):
        return None
    return start + (end - start) // 2


def injected_read_failure(
    topic: str, partition: int, start: int, end: int, message: str
) -> InjectedTaskFailure:
    """The error a read task raises where :func:`injected_failure_offset` said; the
    failure is recorded as a fault event first."""
    key, attempt = _read_task_key(topic, partition, start, end)
    return worker_faults().task_failure("read", key, attempt, message)


class RangeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans batches as offset ranges (see the module docstring).

    A subclass sets ``topic``, calls :meth:`_configure_limits`, and gives
    ``_log_starts``, ``_log_ends``, ``_range_partition`` and ``read``.
    """

    topic: str

    def _configure_limits(self, options: Mapping[str, str]) -> None:
        self.max_per_partition = opt_int(options, "maxRecordsPerPartition")
        self.max_per_batch = opt_int(options, "maxRecordsPerBatch")
        # "proportional": the query has an event-time watermark; see plan_batch.
        self.proportional = options.get(CAP_OPTION) == CAP_PROPORTIONAL
        self.starting = parse_starting(options.get("startingOffsets") or "earliest", self.topic)
        self.target: dict[int, int] | None = None  # the end of Trigger.AvailableNow

    @abstractmethod
    def _log_starts(self) -> dict[int, int]:
        """The first offset still in the log, per partition."""

    @abstractmethod
    def _log_ends(self) -> dict[int, int]:
        """The next offset to be read (past the last readable record), per partition."""

    @abstractmethod
    def _range_partition(self, r: OffsetRange) -> InputPartition:
        """The Spark input partition that reads range ``r``."""

    def _ends(self) -> dict[int, int]:
        ends = self._log_ends()
        if self.target is not None:
            ends = {p: min(o, self.target.get(p, 0)) for p, o in ends.items()}
        return ends

    def _at(self, positions: Mapping[int, int]) -> BatchRanges:
        return BatchRanges.at({(self.topic, p): o for p, o in positions.items()})

    def initialOffset(self) -> dict:
        if self.starting == "earliest":
            pos = self._log_starts()
        elif self.starting == "latest":
            pos = self._ends()
        else:
            assert isinstance(self.starting, dict)
            pos = {p: self.starting.get(p, 0) for p in self._ends()}
        return self._at(pos).to_json_obj()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_batch is not None:
            return ReadMaxRows(self.max_per_batch)
        if self.max_per_partition is not None:
            return ReadMaxRows(self.max_per_partition * len(self._log_ends()))
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._log_ends()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        positions = BatchRanges.from_json_obj(start).ends()
        latest = {(self.topic, p): o for p, o in self._ends().items()}
        if isinstance(limit, ReadAllAvailable):
            batch = plan_batch(positions, latest)
        else:
            total = limit.max_rows if isinstance(limit, ReadMaxRows) else self.max_per_batch
            batch = plan_batch(
                positions,
                latest,
                max_per_partition=self.max_per_partition,
                max_total=total,
                proportional=self.proportional,
            )
        if batch.empty:
            return start  # nothing new: Spark skips the batch
        return batch.to_json_obj()

    def reportLatestOffset(self) -> dict | None:
        return self._at(self._ends()).to_json_obj()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        batch = BatchRanges.from_json_obj(end)
        if batch == BatchRanges.from_json_obj(start):
            return []
        return [self._range_partition(r) for r in batch.ranges if not r.empty]

    def commit(self, end: dict) -> None:
        """Nothing to do: the sink's ledger, not the source, records progress."""
