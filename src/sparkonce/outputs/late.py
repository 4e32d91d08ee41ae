"""Late data: the records a watermarked aggregation drops, routed to a ``late`` output.

Spark's streaming aggregation silently drops a record that arrives behind the watermark.
:func:`late_records` builds a stateless branch of the same input that the transform returns
as one more output (``{"totals": aggregate, "late": late_records(...)}``); inside
``foreachBatch`` for batch ``B`` the runner keeps, with :func:`filter_late` and
:func:`batch_watermark_ms`, exactly the records the aggregation dropped in that batch::

    events = stream.withWatermark("ts", "10 seconds")
    totals = events.groupBy(F.window("ts", "5 seconds"), "key").count()
    outputs = {"totals": totals, "late": late_records(events, "ts", window="5 seconds")}
    # in foreachBatch(batch, B), with the batch split back per output:
    late = filter_late(late_branch, batch_watermark_ms(checkpoint, B))

What "late" means (measured on PySpark 4.2.1, checked batch by batch against
``stateOperators[0].numRowsDroppedByWatermark`` in ``tests/outputs/test_late.py``)
    Let ``W(B)`` be ``batchWatermarkMs`` of the offset log entry ``offsets/<B-1>``: the
    watermark of the *previous* batch (Spark 3.4+ filters late events with the previous
    batch's watermark and evicts state with the current one, ``offsets/<B>``); ``W(0) = 0``.
    In batch ``B`` the aggregation drops a record from a window ``[start, end)`` when
    ``end <= W(B)``, and, grouping by the event-time column itself (no window), when
    ``event_time <= W(B)``: an event time equal to the watermark is late (compared in
    microseconds). A record with ``end > W(B)`` is aggregated even when its window closes
    in this very batch (``end <= offsets/<B>``'s watermark): the window is then emitted and
    evicted in batch ``B``. The rule holds from batch 0 on (``W = 0``: an event before 1970
    is always late). A restarted query that re-runs batch ``B`` reads the same
    ``offsets/<B-1>``, so a replay gives the same late records.

    A record of a sliding window is in several windows and may be dropped from some only
    (the earliest ones). It goes to the late output when it is dropped from at least one;
    ``windows`` says how many windows it belongs to, ``late_windows`` how many dropped it
    (``late_windows == windows``: the aggregate has none of it).

    Spark's ``numRowsDroppedByWatermark`` counts *groups*, not records: the partial
    aggregates are merged per group before the state store, so three late records of one
    ``(window, key)`` count 1. The late output has one row per record.

    Records with a NULL event time are neither aggregated nor late: Spark filters them out
    before the aggregation (not counted as dropped), and so does :func:`filter_late`.

Where it applies: one aggregation (``groupBy(window(...), keys)`` or ``groupBy(event_time,
keys)``) directly on the watermarked stream, the query's first stateful operator; give
:func:`late_records` the same ``window``/``slide``/``start_time`` as the ``F.window`` call.
Session windows and chained stateful operators are not covered.

Completeness against accuracy. A longer watermark delay lets more late records into the
aggregate (fewer late rows, more complete windows) but keeps each window's state longer
and makes append mode emit a window's result later. A shorter delay gives earlier, final
results with less state, and more records behind the watermark. Records routed to ``late``
are not lost: they are kept (written to their own sink and counted per batch), so they can
be reprocessed or reconciled with the aggregate later.

Where code runs: :func:`late_records` and :func:`filter_late` run on the driver and only
build column expressions (arithmetic on microseconds, no Python UDF); executors
evaluate them. :func:`batch_watermark_ms` reads one small file of the checkpoint on the
driver.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from sparkonce.errors import CheckpointError, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

    from sparkonce.files import ArrowSettings

LATE_COLUMN = "_sparkonce_late"
"""Hidden struct column of a late branch: ``first_end_us``, ``last_end_us``, ``slide_us``
(the end of the record's earliest and latest window, in microseconds, and the window slide;
without a window both ends are the event time itself)."""
WATERMARK_COLUMN = "watermark"
"""Column :func:`filter_late` adds: the watermark (timestamp) the record was behind."""
WINDOWS_COLUMN = "windows"
"""Column :func:`filter_late` adds: how many windows the record belongs to (int)."""
LATE_WINDOWS_COLUMN = "late_windows"
"""Column :func:`filter_late` adds: how many of those windows dropped the record (int)."""

_FIELDS = ("first_end_us", "last_end_us", "slide_us")
_RESERVED = (LATE_COLUMN, WATERMARK_COLUMN, WINDOWS_COLUMN, LATE_WINDOWS_COLUMN)
_WATERMARK_KEY = "spark.watermarkDelayMs"  # column metadata set by withWatermark

_UNITS_US = {
    "week": 7 * 86_400_000_000,
    "day": 86_400_000_000,
    "hour": 3_600_000_000,
    "minute": 60_000_000,
    "second": 1_000_000,
    "millisecond": 1_000,
    "microsecond": 1,
}
_NUMBER = re.compile(r"([+-]?)(\d+)(?:\.(\d{1,6}))?")


def duration_us(text: object, what: str = "duration") -> int:
    """Microseconds in a Spark interval string such as ``"10 seconds"`` or
    ``"interval 1 hour 30 minutes"``, else :class:`ConfigError`.

    Units: week, day, hour, minute, second, millisecond, microsecond (singular or plural);
    a fraction (up to 6 digits) only with seconds. Months and years are refused, as
    ``F.window`` refuses them.
    """
    if not isinstance(text, str):
        raise ConfigError(
            f"{what} must be a string like '10 seconds', got {type(text).__name__} {text!r}"
        )
    words = text.strip().lower().split()
    if words[:1] == ["interval"]:
        words = words[1:]
    if not words or len(words) % 2:
        raise ConfigError(
            f"{what} {text!r} is not a duration: write '<number> <unit>' pairs, "
            "e.g. '10 seconds' or '1 hour 30 minutes'"
        )
    total = 0
    for number, unit in zip(words[::2], words[1::2], strict=True):
        name = unit[:-1] if unit.endswith("s") else unit
        if name in ("month", "year"):
            raise ConfigError(
                f"{what} {text!r} uses {unit}: a window cannot be measured in months or years "
                "(their length varies); use days or weeks"
            )
        match = _NUMBER.fullmatch(number)
        if name not in _UNITS_US or match is None:
            raise ConfigError(
                f"{what} {text!r}: {number!r} {unit!r} is not '<number> <unit>' with a unit "
                f"among {', '.join(_UNITS_US)}"
            )
        sign, whole, fraction = match.groups()
        if fraction is not None and name != "second":
            raise ConfigError(
                f"{what} {text!r}: only seconds may have a fraction; write {number} {unit} "
                "in a smaller unit"
            )
        value = int(whole) * _UNITS_US[name] + int((fraction or "").ljust(6, "0"))
        total += -value if sign == "-" else value
    return total


def late_records(
    df: DataFrame,
    event_time: str,
    *,
    window: str | None = None,
    slide: str | None = None,
    start_time: str | None = None,
) -> DataFrame:
    """The late branch of ``df``: every column of ``df`` plus the hidden :data:`LATE_COLUMN`.

    ``df`` is the watermarked DataFrame the aggregation groups (``withWatermark`` on
    ``event_time``, a TIMESTAMP column); ``window``, ``slide`` and ``start_time`` are those of
    the aggregation's ``F.window(event_time, window, slide, start_time)``, or all None when it
    groups by ``event_time`` itself. Return it as an output of the transform; the runner
    applies :func:`filter_late` per batch. Select or derive further columns from it as you
    like, as long as :data:`LATE_COLUMN` stays. Raises :class:`ConfigError` for a missing or
    non-TIMESTAMP ``event_time``, a streaming ``df`` without a watermark on it, a column named
    like one :func:`filter_late` adds, or bad durations.
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    if not isinstance(df, DataFrame):
        raise ConfigError(f"late_records takes a pyspark DataFrame, got {type(df).__name__}")
    fields = {f.name: f for f in df.schema.fields}
    if not isinstance(event_time, str) or event_time not in fields:
        raise ConfigError(
            f"late_records: event time column {event_time!r} is not a column of the DataFrame "
            f"(its columns: {list(fields)}); name the column given to withWatermark"
        )
    field = fields[event_time]
    if not isinstance(field.dataType, TimestampType):
        raise ConfigError(
            f"late_records: event time column {event_time!r} is {field.dataType.simpleString()}, "
            "not timestamp; Spark's watermark needs a TIMESTAMP column (convert it with "
            "F.timestamp_millis, F.to_timestamp or .cast('timestamp') before withWatermark)"
        )
    if df.isStreaming and _WATERMARK_KEY not in field.metadata:
        marked = [f.name for f in df.schema.fields if _WATERMARK_KEY in f.metadata]
        where = f" (it is on {marked})" if marked else ""
        raise ConfigError(
            f"late_records: the streaming DataFrame has no watermark on {event_time!r}{where}; "
            f"call df.withWatermark({event_time!r}, delay) and give late_records the same "
            "DataFrame the aggregation groups"
        )
    reserved = {r.casefold() for r in _RESERVED}
    for name in fields:
        if name.casefold() in reserved:
            raise ConfigError(
                f"late_records: the DataFrame has a column {name!r}, a name the late output "
                f"uses itself ({', '.join(_RESERVED)}); rename or drop it first"
            )
    first, last, step = _window_ends(
        F.unix_micros(F.col(_quote(event_time))), window, slide, start_time
    )
    hidden = F.struct(first.alias(_FIELDS[0]), last.alias(_FIELDS[1]), step.alias(_FIELDS[2]))
    return df.select("*", hidden.alias(LATE_COLUMN))


