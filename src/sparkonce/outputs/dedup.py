"""Removing the duplicates a producer re-sent, by record id: :func:`dedupe`.

Why. An idempotent producer stops duplicates *within one producer session* only. A producer
that restarts and re-sends (an HTTP collector retrying after a timeout, a mobile client, a
Kafka Connect task) writes the same logical records again under a new producer id: the log
then holds duplicates, and an effectively-once pipeline counts each copy. When the producer
gives every logical record a stable id (the ``sparkonce-record-id`` Kafka header, or
``record_id=`` of the embedded log's producer), :func:`dedupe` removes the copies, Dataflow's
way: a catalogue of the ids seen, kept in Spark's state store (RocksDB, part of the
checkpoint, so it is rolled back with the checkpoint on a replay) and collected by the
event-time watermark, so it stays bounded::

    deduped = dedupe(events, "record_id", within="10 minutes", event_time="ts")

It is Spark's ``df.withWatermark(event_time, within).dropDuplicatesWithinWatermark([id])``,
with records whose id is NULL taken around it.

What is removed (measured on PySpark 4.2.1, checked batch by batch against a plain-Python
oracle and Spark's own counters in ``tests/outputs/test_dedup.py``)
    Let ``W(B)`` be the watermark Spark filters late records with in micro-batch ``B``:
    ``batchWatermarkMs`` of the offset log entry ``offsets/<B-1>`` (0 for the first batch),
    which is the greatest event time of the batches before ``B-1``, minus ``within`` (0
    before any data; it never goes back). A record whose id is not NULL is then, in ``B``:

    1. **dropped as late** when ``event_time <= W(B)`` (compared in microseconds; a record
       exactly at the watermark is late), whether or not its id was seen: Spark filters late
       records before it looks at the ids (``numRowsDroppedByWatermark`` of the
       ``dedupeWithinWatermark`` state operator counts them, one per record);
    2. **removed as a duplicate** when a copy with the same id was kept earlier in this batch
       or in an earlier batch and is still in the state (``numDroppedDuplicateRows``);
    3. **kept** otherwise. The kept copy's id enters the state with the expiry
       ``event_time + within``; it leaves the state at the end of the first batch whose own
       watermark (``offsets/<B>``) is at or past that expiry. Removed copies do not extend it.

    Hence the bound. A copy whose event time is at most ``within`` after the kept copy's
    (or earlier) is **always** removed, as a duplicate or as late: the kept id is still in the
    state for as long as such a copy can arrive on time. In particular, a re-send that
    carries the record's original event time never passes. A copy whose event time is more
    than ``within`` after the kept one's may arrive after its id left the state (once the
    stream's event time reached ``kept + 2 * within``, the watermark being ``within`` behind
    the latest event): it then **passes through as a new record** and counts again, and its
    id enters the state afresh. Pick ``within`` longer than the time a producer can take to
    re-send, in event time; the state holds about ``2 * within`` of ids.

    Which of several copies in one micro-batch is kept is Spark's choice (the first it meets
    in the id's shuffle partition): make the copies of a record carry the same values, or
    expect the kept row's other columns (offset, partition, a timestamp) to be any copy's.

    A record whose event time is NULL is never late, and Spark takes the NULL as 1970 for
    its expiry: once the watermark has moved at all, its id is forgotten at the end of its
    own batch, so its copies are removed within that batch only. Give every record an event
    time.

Records without an id
    A record whose id is NULL is never deduplicated, not even against other NULLs (Spark's
    ``dropDuplicates`` would treat all NULLs as one id): it goes around the dedup operator,
    with no state and no late filter, and every such record passes through. Each batch
    counts them: the output carries Spark's observed metric ``sparkonce_dedup`` (or
    ``sparkonce_dedup_<name>``) with one field, ``null_ids``, in the query's progress
    (``query.lastProgress["observedMetrics"]``); :func:`dedup_counts` reads it, with Spark's
    counters, from a progress entry, and ``Pipeline.run`` logs them per batch and keeps them
    in ``RunReport.dedup``.

    Cost: the source is read once per micro-batch. Every record is shuffled by id (the
    shuffle Spark's dedup operator needs anyway), and the records with and without an id
    are split after that shuffle and unioned back; Spark reuses the one shuffle for both
    paths (``ReusedExchange`` in the query plan), and ``numInputRows`` counts each record
    once. An earlier form split before the shuffle, so Spark read the source twice: against
    a bare ``dropDuplicatesWithinWatermark`` it ran at 0.5x to 0.7x of the bare operator's
    throughput in ``benchmarks/dedup.py``. On 10 million records with 1% copies, a pipeline
    with :func:`dedupe` runs at 0.28x of the same pipeline without it (0.37x with the tuned
    RocksDB settings in docs/performance.md): the cost is Spark's state operator (its
    lookups, and a scan of the whole state per batch to remove expired ids), not the shuffle
    (0.86x).

The guarantee, in DESIGN.md's words
    With an effectively-once sink, a logical record re-sent under the same id takes effect
    once (**effectively-once per record id**) when its copies' event times lie within
    ``within`` of each other, and it is not late. A copy past the bound may take effect again
    (**at-least-once** beyond the bound). Records with a NULL id are not deduplicated
    (at-least-once per logical record, exactly-once per copy in the log). Records behind the
    watermark are dropped, which is a completeness choice: route them with
    ``late_records(events.where(F.col(id_column).isNotNull()), event_time)`` on the same
    watermarked ``events`` (give :func:`dedupe` that DataFrame) to keep and count them.

Replays and lost checkpoints
    The state is Spark's (RocksDB with changelog checkpointing) and lives in the checkpoint:
    a replayed batch runs against the state as it was before that batch, so its records are
    not taken for duplicates of themselves. A pipeline that dedups is stateful, so a lost
    checkpoint is refused (:class:`~sparkonce.errors.CheckpointLostError`) like every other
    stateful pipeline's: restore the checkpoint, or recompute from scratch.

Where code runs: :func:`dedupe` runs on the driver and only builds the query plan (checks
included, before any query starts); the filtering, shuffling and state updates run in
Spark's executors. :func:`dedup_counts` reads a progress entry on the driver.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkonce.errors import ConfigError
from sparkonce.outputs.late import duration_us

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

__all__ = ["DEDUP_METRIC", "DEDUP_OPERATOR", "DedupCounts", "dedup_counts", "dedupe"]

DEDUP_METRIC = "sparkonce_dedup"
"""Default name of the observed metric :func:`dedupe` adds (field ``null_ids``)."""
DEDUP_OPERATOR = "dedupeWithinWatermark"
"""``operatorName`` of Spark's state operator for ``dropDuplicatesWithinWatermark``."""
NULL_IDS = "null_ids"
BARRIER_COLUMN = "_sparkonce_dedup_partition"
"""The column :func:`dedupe` adds, and drops again, to keep its split after the shuffle:
``spark_partition_id()``, non-deterministic to Spark but only ever compared with 0 (always
true). ``explain`` knows it by this name (leading underscores added against a clash)."""

