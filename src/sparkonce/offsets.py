"""Offset ranges and the pure functions that plan and compare them.

A micro-batch is *defined* by per-partition offset ranges ``(topic, partition,
start, end)``, with ``start`` inclusive and ``end`` exclusive. The ranges are
written into Spark's checkpoint before the batch runs, and into the sink's
ledger in the same transaction as the batch's rows. Everything here is a pure
function over frozen values, so it is tested with property tests.

Wire form (the Spark source offset and the ledger column)::

    {"<topic>": {"<partition>": [start, end], ...}, ...}

This module imports nothing from pyspark.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from sparkonce.errors import ConfigError, LedgerError

TopicPartition = tuple[str, int]


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Records ``start <= offset < end`` of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.partition < 0:
            raise ConfigError(f"offset range {self}: partition must be >= 0")
        if not 0 <= self.start <= self.end:
            raise ConfigError(
                f"offset range {self.topic}[{self.partition}]: need 0 <= start <= end, "
                f"got start={self.start} end={self.end}"
            )

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def count(self) -> int:
        return self.end - self.start

    @property
    def empty(self) -> bool:
        return self.start == self.end


@dataclass(frozen=True)
class BatchRanges:
    """The offset ranges of one micro-batch, one per topic partition, sorted."""

    ranges: tuple[OffsetRange, ...]

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.ranges))
        seen: set[TopicPartition] = set()
        for r in ordered:
            if r.tp in seen:
                raise ConfigError(f"batch lists {r.topic}[{r.partition}] twice")
            seen.add(r.tp)
        object.__setattr__(self, "ranges", ordered)

    @property
    def count(self) -> int:
        return sum(r.count for r in self.ranges)

    @property
    def empty(self) -> bool:
        return all(r.empty for r in self.ranges)

    def ends(self) -> dict[TopicPartition, int]:
        return {r.tp: r.end for r in self.ranges}

    def starts(self) -> dict[TopicPartition, int]:
        return {r.tp: r.start for r in self.ranges}

    def to_json_obj(self) -> dict[str, dict[str, list[int]]]:
        out: dict[str, dict[str, list[int]]] = {}
        for r in self.ranges:
            out.setdefault(r.topic, {})[str(r.partition)] = [r.start, r.end]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_json_obj(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json_obj(cls, obj: object) -> BatchRanges:
        if not isinstance(obj, Mapping):
            raise ConfigError(f"offset ranges must be a JSON object, got {obj!r}")
        ranges = []
        for topic, parts in obj.items():
            if not isinstance(parts, Mapping):
                raise ConfigError(f"offset ranges of topic {topic!r} must be an object")
            for part, bounds in parts.items():
                try:
                    if not isinstance(bounds, (list, tuple)) or len(bounds) != 2:
                        raise TypeError("need a [start, end] pair")
                    start, end = (int(b) for b in bounds)
                    partition = int(part)
                except (TypeError, ValueError) as exc:
                    raise ConfigError(
                        f"offset range {topic}[{part}]: expected [start, end], got {bounds!r}"
                    ) from exc
                ranges.append(OffsetRange(str(topic), partition, start, end))
        return cls(tuple(ranges))

    @classmethod
    def from_json(cls, text: str) -> BatchRanges:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"offset ranges are not valid JSON: {text[:200]!r}") from exc
        return cls.from_json_obj(obj)

    @classmethod
    def at(cls, positions: Mapping[TopicPartition, int]) -> BatchRanges:
        """Empty ranges sitting at ``positions`` (the offset of a source at rest)."""
        return cls(tuple(OffsetRange(t, p, o, o) for (t, p), o in positions.items()))

    def __str__(self) -> str:
        return " ".join(f"{r.topic}[{r.partition}]:{r.start}..{r.end}" for r in self.ranges)


def plan_batch(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    *,
    max_per_partition: int | None = None,
    max_total: int | None = None,
    proportional: bool = False,
) -> BatchRanges:
    """Plan the next batch from each partition's ``start`` up to ``latest``.

    Properties (tested): ranges begin exactly at ``start`` (no gap, no overlap
    with the previous batch), never pass ``latest``, take at most
    ``max_per_partition`` records from a partition and ``max_total`` in all,
    and make progress whenever a limit allows at least one record.
    ``max_total`` is shared out round-robin, so a busy partition does not starve
    the others. A partition new in ``latest`` starts at offset 0.

    ``proportional`` (a query with an event-time watermark): the limits cap the batch as a
    whole, never one partition alone. The budget ``B`` is the smaller of
    ``max_per_partition`` times the number of partitions and ``max_total``; when the
    partitions' unread backlogs ``a_p`` (``A`` in all) exceed it, each partition takes
    ``ceil(B * a_p / A)`` records: every partition reads at least the same fraction ``B / A``
    of its backlog, and one with a backlog at least one record. The batch then holds at
    most ``B + partitions - 1`` records. See :func:`proportional_shares`.
    """
    for name, limit in (("max_per_partition", max_per_partition), ("max_total", max_total)):
        if limit is not None and limit < 1:
            raise ConfigError(f"{name} must be >= 1, got {limit}")
    tps = sorted(set(start) | set(latest))
    begin: dict[TopicPartition, int] = {}
    avail: dict[TopicPartition, int] = {}
    for tp in tps:
        s = start.get(tp, 0)
        top = latest.get(tp, s)
        if top < s:
            raise LedgerError(
                f"{tp[0]}[{tp[1]}]: the log ends at offset {top}, before the resume "
                f"offset {s}. The log lost records that were already committed; "
                "check that the source is the one this pipeline was started on."
            )
        begin[tp] = s
        take = top - s
        if max_per_partition is not None and not proportional:
            take = min(take, max_per_partition)
        avail[tp] = take
    if proportional:
        limits = [m for m in (max_total,) if m is not None]
        if max_per_partition is not None:
            limits.append(max_per_partition * len(tps))
        if limits and tps:
            avail = proportional_shares(avail, min(limits))
    elif max_total is not None and sum(avail.values()) > max_total:
        granted = dict.fromkeys(tps, 0)
        budget = max_total
        while budget > 0:
            open_tps = [tp for tp in tps if granted[tp] < avail[tp]]
            if not open_tps:
                break
            share = max(1, budget // len(open_tps))
            for tp in open_tps:
                extra = min(share, avail[tp] - granted[tp], budget)
                granted[tp] += extra
                budget -= extra
                if budget == 0:
                    break
        avail = granted
    return BatchRanges(
        tuple(OffsetRange(t, p, begin[(t, p)], begin[(t, p)] + avail[(t, p)]) for t, p in tps)
    )


def proportional_shares(
    backlog: Mapping[TopicPartition, int], budget: int
) -> dict[TopicPartition, int]:
    """How many records each partition reads of its ``backlog`` under a batch ``budget``,
    when partitions must progress at the same pace (an event-time watermark downstream).

    All of it when the backlogs fit the budget; else ``ceil(budget * a_p / A)`` for each
    partition (``a_p`` its backlog, ``A`` their sum). Every partition then reads at least the
    fraction ``budget / A`` of its backlog, so none runs ahead of another by more than one
    record's worth of that fraction, and none waits while others read: a cap per partition
    would let a small partition read all its records while a large one reads a sliver, and
    the small one's event time would run ahead. This aligns the partitions on their unread
    offsets, not on event times, which the planner never sees.
    """
    if budget < 1:
        raise ConfigError(f"budget must be >= 1, got {budget}")
    total = sum(backlog.values())
    if total <= budget:
        return dict(backlog)
    return {tp: -(-budget * a // total) for tp, a in backlog.items()}


def _limit(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class ReadLimits:
    """A range source's read limits, named as its arguments are (None: no limit), and how
    they cut a batch: each partition's share on its own (the default, see
    :func:`plan_batch`), or, when ``proportional``, the batch as a whole, shared out in
    proportion to each partition's backlog (:func:`proportional_shares`; a query with an
    event-time watermark). A limit that is not a positive integer is a
    :class:`~sparkonce.errors.ConfigError`."""

    max_records_per_partition: int | None = None
    max_records_per_batch: int | None = None
    proportional: bool = False

    def __post_init__(self) -> None:
        _limit("max_records_per_partition", self.max_records_per_partition)
        _limit("max_records_per_batch", self.max_records_per_batch)

    def by_argument(self) -> dict[str, int]:
        """The limits that are set, by argument name."""
        limits = {
            "max_records_per_partition": self.max_records_per_partition,
            "max_records_per_batch": self.max_records_per_batch,
        }
        return {k: v for k, v in limits.items() if v}

    def aligned(self) -> ReadLimits | None:
        """The same limits shared out in proportion to the backlogs; None when that changes
        nothing (no limit is set, or they already are)."""
        if self.proportional or not self.by_argument():
            return None
        return ReadLimits(self.max_records_per_partition, self.max_records_per_batch, True)


def batch_from_offsets(previous: BatchRanges | None, current: BatchRanges) -> BatchRanges:
    """The ranges a micro-batch covers, from Spark's offset log entries.

    A source's offset is the ranges of the batch that produced it. Spark writes the
    *same* source offset again for a **no-data batch**: a batch with no new input,
    run because the watermark moved (append-mode aggregations emit the windows that
    closed) or a state timeout fired. Such a batch covers nothing: its ranges are
    empty, sitting at the previous batch's ends. Reading its offset as the previous
    batch's ranges would make it look like a replay of that batch, and its rows
    would be dropped. ``previous`` is the offset of the batch before (None for a
    query's first batch, or when Spark already purged it).
    """
    if previous is not None and previous.ends() == current.ends():
        return BatchRanges.at(current.ends())
    return current


class Coverage(Enum):
    """How a batch relates to what the ledger has already committed."""

    NEW = "new"  # every range starts exactly at the committed end: commit it
    COMMITTED = "committed"  # every non-empty range lies at or below the committed end: skip
    NO_DATA = "no-data"  # nothing to read in any partition (a no-data batch)


def classify(batch: BatchRanges, committed_end: Mapping[TopicPartition, int]) -> Coverage:
    """Step 2 of the commit protocol: is ``batch`` new, a replay, or neither?

    ``committed_end`` holds the ledger's end offset per partition (missing: the
    partition was never committed). An empty range counts as old when it sits behind
    the committed end (it belongs to a replayed batch), and tells nothing when it sits
    at it. Raises :class:`LedgerError` for a batch that
    would leave a gap (records skipped) or overlaps the ledger only in part;
    both mean the source and the ledger disagree, and committing would lose or
    duplicate records.
    """
    new: list[OffsetRange] = []
    old: list[OffsetRange] = []
    for r in batch.ranges:
        c = committed_end.get(r.tp)
        if r.empty:
            if c is not None and r.start > c:
                raise _gap(r, c)
            if c is not None and r.start < c:
                # Behind the ledger: this partition's position belongs to an older batch
                # (a replay). Beside a new range it would move the resume point back.
                old.append(r)
            continue
        if c is None or r.start == c:
            new.append(r)
        elif r.end <= c:
            old.append(r)
        elif r.start > c:
            raise _gap(r, c)
        else:
            raise LedgerError(
                f"batch range {r.topic}[{r.partition}] {r.start}..{r.end} overlaps the "
                f"ledger's end offset {c} only in part. The source re-planned a committed "
                "batch differently; nothing was committed. Check that the checkpoint "
                "belongs to this pipeline and sink."
            )
    if new and old:
        raise LedgerError(
            f"batch {batch} mixes ranges already committed ({', '.join(map(_fmt, old))}) with "
            f"new ones ({', '.join(map(_fmt, new))}); nothing was committed. Check that the "
            "checkpoint belongs to this pipeline and sink."
        )
    if new:
        return Coverage.NEW
    if old:
        return Coverage.COMMITTED
    return Coverage.NO_DATA


def _fmt(r: OffsetRange) -> str:
    return f"{r.topic}[{r.partition}]:{r.start}..{r.end}"


def _gap(r: OffsetRange, committed: int) -> LedgerError:
    return LedgerError(
        f"batch range {_fmt(r)} starts after the ledger's end offset {committed} for "
        f"{r.topic}[{r.partition}]: records {committed}..{r.start} would be skipped. "
        "Nothing was committed. Start the query from the ledger (delete the checkpoint "
        "of a stateless pipeline) or check the source's starting offsets."
    )


def advance(
    committed_end: Mapping[TopicPartition, int], batch: BatchRanges
) -> dict[TopicPartition, int]:
    """The ledger's end offsets after committing ``batch``."""
    out = dict(committed_end)
    for r in batch.ranges:
        out[r.tp] = max(out.get(r.tp, 0), r.end)
    return out


def check_chain(batches: Iterable[BatchRanges]) -> list[str]:
    """Problems in a sequence of committed batches (empty list: gap-free, monotonic).

    Each batch must start every partition exactly where the previous batch that
    covered it ended, and offsets must never go backwards.
    """
    problems: list[str] = []
    end: dict[TopicPartition, int] = {}
    for i, batch in enumerate(batches):
        for r in batch.ranges:
            prev = end.get(r.tp)
            if prev is not None and r.start != prev:
                kind = "gap" if r.start > prev else "overlap"
                problems.append(f"ledger entry {i}: {kind} at {_fmt(r)} (previous end {prev})")
            end[r.tp] = r.end
    return problems