def _window_ends(
    ts_us: Column, window: str | None, slide: str | None, start_time: str | None
) -> tuple[Column, Column, Column]:
    """(end of the earliest window, end of the latest window, slide) of an event, in µs."""
    from pyspark.sql import functions as F

    if window is None:
        if slide is not None or start_time is not None:
            raise ConfigError(
                "late_records: slide and start_time describe a window; give window too "
                "(the same durations as the aggregation's F.window), or none of them"
            )
        return ts_us, ts_us, F.lit(1).cast("long")
    size = duration_us(window, "window")
    step = size if slide is None else duration_us(slide, "slide")
    offset = 0 if start_time is None else duration_us(start_time, "start_time")
    if size <= 0 or step <= 0:
        raise ConfigError(
            f"late_records: window {window!r} and slide {slide!r} must be positive durations"
        )
    if step > size:
        raise ConfigError(
            f"late_records: slide {slide!r} is longer than window {window!r}; "
            "Spark requires slide <= window"
        )
    if abs(offset) >= step:
        raise ConfigError(
            f"late_records: start_time {start_time!r} must be shorter than the slide "
            f"({slide or window!r}), as Spark requires"
        )
    # Windows start at offset + k*step. The latest one holding ts starts at or before ts;
    # the earliest ends after ts: the first end past ts congruent to the latest end.
    last_end = ts_us - F.pmod(ts_us - F.lit(offset), F.lit(step)) + F.lit(size)
    first_end = ts_us + F.lit(step) - F.pmod(ts_us - last_end, F.lit(step))
    return first_end, last_end, F.lit(step).cast("long")