_WATERMARK_KEY = "spark.watermarkDelayMs"  # column metadata set by withWatermark
_ID_TYPES = ("string", "binary", "tinyint", "smallint", "int", "bigint")


def dedupe(
    df: DataFrame,
    id_column: str = "record_id",
    *,
    within: str,
    event_time: str,
    name: str | None = None,
) -> DataFrame:
    """``df`` without the records whose id was already seen within ``within`` (driver; lazy).

    See the module docstring for exactly what is removed, the bound and what passes after
    it. ``id_column`` is a STRING, BINARY or integer column (NULL: the record passes and is
    counted); ``event_time`` a TIMESTAMP column; ``within`` a duration such as ``"10
    minutes"`` (a positive whole number of milliseconds; no months or years). It becomes the
    watermark delay: ``df`` must have no watermark, or exactly
    ``withWatermark(event_time, within)``. ``name`` tells apart two dedup steps of one query
    (Spark refuses two observed metrics of one name): the metric that counts the records
    without an id is then ``sparkonce_dedup_<name>`` instead of ``sparkonce_dedup``.

    Returns ``df``'s columns, unchanged. A static ``df`` is deduplicated as a whole (one
    row per id, every NULL id kept). Raises :class:`ConfigError`, before any query starts,
    for a missing column, a wrong type, a bad duration, a conflicting watermark or a bad
    ``name``.
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    if not isinstance(df, DataFrame):
        raise ConfigError(f"dedupe takes a pyspark DataFrame, got {type(df).__name__}")
    fields = {f.name: f for f in df.schema.fields}
    id_field = _field_named(
        fields,
        id_column,
        "id column",
        "name the column that holds the producer's record id (both sources call it 'record_id')",
    )
    if id_field.dataType.simpleString() not in _ID_TYPES:
        raise ConfigError(
            f"dedupe: id column {id_column!r} is {id_field.dataType.simpleString()}; a record id "
            f"must be one of {', '.join(_ID_TYPES)} (floating point ids do not compare exactly, "
            "and maps cannot be compared at all). Convert it first, for example "
            f"F.col({id_column!r}).cast('string')"
        )
    time_field = _field_named(
        fields,
        event_time,
        "event time column",
        "the state of each id is kept for `within` of event time, so name a TIMESTAMP column",
    )
    if not isinstance(time_field.dataType, TimestampType):
        raise ConfigError(
            f"dedupe: event time column {event_time!r} is "
            f"{time_field.dataType.simpleString()}, not timestamp; Spark's watermark needs a "
            "TIMESTAMP column (convert it with F.timestamp_millis, F.to_timestamp or "
            ".cast('timestamp'))"
        )
    within_ms = _within_ms(within)
    if name is None:
        metric = DEDUP_METRIC
    elif isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_]+", name):
        metric = f"{DEDUP_METRIC}_{name}"
    else:
        raise ConfigError(
            f"dedupe: name must be letters, digits and underscores (it names the observed "
            f"metric sparkonce_dedup_<name>), got {name!r}"
        )

    marked = {
        f.name: f.metadata[_WATERMARK_KEY] for f in df.schema.fields if _WATERMARK_KEY in f.metadata
    }
    if not marked:
        watermarked = df.withWatermark(event_time, within)
    elif list(marked) == [event_time] and marked[event_time] == within_ms:
        watermarked = df  # the caller's own withWatermark(event_time, within): the same thing
    elif event_time in marked:
        raise ConfigError(
            f"dedupe: the DataFrame already has a watermark on {event_time!r} with a delay of "
            f"{marked[event_time]} ms, but within={within!r} is {within_ms} ms. dedupe keeps "
            "each id for `within` and uses it as the watermark delay: give the DataFrame "
            f"before withWatermark, or the same delay (withWatermark({event_time!r}, "
            f"{within!r}))"
        )
    else:
        raise ConfigError(
            f"dedupe: the DataFrame has a watermark on {sorted(marked)}, not on the event time "
            f"column {event_time!r}; Spark's dedup needs exactly one event time column. Give "
            f"the DataFrame before withWatermark, or its watermark on {event_time!r}"
        )

    ident = F.col(_quote(id_column))
    if not df.isStreaming:  # Spark refuses dropDuplicatesWithinWatermark on a static one
        keyed = watermarked.where(ident.isNotNull())
        return keyed.dropDuplicates([id_column]).unionByName(watermarked.where(ident.isNull()))
    # One read of the source for both paths: shuffle every record by id once (the exchange
    # the dedup operator needs anyway), then split. The split's filters refer to a
    # non-deterministic column, so the optimizer cannot push them below the shuffle, and the
    # two paths' identical shuffles become one (Spark's ReusedExchange).
    barrier = _unused_name(df.columns)
    shuffled = watermarked.repartition(ident).withColumn(barrier, F.spark_partition_id())
    after_shuffle = F.col(barrier) >= 0  # always true
    keyed = shuffled.where(ident.isNotNull() & after_shuffle)
    unkeyed = shuffled.where(ident.isNull() & after_shuffle)
    out = keyed.dropDuplicatesWithinWatermark([id_column]).unionByName(unkeyed)
    out = out.select([F.col(_quote(c)) for c in df.columns])
    return out.observe(metric, F.count(F.when(ident.isNull(), 1)).alias(NULL_IDS))


def _unused_name(columns: list[str]) -> str:
    """A column name that is not in ``columns``."""
    name = BARRIER_COLUMN
    while name in columns:
        name = "_" + name
    return name


def _within_ms(within: object) -> int:
    """``within`` in milliseconds, or :class:`ConfigError` naming what is wrong."""
    if not isinstance(within, str):
        raise ConfigError(
            f"dedupe: within must be a duration string like '10 minutes', got "
            f"{type(within).__name__} {within!r}"
        )
    us = duration_us(within, "dedupe: within")
    if us <= 0:
        raise ConfigError(
            f"dedupe: within {within!r} must be a positive duration: it is how long (in event "
            "time) an id is remembered; give the longest time a producer may take to re-send"
        )
    if us % 1000:
        raise ConfigError(
            f"dedupe: within {within!r} is not a whole number of milliseconds; Spark keeps "
            "watermark delays in milliseconds"
        )
    return us // 1000


def _field_named(fields: Mapping[str, Any], name: object, role: str, advice: str) -> Any:
    """The schema field ``name`` of ``fields``, or :class:`ConfigError` naming the columns
    there are, a near miss in case, and ``advice``."""
    found = fields.get(name) if isinstance(name, str) else None
    if found is None:
        raise ConfigError(
            f"dedupe: {role} {name!r} is not a column of the DataFrame (its columns: "
            f"{list(fields)}){_near(name, fields)}; {advice}"
        )
    return found


def _near(name: object, fields: Mapping[str, object]) -> str:
    """A hint naming a column that differs from ``name`` in case only."""
    if not isinstance(name, str):
        return ""
    near = [f for f in fields if f.casefold() == name.casefold()]
    return f" (did you mean {near[0]!r}? names are matched exactly)" if near else ""


def _quote(column: str) -> str:
    """``column`` as a quoted identifier, so dots, spaces and backticks stay in the name."""
    return "`" + column.replace("`", "``") + "`"


@dataclass(frozen=True)
class DedupCounts:
    """What the dedup steps of a query did in one micro-batch (from Spark's progress).

    ``null_ids``: records without an id that passed through (the observed metrics
    ``sparkonce_dedup`` and ``sparkonce_dedup_<name>``, summed); ``duplicates_removed``,
    ``late_dropped``, ``state_ids``: ``numDroppedDuplicateRows``,
    ``numRowsDroppedByWatermark`` and ``numRowsTotal`` of the query's
    ``dedupeWithinWatermark`` state operators, summed (a ``dropDuplicatesWithinWatermark`` of
    your own counts too).
    """

    spark_batch_id: int
    null_ids: int
    duplicates_removed: int
    late_dropped: int
    state_ids: int


def dedup_counts(progress: Mapping[str, Any]) -> DedupCounts | None:
    """The :class:`DedupCounts` of one progress entry (``query.lastProgress`` or an entry of
    ``query.recentProgress``), or None when the query has no dedup step (driver)."""
    metrics = progress.get("observedMetrics") or {}
    null_ids = 0
    observed = False
    for name, row in metrics.items():
        if name == DEDUP_METRIC or str(name).startswith(DEDUP_METRIC + "_"):
            value = _field(row, NULL_IDS)
            if value is not None:
                null_ids += int(value)
                observed = True
    operators = [
        op
        for op in progress.get("stateOperators") or []
        if op.get("operatorName") == DEDUP_OPERATOR
    ]
    if not observed and not operators:
        return None
    return DedupCounts(
        spark_batch_id=int(progress.get("batchId", -1)),
        null_ids=null_ids,
        duplicates_removed=sum(
            int((op.get("customMetrics") or {}).get("numDroppedDuplicateRows", 0))
            for op in operators
        ),
        late_dropped=sum(int(op.get("numRowsDroppedByWatermark", 0)) for op in operators),
        state_ids=sum(int(op.get("numRowsTotal", 0)) for op in operators),
    )


def _field(row: object, name: str) -> Any:
    """A field of an observed-metrics row: a pyspark Row, or a mapping in JSON form.

    A Spark Connect client parses its progress from the JSON the server sends, where a
    row is ``{"values": [...], "schema": {"fields": [{"name": ...}, ...]}}``; PySpark 4.2
    makes a Row of that with the two fields ``values`` and ``schema``, not one field per
    metric (measured: ``Row(values=[2], schema={...})`` for ``null_ids`` = 2). Both
    shapes are read here; a classic session gives ``Row(null_ids=2)``."""
    if not isinstance(row, Mapping):
        as_dict = getattr(row, "asDict", None)
        if not callable(as_dict):
            return None
        row = as_dict()
        assert isinstance(row, Mapping)
    values, schema = row.get("values"), row.get("schema")
    if name not in row and isinstance(values, list) and isinstance(schema, Mapping):
        names = [f.get("name") for f in schema.get("fields") or [] if isinstance(f, Mapping)]
        return dict(zip(names, values, strict=False)).get(name)
    return row.get(name)
