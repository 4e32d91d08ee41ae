"""Late records against real Spark streaming queries, checked with Spark's own drop count.

Each streaming test runs ONE query holding the aggregate and the late branch (combined as
the runner will combine them), applies filter_late per batch with batch_watermark_ms, and
compares, batch by batch, with a plain-Python oracle of the documented rule and with
``numRowsDroppedByWatermark`` from the query's progress.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sparkonce.errors import CheckpointError, ConfigError
from sparkonce.outputs.combine import combine, split
from sparkonce.outputs.late import (
    LATE_COLUMN,
    LATE_WINDOWS_COLUMN,
    WATERMARK_COLUMN,
    WINDOWS_COLUMN,
    batch_watermark_ms,
    duration_us,
    filter_late,
    is_late_branch,
    late_records,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

S = 1_000_000  # microseconds in a second
BASE_US = 1_704_067_200 * S  # 2024-01-01T00:00:00Z, a multiple of every window below
DELAY_S = 5

# One file per micro-batch: (record id, event time in seconds after BASE_US, key).
FILES: list[list[tuple[int, float, str]]] = [
    [(1, 105, "a"), (2, 101, "b")],
    # W = 0 here (the previous batch's watermark); with this batch's own watermark (100 s)
    # 4 and 5 would be late.
    [(3, 120, "a"), (4, 95, "a"), (5, 99.999999, "b"), (6, 100, "c")],
    # W = 100 s. 7, 8, 9 are late in ONE group (Spark counts 1); 10 is 1 us before W.
    [
        (7, 95, "a"),
        (8, 96, "a"),
        (9, 97, "a"),
        (10, 99.999999, "d"),
        (11, 100, "e"),
        (12, 105, "f"),
        (13, 110, "g"),
        (14, 114.999, "h"),
        (15, 130, "a"),
        (23, 100.000001, "k"),
    ],
    # W = 115 s (the watermark this batch's own entry holds is 125 s). 22 moves the
    # watermark past every earlier window for the no-data batch that follows.
    [
        (16, 105, "a"),
        (17, 110, "b"),
        (18, 114, "c"),
        (19, 50, "z"),
        (20, 119.999999, "d"),
        (21, 112, "e"),
        (22, 1000, "z"),
    ],
]


@dataclass(frozen=True)
class Shape:
    """The aggregation's grouping: F.window(size, step) or the event time itself (size 0)."""

    size_s: int
    step_s: int

    def ends(self, t_us: int) -> list[int]:
        """End (us) of every window holding event time ``t_us``; the time itself without one."""
        if self.size_s == 0:
            return [t_us]
        size, step = self.size_s * S, self.step_s * S
        start = t_us - t_us % step
        ends = []
        while start + size > t_us:
            ends.append(start + size)
            start -= step
        return sorted(ends)

    def group(self, t_us: int, end: int) -> tuple[int, ...]:
        return (end,) if self.size_s else (t_us,)


SHAPES = {"tumble": Shape(10, 10), "slide": Shape(10, 5), "plain": Shape(0, 0)}


def _us(t: float) -> int:
    return BASE_US + round(t * S)