def is_late_branch(schema: StructType) -> bool:
    """True when ``schema`` (a branch's or split output's) carries :data:`LATE_COLUMN`,
    i.e. the DataFrame was built by :func:`late_records`."""
    from pyspark.sql.types import LongType, StructType

    for f in schema.fields:
        if f.name == LATE_COLUMN:
            inner = f.dataType
            return isinstance(inner, StructType) and [
                (g.name, type(g.dataType)) for g in inner.fields
            ] == [(name, LongType) for name in _FIELDS]
    return False


def filter_late(batch_df: DataFrame, watermark_ms: int) -> DataFrame:
    """The rows of a late branch's ``batch_df`` that the aggregation dropped (driver; lazy).

    ``batch_df`` is a static DataFrame holding a late branch's rows for one micro-batch (in
    ``foreachBatch``, after :func:`~sparkonce.outputs.combine.split`); ``watermark_ms`` is
    :func:`batch_watermark_ms` for that batch. Returns the records dropped from at least one
    window, with the branch's columns minus :data:`LATE_COLUMN`, then ``watermark``
    (timestamp), ``windows`` and ``late_windows`` (int). Raises :class:`ConfigError` for a
    DataFrame that is not a late branch, a streaming one, or a non-integer watermark.
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    if not isinstance(batch_df, DataFrame) or not is_late_branch(batch_df.schema):
        raise ConfigError(
            f"filter_late: the DataFrame has no {LATE_COLUMN!r} column of late_records; give "
            "it the rows of the output built by late_records (split back from the batch)"
        )
    if batch_df.isStreaming:
        raise ConfigError(
            "filter_late: the DataFrame is streaming; apply filter_late inside foreachBatch "
            "to the batch's rows, with batch_watermark_ms(checkpoint, batch_id)"
        )
    if isinstance(watermark_ms, bool) or not isinstance(watermark_ms, int):
        raise ConfigError(
            f"filter_late: watermark_ms must be an int (milliseconds), got "
            f"{type(watermark_ms).__name__} {watermark_ms!r}; use batch_watermark_ms()"
        )
    wm_us = F.lit(watermark_ms * 1000).cast("long")
    hidden = F.col(LATE_COLUMN)
    first, last, step = (hidden.getField(name) for name in _FIELDS)
    windows = F.floor((last - first) / step) + 1
    late_windows = F.floor((F.least(last, wm_us) - first) / step) + 1
    columns = [F.col(_quote(c)) for c in batch_df.columns if c != LATE_COLUMN]
    return batch_df.where(first <= wm_us).select(
        *columns,
        F.timestamp_millis(F.lit(watermark_ms).cast("long")).alias(WATERMARK_COLUMN),
        windows.cast("int").alias(WINDOWS_COLUMN),
        late_windows.cast("int").alias(LATE_WINDOWS_COLUMN),
    )


def batch_watermark_ms(
    checkpoint_dir: str | Path, batch_id: int, *, settings: ArrowSettings | None = None
) -> int:
    """The watermark (ms) behind which Spark's aggregation drops records in ``batch_id``.

    That is ``batchWatermarkMs`` of ``<checkpoint_dir>/offsets/<batch_id - 1>`` (the previous
    batch's), and 0 for batch 0. ``checkpoint_dir`` is a local path, or a URL that the active
    Spark session's Hadoop filesystem reaches (or, given ``settings``, pyarrow: the way of a
    Spark Connect server's Python worker, which has no JVM). Call it while batch
    ``batch_id`` runs or later: Spark keeps the previous batch's entry. Raises
    :class:`CheckpointError` when that entry is missing or malformed, :class:`ConfigError`
    for a negative or non-integer ``batch_id``.
    """
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
        raise ConfigError(
            f"batch_watermark_ms: batch_id must be a Spark batch id (int >= 0), got {batch_id!r}"
        )
    if batch_id == 0:
        return 0
    from sparkonce.files import files_for, join, location

    loc = location(checkpoint_dir, "checkpoint")
    path = join(loc, "offsets", str(batch_id - 1))
    try:
        text = files_for(loc, settings=settings).read_text(path)
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be read: {exc}") from exc
    if text is None:
        raise CheckpointError(
            f"{path} is missing: Spark writes the offset log entry of batch {batch_id - 1} "
            f"before batch {batch_id} runs. Check that {checkpoint_dir} is this query's "
            f"checkpoint and that batch {batch_id} belongs to it"
        )
    lines = text.splitlines()
    if len(lines) < 2 or not re.fullmatch(r"v\d+", lines[0].strip()):
        raise CheckpointError(
            f"{path} is not a Spark offset log entry: expected a version line 'v1' and a JSON "
            f"metadata line, found {lines[:2]!r}"
        )
    try:
        meta = json.loads(lines[1])
    except ValueError as exc:
        raise CheckpointError(f"{path}: line 2 is not JSON ({exc}): {lines[1][:200]!r}") from exc
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: line 2 is not a JSON object: {lines[1][:200]!r}")
    value = meta.get("batchWatermarkMs", 0)  # Spark's OffsetSeqMetadata default is 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(
            f"{path}: batchWatermarkMs is {value!r}, not an integer number of milliseconds"
        )
    return value


def _quote(column: str) -> str:
    """``column`` as a quoted identifier, so dots, spaces and backticks stay in the name."""
    return "`" + column.replace("`", "``") + "`"