def _write_files(root: Path, files: list[list[tuple[int, float, str]]]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i, rows in enumerate(files):
        path = root / f"part-{i:03d}.json"
        path.write_text(
            "".join(json.dumps({"id": r, "us": _us(t), "key": k}) + "\n" for r, t, k in rows)
        )
        stamp = 1_700_000_000 + i * 10  # the file source takes files oldest first
        os.utime(path, (stamp, stamp))


def _source(spark: SparkSession, root: Path) -> DataFrame:
    from pyspark.sql import functions as F

    return (
        spark.readStream.schema("id BIGINT, us BIGINT, key STRING")
        .option("maxFilesPerTrigger", 1)
        .json(str(root))
        .select("id", F.timestamp_micros("us").alias("ts"), "key")
        .withWatermark("ts", f"{DELAY_S} seconds")
    )


def _outputs(events: DataFrame, shape_name: str) -> dict[str, DataFrame]:
    from pyspark.sql import functions as F

    shape = SHAPES[shape_name]
    if shape.size_s:
        window, slide = f"{shape.size_s} seconds", f"{shape.step_s} seconds"
        group = F.window("ts", window, slide)
        late = late_records(events, "ts", window=window, slide=slide)
    else:
        group = F.col("ts")
        late = late_records(events, "ts")
    totals = events.groupBy(group.alias("g"), "key").agg(F.count("*").alias("n"))
    return {"totals": totals, "late": late}


@dataclass
class Seen:
    """What the test's foreachBatch saw, per Spark batch id."""

    watermark: dict[int, int]
    late: dict[int, dict[int, tuple[int, int, int, int, str]]]
    # ^ id -> (late_windows, windows, watermark ms, event time us, key)
    totals: dict[int, dict[tuple[tuple[int], str], int]]  # group -> count emitted


def _run(
    spark: SparkSession, tmp_path: Path, shape_name: str, mode: str, fail_batch: int = -1
) -> tuple[Seen, list[dict[str, Any]]]:
    """Run the combined query over tmp_path/in to the end (availableNow); return what
    foreachBatch saw and the progress of each batch. ``fail_batch``: raise there once."""
    outputs = _outputs(_source(spark, tmp_path / "in"), shape_name)
    combined, layout = combine(outputs)
    assert is_late_branch(layout.schemas["late"]) and not is_late_branch(layout.schemas["totals"])
    checkpoint = tmp_path / "checkpoint"
    seen = Seen({}, {}, {})

    def collect(batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        batch.persist()  # one run of the batch's plan for both outputs, as the runner does
        parts = split(batch, layout)
        wm = batch_watermark_ms(checkpoint, batch_id)
        late = filter_late(parts["late"], wm)
        assert late.columns == [
            "id",
            "ts",
            "key",
            WATERMARK_COLUMN,
            WINDOWS_COLUMN,
            LATE_WINDOWS_COLUMN,
        ]
        seen.watermark[batch_id] = wm
        seen.late[batch_id] = {
            r["id"]: (r[LATE_WINDOWS_COLUMN], r[WINDOWS_COLUMN], r["wm"], r["us"], r["key"])
            for r in late.select(
                "*", F.unix_millis(WATERMARK_COLUMN).alias("wm"), F.unix_micros("ts").alias("us")
            ).collect()
        }
        # A group is (window end or event time, in us; key), as the oracle names it.
        end = F.unix_micros(F.col("g.end") if SHAPES[shape_name].size_s else F.col("g"))
        seen.totals[batch_id] = {
            ((r["end"],), r["key"]): r["n"]
            for r in parts["totals"].select(end.alias("end"), "key", "n").collect()
        }
        batch.unpersist()
        if batch_id == fail_batch:
            raise RuntimeError("simulated crash before the batch commits")

    query = (
        combined.writeStream.outputMode(mode)
        .foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the query did not finish within 120 s"
    except Exception as exc:
        if fail_batch < 0 or "simulated crash" not in str(exc):
            raise
    finally:
        query.stop()
    return seen, list(query.recentProgress)


@dataclass
class Expected:
    watermark: list[int]  # W(B) in ms, per batch
    late: list[dict[int, tuple[int, int]]]  # per batch: id -> (late_windows, windows)
    dropped_groups: list[int]  # per batch: Spark's numRowsDroppedByWatermark
    own_watermark_late: list[set[int]]  # per batch: late ids had W been offsets/B's own value
    final: dict[tuple[Any, ...], int]  # aggregate count per group over the run
    open_groups: set[tuple[Any, ...]]  # groups still in state at the end (append)


def _oracle(shape: Shape, batches: list[list[tuple[int, float, str]]]) -> Expected:
    """The documented rule in plain Python: in batch B a record leaves each window whose end
    is <= W(B), the watermark of batch B-1 (max event time of earlier batches - delay)."""
    evict = [0]  # evict[B]: batchWatermarkMs of offsets/<B> (ms)
    latest: int | None = None
    for rows in batches:
        for _, t, _ in rows:
            latest = _us(t) if latest is None else max(latest, _us(t))
        evict.append(
            evict[-1] if latest is None else max(evict[-1], (latest - DELAY_S * S) // 1000)
        )
    exp = Expected([], [], [], [], defaultdict(int), set())
    for b, rows in enumerate(batches):
        wm_us = (evict[b - 1] if b else 0) * 1000
        late, groups, own = {}, set(), set()
        for rid, t, key in rows:
            t_us = _us(t)
            ends = shape.ends(t_us)
            dropped = [e for e in ends if e <= wm_us]
            if dropped:
                late[rid] = (len(dropped), len(ends))
            if any(e <= evict[b] * 1000 for e in ends):
                own.add(rid)
            groups |= {(shape.group(t_us, e), key) for e in dropped}
            for e in ends:
                if e > wm_us:
                    exp.final[(shape.group(t_us, e), key)] += 1
        exp.watermark.append(wm_us // 1000)
        exp.late.append(late)
        exp.dropped_groups.append(len(groups))
        exp.own_watermark_late.append(own)
    last_eviction_us = evict[len(batches) - 1] * 1000  # the last batch's own watermark
    exp.open_groups = {g for g in exp.final if g[0][0] > last_eviction_us}
    return exp


def _batches(progress: list[dict[str, Any]]) -> list[list[tuple[int, float, str]]]:
    """The input of each Spark batch: files in order for data batches, none for no-data ones."""
    files = iter(FILES)
    assert [p["batchId"] for p in progress] == list(range(len(progress)))
    batches = [next(files) if p["numInputRows"] else [] for p in progress]
    # Each branch of the combined query scans the source: Spark counts every scan's rows.
    scans = progress[0]["numInputRows"] // len(FILES[0])
    assert [scans * len(rows) for rows in batches] == [p["numInputRows"] for p in progress]
    assert next(files, None) is None, "every file was read"
    return batches


@pytest.mark.parametrize(
    ("shape_name", "mode"),
    [
        ("tumble", "update"),
        ("slide", "update"),
        # The same rule in append mode and without a window: make test-campaign (CI's time).
        pytest.param("tumble", "append", marks=pytest.mark.campaign_lane),
        pytest.param("plain", "append", marks=pytest.mark.campaign_lane),
    ],
)
def test_late_rows_are_exactly_what_spark_drops(
    spark: SparkSession, tmp_path: Path, shape_name: str, mode: str
) -> None:
    shape = SHAPES[shape_name]
    _write_files(tmp_path / "in", FILES)
    seen, progress = _run(spark, tmp_path, shape_name, mode)
    batches = _batches(progress)
    exp = _oracle(shape, batches)

    dropped = [p["stateOperators"][0]["numRowsDroppedByWatermark"] for p in progress]
    assert dropped == exp.dropped_groups
    # Spark's count is the number of groups the late output's records were dropped from
    # (a record leaves its earliest late_windows windows).
    for b in range(len(progress)):
        groups = {
            (shape.group(us, end), key)
            for n, _, _, us, key in seen.late[b].values()
            for end in shape.ends(us)[:n]
        }
        assert len(groups) == dropped[b], f"batch {b}"
    assert [seen.watermark[b] for b in range(len(progress))] == exp.watermark
    for b in range(len(progress)):
        got = {rid: v[:2] for rid, v in seen.late[b].items()}
        assert got == exp.late[b], f"batch {b}"
        assert {v[2] for v in seen.late[b].values()} <= {exp.watermark[b]}

    # The aggregate holds the rest: final count per group (update: last value emitted).
    final: dict[tuple[Any, ...], int] = {}
    for b in range(len(progress)):
        final.update(seen.totals[b])
    expected_final = {
        g: n for g, n in exp.final.items() if mode == "update" or g not in exp.open_groups
    }
    assert final == expected_final
    # Every (record, window) pair is either counted in the aggregate or late; for a tumbling
    # window or none, aggregate + late records == input records.
    late_pairs = sum(v[0] for rows in seen.late.values() for v in rows.values())
    open_pairs = (
        sum(n for g, n in exp.final.items() if g in exp.open_groups) if mode == "append" else 0
    )
    records = [r for rows in FILES for r in rows]
    assert sum(final.values()) + late_pairs + open_pairs == sum(
        len(shape.ends(_us(t))) for _, t, _ in records
    )
    if shape.size_s == shape.step_s or not shape.size_s:
        late_records_total = sum(len(rows) for rows in seen.late.values())
        assert sum(final.values()) + late_records_total + open_pairs == len(records)

    # The data tells the candidate rules apart: the batch's own watermark would differ;
    # Spark counts late groups, not records; a sliding record can be partly late.
    assert any(set(exp.late[b]) != exp.own_watermark_late[b] for b in range(len(batches)))
    at_or_behind = [
        (rid in exp.late[b], _us(t) == exp.watermark[b] * 1000)
        for b, rows in enumerate(batches)
        for rid, t, _ in rows
        if _us(t) <= exp.watermark[b] * 1000
    ]
    if shape.size_s:  # the window's end decides: an event at or behind W may still count
        assert (False, True) in at_or_behind
    else:  # the event time decides, and an event time equal to W is late
        assert (True, True) in at_or_behind and all(late for late, _ in at_or_behind)
    late_counts = [v for rows in exp.late for v in rows.values()]
    if shape_name == "tumble":
        assert len(late_counts) > sum(exp.dropped_groups) > 0
    if shape_name == "slide":
        assert {(1, 2), (2, 2)} <= set(late_counts)
    assert sum(exp.dropped_groups) > 0


def test_oracle_sliding_expectations() -> None:
    """The oracle's sliding expectations on FILES, spelled out: 7 is dropped from one of its
    two windows in batch 2; 16 from both in batch 3; 20 from none."""
    exp = _oracle(SHAPES["slide"], FILES)
    assert exp.late[2][7] == (1, 2) and exp.late[3][16] == (2, 2) and 20 not in exp.late[3]
    assert exp.watermark == [
        0,
        0,
        100_000 + BASE_US // 1000,
        115_000 + BASE_US // 1000,
    ]


@pytest.mark.crash_lane  # a failed batch and a restart: slow, and in the crash lane
def test_replayed_batch_gives_the_same_late_records(spark: SparkSession, tmp_path: Path) -> None:
    """A batch that fails before it commits runs again after a restart: the same W(B) and the
    same late records, and Spark drops the same groups."""
    _write_files(tmp_path / "in", FILES)
    first, _ = _run(spark, tmp_path, "tumble", "update", fail_batch=3)
    again, progress = _run(spark, tmp_path, "tumble", "update")
    assert progress[0]["batchId"] == 3
    assert again.watermark[3] == first.watermark[3] == BASE_US // 1000 + 115_000
    assert again.late[3] == first.late[3] and sorted(again.late[3]) == [16, 19]
    assert progress[0]["stateOperators"][0]["numRowsDroppedByWatermark"] == 2


# -- windows without streaming -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "slide", "start"),
    [
        ("10 seconds", None, None),
        ("10 seconds", "3 seconds", "-1 second"),
        ("interval 1 minute", "1500 milliseconds", "0.25 seconds"),
    ],
)
def test_windows_match_spark_window(
    spark: SparkSession, window: str, slide: str | None, start: str | None
) -> None:
    """windows / late_windows agree with Spark's own F.window expansion of the same events,
    before 1970 and on window boundaries included."""
    from pyspark.sql import functions as F

    times = [-7_000_001, -1, 0, 1, 999_999, 3_000_000, 9_999_999, 10_000_000, 61_250_000]
    events = spark.createDataFrame([(i, t) for i, t in enumerate(times)], "id INT, us BIGINT")
    events = events.select("id", F.timestamp_micros("us").alias("ts"))
    expanded = events.select(
        "id", F.unix_micros(F.window("ts", window, slide, start).end).alias("e")
    )
    ends: dict[int, list[int]] = defaultdict(list)
    for r in expanded.collect():
        ends[r["id"]].append(r["e"])
    branch = late_records(events, "ts", window=window, slide=slide, start_time=start)
    watermarks = (-1, 0, 10_000, 70_000)
    late = filter_late(branch, watermarks[0]).withColumn("W", F.lit(watermarks[0]))
    for wm_ms in watermarks[1:]:  # one Spark job for every watermark
        late = late.unionByName(filter_late(branch, wm_ms).withColumn("W", F.lit(wm_ms)))
    got: dict[int, dict[int, tuple[int, int]]] = defaultdict(dict)
    for r in late.collect():
        got[r["W"]][r["id"]] = (r[LATE_WINDOWS_COLUMN], r[WINDOWS_COLUMN])
    for wm_ms in watermarks:
        expected = {
            i: (sum(e <= wm_ms * 1000 for e in es), len(es))
            for i, es in ends.items()
            if any(e <= wm_ms * 1000 for e in es)
        }
        assert got.get(wm_ms, {}) == expected, f"watermark {wm_ms} ms"
    assert sorted(ends) == list(range(len(times)))  # every event is in some window


def test_static_branch_keeps_columns(spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    df = spark.createDataFrame(
        [(1, "x y", 5_000_000), (2, None, None)], "id INT, `a b` STRING, us BIGINT"
    )
    df = df.select("id", "`a b`", F.timestamp_micros("us").alias("ts"))
    branch = late_records(df, "ts")
    assert branch.columns == ["id", "a b", "ts", LATE_COLUMN] and is_late_branch(branch.schema)
    rows = filter_late(branch, 5_000).collect()  # ts == watermark is late; NULL time is not
    assert [(r["id"], r["a b"], r[WINDOWS_COLUMN], r[LATE_WINDOWS_COLUMN]) for r in rows] == [
        (1, "x y", 1, 1)
    ]
    assert filter_late(branch, 4_999).count() == 0


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("10 seconds", 10 * S),
        ("1 second", S),
        ("interval 1 hour 30 minutes", 5400 * S),
        ("1.5 seconds", 1_500_000),
        ("2 weeks", 14 * 86_400 * S),
        ("-1 second", -S),
        ("250 milliseconds 7 microseconds", 250_007),
    ],
)
def test_duration_us(text: str, micros: int) -> None:
    assert duration_us(text) == micros


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10", "'<number> <unit>' pairs"),
        ("", "'<number> <unit>' pairs"),
        ("ten seconds", "'ten' 'seconds' is not"),
        ("10 fortnights", "'10' 'fortnights' is not"),
        ("1 month", "months or years"),
        ("1.5 minutes", "only seconds may have a fraction"),
        (10, "must be a string"),
    ],
)
def test_bad_durations(text: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        duration_us(text, "window")


def test_late_records_refuses_bad_input(spark: SparkSession, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    (tmp_path / "in").mkdir()
    raw = spark.readStream.schema("id BIGINT, us BIGINT").json(str(tmp_path / "in"))
    stream = raw.select("id", "us", F.timestamp_micros("us").alias("ts"))
    with pytest.raises(ConfigError, match=r"'when' is not a column.*\['id', 'us', 'ts'\]"):
        late_records(stream.withWatermark("ts", "5 seconds"), "when")
    with pytest.raises(ConfigError, match="'us' is bigint, not timestamp"):
        late_records(stream, "us")
    with pytest.raises(ConfigError, match=r"no watermark on 'ts'; call df.withWatermark"):
        late_records(stream, "ts")
    other = stream.withColumn("ts2", F.col("ts")).withWatermark("ts2", "1 second")
    with pytest.raises(ConfigError, match=r"no watermark on 'ts' \(it is on \['ts2'\]\)"):
        late_records(other, "ts")
    marked = stream.withWatermark("ts", "5 seconds")
    with pytest.raises(ConfigError, match="column 'Watermark'"):
        late_records(marked.withColumn("Watermark", F.lit(1)), "ts")
    with pytest.raises(ConfigError, match="give window too"):
        late_records(marked, "ts", slide="5 seconds")
    with pytest.raises(ConfigError, match="slide '20 seconds' is longer than window"):
        late_records(marked, "ts", window="10 seconds", slide="20 seconds")
    with pytest.raises(ConfigError, match="start_time '5 seconds' must be shorter than the slide"):
        late_records(marked, "ts", window="10 seconds", slide="5 seconds", start_time="5 seconds")
    with pytest.raises(ConfigError, match=r"window '0 seconds'.*must be positive"):
        late_records(marked, "ts", window="0 seconds")
    with pytest.raises(ConfigError, match="window '10 secs'"):
        late_records(marked, "ts", window="10 secs")
    with pytest.raises(ConfigError, match="takes a pyspark DataFrame"):
        late_records("events", "ts")  # type: ignore[arg-type]
    # The streaming branch itself is fine, and is a late branch.
    assert late_records(marked, "ts", window="10 seconds").isStreaming


def test_filter_late_refuses_bad_input(spark: SparkSession, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    df = spark.range(1).select(F.timestamp_micros("id").alias("ts"))
    with pytest.raises(ConfigError, match=f"no '{LATE_COLUMN}' column"):
        filter_late(df, 0)
    branch = late_records(df, "ts")
    with pytest.raises(ConfigError, match=r"must be an int.*float 1\.5"):
        filter_late(branch, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"must be an int.*bool True"):
        filter_late(branch, True)
    (tmp_path / "in").mkdir()
    stream = spark.readStream.schema("us BIGINT").json(str(tmp_path / "in"))
    stream = stream.select(F.timestamp_micros("us").alias("ts")).withWatermark("ts", "1 second")
    with pytest.raises(ConfigError, match="is streaming; apply filter_late inside foreachBatch"):
        filter_late(late_records(stream, "ts"), 0)
    # A look-alike column of another type is no late branch.
    fake = df.select("ts", F.struct(F.lit("x").alias("first_end_us")).alias(LATE_COLUMN))
    assert not is_late_branch(fake.schema)
    with pytest.raises(ConfigError, match="no '_sparkonce_late' column of late_records"):
        filter_late(fake, 0)


def _offsets(root: Path, batch: int, text: str) -> None:
    (root / "offsets").mkdir(parents=True, exist_ok=True)
    (root / "offsets" / str(batch)).write_text(text)


def test_batch_watermark_ms_reads_the_previous_entry(tmp_path: Path) -> None:
    assert batch_watermark_ms(tmp_path / "nowhere", 0) == 0
    _offsets(
        tmp_path,
        4,
        'v1\n{"batchWatermarkMs":1234,"batchTimestampMs":9,"conf":{}}\n{"logOffset":4}\n',
    )
    _offsets(
        tmp_path,
        5,
        'v1\n{"batchWatermarkMs":9999,"batchTimestampMs":9,"conf":{}}\n{"logOffset":5}\n',
    )
    assert batch_watermark_ms(tmp_path, 5) == 1234
    assert batch_watermark_ms(str(tmp_path), 6) == 9999
    _offsets(tmp_path, 6, 'v1\n{"batchTimestampMs":9}\n')
    assert batch_watermark_ms(tmp_path, 7) == 0  # Spark's own default for a missing value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is not a Spark offset log entry"),
        ('{"batchWatermarkMs":1}\n', "is not a Spark offset log entry"),
        ("v1\nnot json\n", "line 2 is not JSON"),
        ("v1\n[1, 2]\n", "line 2 is not a JSON object"),
        ('v1\n{"batchWatermarkMs":"12"}\n', "batchWatermarkMs is '12', not an integer"),
        ('v1\n{"batchWatermarkMs":1.5}\n', "batchWatermarkMs is 1.5, not an integer"),
    ],
)
def test_batch_watermark_ms_malformed(tmp_path: Path, text: str, message: str) -> None:
    _offsets(tmp_path, 2, text)
    with pytest.raises(CheckpointError, match=message):
        batch_watermark_ms(tmp_path, 3)


def test_batch_watermark_ms_missing_entry_and_bad_id(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"offsets/2 is missing.*batch 3"):
        batch_watermark_ms(tmp_path, 3)
    for bad in (-1, True, "3"):
        with pytest.raises(ConfigError, match="batch_id must be a Spark batch id"):
            batch_watermark_ms(tmp_path, bad)  # type: ignore[arg-type]
