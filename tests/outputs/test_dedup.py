"""dedupe against real Spark streaming queries over the embedded log.

Every streaming test here writes its records to the embedded log first (one partition, so a
micro-batch's rows meet the dedup operator in offset order), runs ``dedupe`` in a real query
and compares, batch by batch, with :func:`_oracle`: the documented rule written again in
plain Python from the generated records alone (never from the code under test), and with
Spark's own counters from the query's progress (``numDroppedDuplicateRows``,
``numRowsDroppedByWatermark``, ``numRowsTotal`` of the ``dedupeWithinWatermark`` operator)
and the observed metric that counts records without an id.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sparkonce import CheckpointLostError, ConfigError, EmbeddedLogSource, Pipeline, SQLiteSink
from sparkonce.log import IdempotentProducer, Topic
from sparkonce.outputs import DedupCounts, dedup_counts, dedupe
from sparkonce.outputs.late import late_records

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.listener import StreamingQueryProgress

pytestmark = pytest.mark.spark

BASE_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
WITHIN_S = 10
WITHIN_MS = WITHIN_S * 1000


@dataclass(frozen=True)
class Rec:
    """One log record: ``n`` its serial number (= its offset), ``id`` the application's
    record id (None: the client sent none), ``t`` its event time in ms after BASE_MS (None:
    the record has none)."""

    n: int
    id: str | None
    t: int | None


# -- the oracle: the documented rule in plain Python ------------------------------------------


@dataclass
class Batch:
    """What the oracle expects of one Spark micro-batch."""

    kept: set[int] = field(default_factory=set)  # serial numbers of the records it outputs
    duplicates: int = 0  # removed as a copy of an id in the state
    late: set[int] = field(default_factory=set)  # dropped: event time <= the watermark
    nulls: int = 0  # records without an id (all pass)
    state: int = 0  # ids in the state at the end of the batch
    watermark: int = 0  # W(B), ms after BASE_MS (or below 0: before any data)


def _oracle(batches: list[list[Rec]], within_ms: int = WITHIN_MS) -> list[Batch]:
    """Per Spark batch (its records; [] for a no-data batch): what dedupe must do.

    own[B], the watermark in the offset log entry of batch B, is the greatest event time of
    the batches before B minus ``within`` (never going back; 0 before any data). In batch B
    a record is late when its time is <= own[B-1]; else it is a duplicate when its id is in
    the state (kept earlier, ``kept time + within`` still past the watermark); else it is
    kept, and its id stays until ``own[B] >= kept time + within`` at the end of a batch.
    A NULL event time is never late, and Spark takes it as 1970 for the expiry.
    """
    epoch = -BASE_MS  # Spark's watermark starts at 0 (1970), far below every event here
    own: list[int] = []
    latest: int | None = None
    for rows in batches:
        previous = own[-1] if own else epoch
        own.append(previous if latest is None else max(previous, latest - within_ms))
        for r in rows:
            if r.t is not None:
                latest = r.t if latest is None else max(latest, r.t)
    state: dict[str, int] = {}  # id -> expiry (ms)
    out = []
    for b, rows in enumerate(batches):
        exp = Batch(watermark=own[b - 1] if b else epoch)
        for r in rows:
            if r.id is None:
                exp.nulls += 1
                exp.kept.add(r.n)
            elif r.t is not None and r.t <= exp.watermark:
                exp.late.add(r.n)
            elif r.id in state:
                exp.duplicates += 1
            else:
                state[r.id] = (epoch if r.t is None else r.t) + within_ms
                exp.kept.add(r.n)
        state = {i: expiry for i, expiry in state.items() if expiry > own[b]}
        exp.state = len(state)
        out.append(exp)
    return out


# -- the records ------------------------------------------------------------------------------

CHUNK = 10  # records per micro-batch (max_records_per_partition on the one partition)


def _named_chunks() -> list[list[tuple[str | None, float | None]]]:
    """Hand-written micro-batches, each case named; seconds after BASE (None: no event
    time). The oracle's verdict on each is asserted in test_oracle_names_each_case."""
    return [
        # W = 0. 'a' twice in one batch: the first copy is kept. Two NULL ids: both pass.
        [("a", 100), ("b", 100), ("a", 100), (None, 100), (None, 100), ("c", 95)],
        # W = 0 (offsets/0). 'a' 5 s later: a duplicate. 'b' 11 s later, beyond the bound,
        # but b is still in the state (evicted only once the watermark reaches 110): removed.
        # 'x' has no event time: kept, and forgotten at the end of the batch (1970 + 10 s).
        [("a", 105), ("b", 111), ("d", 120), ("x", None)],
        # W = 90 (offsets/1: 100 - 10). 'c' exactly at the watermark: late (its id is even
        # in the state). 'e' 1 ms after it: kept. 'a' again: a duplicate. 'x' without an
        # event time is not late: kept again, and its copy in this batch removed.
        [("c", 90), ("e", 90.001), ("a", 101), ("x", None), ("x", None)],
        # W = 110 (offsets/2: 120 - 10); a, b (110) and c, e left the state at the end of the
        # last batch. 'a' 12 s after its kept copy: passes through as a new record. 'b' at
        # 110 is behind the watermark: late. A NULL id behind the watermark still passes.
        [("a", 112), ("b", 110), (None, 50), ("f", 110.001), ("f", 110.001), ("x", None)],
    ]


def _steady_chunks(
    count: int, seed: int, start_s: float
) -> list[list[tuple[str | None, float | None]]]:
    """Steady traffic: event time moves 5 s per batch; each batch has new ids, exact re-sends
    (same event time), re-sends 3 to 30 s later, stragglers and a few NULL ids.
    NULL ids stop after the first half, so the state must also shrink without them."""
    rng = random.Random(seed)
    sent: list[tuple[str, float]] = []
    chunks = []
    for k in range(count):
        base = start_s + 5 * k
        rows: list[tuple[str | None, float | None]] = []
        for i in range(5):
            rid, t = f"s{k}-{i}", base + rng.randrange(5000) / 1000
            rows.append((rid, t))
            sent.append((rid, t))
        old = sent[max(0, len(sent) - 40) : max(1, len(sent) - 10)]  # 2 to 7 batches back
        for _ in range(2):
            rid, t = rng.choice(old)
            rows.append((rid, t))  # re-sent with its original event time
        # Re-sent with a later event time (3 to 30 s), never past this batch's own times.
        delay = rng.choice([3, 9, 20, 25, 30])
        later = [(rid, t) for rid, t in old if t + delay <= base + 5]
        if later:
            rid, t = rng.choice(later)
            rows.append((rid, t + delay))
        else:
            rows.append((f"n{k}", base + 1))
        rows.append((f"late{k}", base - 30))  # a straggler, behind the watermark
        rows.append((None, base) if k < count // 2 else (f"x{k}", base + 1))
        chunks.append(rows)
    return chunks


def _ms(t: float | None) -> int | None:
    return None if t is None else round(t * 1000)


def _write(
    root: Path, chunks: list[list[tuple[str | None, float | None]]], chunk: int
) -> list[Rec]:
    """Append the chunks to topic 'events' (one partition), each padded to ``chunk`` records
    with unique filler ids at the chunk's latest time; returns the records in offset order.
    The log's timestamp is the event time; a record without one says so in its value."""
    topic = Topic.create(root, "events", 1, exist_ok=True)
    records: list[Rec] = []
    with topic, IdempotentProducer(topic, "test-producer") as producer:
        for k, rows in enumerate(chunks):
            assert len(rows) <= chunk
            top = max(t for _, t in rows if t is not None)
            padded = rows + [(f"pad{k}-{i}", top) for i in range(chunk - len(rows))]
            for rid, t in padded:
                rec = Rec(len(records), rid, _ms(t))
                value = json.dumps({"id": rid, "n": rec.n, "timed": t is not None}).encode()
                ts_us = (BASE_MS + (rec.t or 0)) * 1000
                producer.send(value, partition=0, timestamp_us=ts_us)
                records.append(rec)
    return records


def _events(df: DataFrame) -> DataFrame:
    """The application's records: id (NULL when the client sent none), serial, event time
    (NULL when the record has none)."""
    from pyspark.sql import functions as F

    value = F.col("value").cast("string")
    timed = F.get_json_object(value, "$.timed") == F.lit("true")
    return df.select(
        F.get_json_object(value, "$.id").alias("id"),
        F.get_json_object(value, "$.n").cast("int").alias("n"),
        F.when(timed, F.col("timestamp")).alias("ts"),
    )


# -- one query over named cases and steady traffic (shared by the tests below) ----------------


@dataclass
class Run:
    records: list[Rec]
    kept: dict[int, set[int]]  # Spark batch id -> serial numbers output
    progress: list[StreamingQueryProgress]
    batches: list[list[Rec]]  # the records of each Spark batch
    expected: list[Batch]


@pytest.fixture(scope="module")
def steady_run(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("dedup-steady")
    chunks = _named_chunks() + _steady_chunks(12, seed=18, start_s=125)
    records = _write(root / "log", chunks, CHUNK)
    stream = EmbeddedLogSource(root / "log", "events", max_records_per_partition=CHUNK)
    deduped = dedupe(
        _events(stream.stream(spark, None)), "id", within="10 seconds", event_time="ts"
    )
    assert deduped.columns == ["id", "n", "ts"]
    kept: dict[int, set[int]] = {}

    def collect(batch: DataFrame, batch_id: int) -> None:
        rows = [r.n for r in batch.collect()]
        assert len(rows) == len(set(rows))
        kept[batch_id] = set(rows)

    query = (
        deduped.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(root / "checkpoint"))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180), "the query did not finish within 180 s"
    finally:
        query.stop()
    progress = list(query.recentProgress)
    assert [p["batchId"] for p in progress] == list(range(len(progress)))
    # Data batches come in offset order. The records with and without an id share one read of
    # the source (one shuffle, reused), so Spark counts each input record once.
    pending = iter(range(0, len(records), CHUNK))
    batches = []
    for p in progress:
        assert p["numInputRows"] in (0, CHUNK), p["numInputRows"]
        start = next(pending) if p["numInputRows"] else None
        batches.append([] if start is None else records[start : start + CHUNK])
    assert next(pending, None) is None, "every record was read"
    return Run(records, kept, progress, batches, _oracle(batches))


def _operator(progress: dict[str, Any]) -> dict[str, Any]:
    (op,) = [o for o in progress["stateOperators"] if o["operatorName"] == "dedupeWithinWatermark"]
    return op


def named_cases_pipeline(
    tmp_path: Path, checkpoint: Path
) -> tuple[Pipeline, list[list[Rec]], list[Batch]]:
    """The named dedup cases in a log under ``tmp_path``, six records a batch, and a pipeline
    that dedupes them by id within 10 s of event time into ``events`` and sends the late
    ones to ``late`` (both in ``tmp_path/out.db``); with the batches and the plain-Python
    oracle's expectation per batch."""
    from pyspark.sql import functions as F

    records = _write(tmp_path / "log", _named_chunks(), 6)
    batches = [records[i : i + 6] for i in range(0, len(records), 6)]

    def transform(df: DataFrame) -> dict[str, DataFrame]:
        events = _events(df).withWatermark("ts", "10 seconds")
        return {
            "events": dedupe(events, "id", within="10 seconds", event_time="ts"),
            "late": late_records(events.where(F.col("id").isNotNull()), "ts"),
        }

    store = f"sqlite:///{tmp_path / 'out.db'}"
    pipeline = Pipeline(
        name="dedup",
        source=EmbeddedLogSource(tmp_path / "log", "events", max_records_per_partition=6),
        transform=transform,
        outputs={"events": SQLiteSink(store, "events"), "late": SQLiteSink(store, "late")},
        checkpoint=checkpoint,
        output_mode="append",
    )
    return pipeline, batches, _oracle(batches)


def test_oracle_names_each_case() -> None:
    """The oracle's verdict on the hand-written cases, as the docstring of dedupe states it
    (so a wrong oracle cannot agree with wrong code)."""
    records: list[Rec] = []
    for chunk in _named_chunks():
        for rid, t in chunk:
            records.append(Rec(len(records), rid, _ms(t)))
    cut = [0, 6, 10, 15, 21]
    batches = [records[a:b] for a, b in itertools.pairwise(cut)]
    exp = _oracle(batches)
    verdict: dict[tuple[int, str | None, float | None], str] = {}
    for b, rows in enumerate(batches):
        for r in rows:
            kind = "kept" if r.n in exp[b].kept else "late" if r.n in exp[b].late else "dup"
            verdict[(b, r.id, r.t)] = verdict.get((b, r.id, r.t), "") + kind
    assert verdict == {
        (0, "a", 100_000): "keptdup",  # the first copy in the batch is kept
        (0, "b", 100_000): "kept",
        (0, None, 100_000): "keptkept",  # NULL ids are never duplicates of each other
        (0, "c", 95_000): "kept",
        (1, "a", 105_000): "dup",
        (1, "b", 111_000): "dup",  # beyond the bound, but still in the state
        (1, "d", 120_000): "kept",
        (1, "x", None): "kept",  # no event time: never late
        (2, "x", None): "keptdup",  # its id was forgotten at the end of the batch before
        (2, "c", 90_000): "late",  # exactly at the watermark
        (2, "e", 90_001): "kept",
        (2, "a", 101_000): "dup",
        (3, "a", 112_000): "kept",  # re-sent after its id left the state: a new record
        (3, "b", 110_000): "late",
        (3, None, 50_000): "kept",  # behind the watermark, but without an id: passes
        (3, "f", 110_001): "keptdup",
        (3, "x", None): "kept",
    }
    assert [e.watermark for e in exp] == [-BASE_MS, -BASE_MS, 90_000, 110_000]
    assert [e.state for e in exp] == [3, 4, 1, 3]  # a b c | +d | +e, then only d | +a f


def test_output_matches_the_oracle_batch_by_batch(steady_run: Run) -> None:
    run = steady_run
    for b, (p, exp) in enumerate(zip(run.progress, run.expected, strict=True)):
        op = _operator(p)
        assert run.kept.get(b, set()) == exp.kept, f"batch {b}"
        assert op["customMetrics"]["numDroppedDuplicateRows"] == exp.duplicates, f"batch {b}"
        assert op["numRowsDroppedByWatermark"] == len(exp.late), f"batch {b}"
        assert op["numRowsTotal"] == exp.state, f"batch {b}"
        assert p["observedMetrics"]["sparkonce_dedup"]["null_ids"] == exp.nulls, f"batch {b}"
        assert dedup_counts(p) == DedupCounts(
            b, exp.nulls, exp.duplicates, len(exp.late), exp.state
        )
    # Every record is kept, removed as a duplicate or dropped as late, exactly once.
    kept = sum(len(e.kept) for e in run.expected)
    assert kept + sum(e.duplicates + len(e.late) for e in run.expected) == len(run.records)
    assert sorted(n for ns in run.kept.values() for n in ns) == sorted(
        n for e in run.expected for n in e.kept
    )


def test_each_case_occurs_in_the_run(steady_run: Run) -> None:
    """The data exercises every branch of the rule, and what the bound promises holds: a
    copy at most `within` after the kept one never passes; some later copies do."""
    run = steady_run
    exp = run.expected
    assert sum(e.duplicates for e in exp) >= 20
    assert sum(len(e.late) for e in exp) >= 12
    assert sum(e.nulls for e in exp) >= 8
    kept_at: dict[str, list[int]] = {}  # id -> event times of its kept copies
    for rows, e in zip(run.batches, exp, strict=True):
        for r in rows:
            if r.id is not None and r.t is not None and r.n in e.kept:
                kept_at.setdefault(r.id, []).append(r.t)
    again = {i: ts for i, ts in kept_at.items() if len(ts) > 1}
    assert again, "no copy after the bound passed through"
    for ts in again.values():
        assert all(b - a > WITHIN_MS for a, b in itertools.pairwise(ts)), ts


def test_state_stays_flat_as_input_grows(steady_run: Run) -> None:
    """numRowsTotal of the dedup operator (checked equal to the oracle's above) stays
    bounded by the window while the ids seen grow with every batch: without collection by
    the watermark it would hold every id seen."""
    run = steady_run
    data = [b for b, p in enumerate(run.progress) if p["numInputRows"]]
    assert len(data) == 16
    totals = [_operator(run.progress[b])["numRowsTotal"] for b in data]
    seen: list[int] = []
    ids: set[str] = set()
    for b in data:
        ids |= {r.id for r in run.batches[b] if r.id is not None}
        seen.append(len(ids))
    # The state holds the ids kept in the last 2 * within of event time plus one batch
    # (the watermark lags a batch): 25 s at 5 s and about 6.5 kept ids a batch, ~33.
    steady = totals[4:]
    assert max(steady) <= 40, totals
    assert all(b - a >= 5 for a, b in itertools.pairwise(seen)), seen  # input keeps growing
    assert seen[-1] >= 3 * max(steady), (seen, totals)
    half = len(steady) // 2
    assert max(steady[half:]) <= max(steady[:half]) + 4, totals  # flat, not growing


# -- restart from the checkpoint, and a replayed batch -----------------------------------------


def _record_log(root: Path, rows: Sequence[tuple[str, float]]) -> None:
    """Append records with the producer's own record ids (the log's record_id column)."""
    topic = Topic.create(root, "events", 1, exist_ok=True)
    with topic, IdempotentProducer(topic, "collector") as producer:
        for rid, t in rows:
            ts = (BASE_MS + round(t * 1000)) * 1000
            producer.send(rid.encode(), partition=0, record_id=rid, timestamp_us=ts)


def _run_record_ids(
    spark: SparkSession, log: Path, checkpoint: Path, *, fail_first: bool = False, start: int = 0
) -> list[str]:
    """One availableNow run of dedupe on the log's record_id; the values it output, in
    order. ``fail_first``: the first batch fails after its rows were read (before Spark
    records it as done), as a crash before the commit would."""
    stream = EmbeddedLogSource(log, "events", starting_offsets=json.dumps({"0": start})).stream(
        spark, None
    )
    deduped = dedupe(stream, within="10 seconds", event_time="timestamp")
    out: list[str] = []
    failed: list[int] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        rows = sorted(r.value.decode() for r in batch.select("value").collect())
        if fail_first and not failed:
            failed.append(batch_id)
            raise RuntimeError("simulated crash before the batch commits")
        out.extend(rows)

    query = (
        deduped.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120)
    except Exception as exc:
        if not failed or "simulated crash" not in str(exc):
            raise
    finally:
        query.stop()
    return out


def test_restart_keeps_the_seen_ids(spark: SparkSession, tmp_path: Path) -> None:
    """Ids seen before a restart are still removed after it (the state came back from the
    checkpoint), and a batch replayed after a failure is not taken for its own duplicates
    (it runs against the state from before it)."""
    log, checkpoint = tmp_path / "log", tmp_path / "checkpoint"
    first = [(f"r{i}", 100 + i) for i in range(6)]
    _record_log(log, first)
    assert _run_record_ids(spark, log, checkpoint) == [r for r, _ in first]

    # The producer restarts and re-sends r2..r5 (2 s later, within the bound), then sends
    # new records; the first run after that fails once, mid-batch.
    resent = [(f"r{i}", 102 + i) for i in range(2, 6)]
    new = [(f"s{i}", 108) for i in range(3)]
    _record_log(log, resent + new)
    assert _run_record_ids(spark, log, checkpoint, fail_first=True) == []
    assert _run_record_ids(spark, log, checkpoint) == ["s0", "s1", "s2"]

    # Control: the same records without the checkpoint's state pass through.
    fresh = _run_record_ids(spark, log, tmp_path / "fresh", start=len(first))
    assert fresh == sorted(r for r, _ in resent + new)


# -- through Pipeline.run: counts in the report, late records routed, lost checkpoint ---------


def test_pipeline_reports_counts_routes_late_and_refuses_a_lost_checkpoint(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    pipeline, batches, expected = named_cases_pipeline(tmp_path, tmp_path / "checkpoint")
    caplog.set_level(logging.INFO, logger="sparkonce.run")
    report = pipeline.run(spark, timeout=300)

    import sqlite3

    with sqlite3.connect(tmp_path / "out.db") as conn:
        kept = sorted(n for (n,) in conn.execute("SELECT n FROM events"))
        late = sorted(n for (n,) in conn.execute("SELECT n FROM late"))
    assert kept == sorted(n for e in expected for n in e.kept)
    assert late == sorted(n for e in expected for n in e.late)
    data = [b.spark_batch_id for b in report.batches if b.ranges.count]
    assert data == list(range(len(batches)))
    for b, exp in zip(data, expected, strict=True):
        assert report.dedup[b] == DedupCounts(
            b, exp.nulls, exp.duplicates, len(exp.late), exp.state
        ), f"batch {b}"
    exp = expected[2]
    line = (
        f"pipeline dedup batch 2: dedup removed {exp.duplicates} duplicates, dropped "
        f"{len(exp.late)} late records, passed {exp.nulls} records without an id; "
        f"{exp.state} ids in the state"
    )
    assert line in caplog.messages, caplog.messages

    # A lost checkpoint: the ids seen are gone with it, so the run is refused.
    shutil.rmtree(tmp_path / "checkpoint")
    with pytest.raises(CheckpointLostError, match="restore the checkpoint directory") as err:
        pipeline.run(spark, timeout=300)
    assert "kept state in Spark's checkpoint" in str(err.value)
    assert "deduplication" in str(err.value)


# -- bad input, refused on the driver -----------------------------------------------------------


@pytest.fixture(scope="module")
def stream(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataFrame]:
    root = tmp_path_factory.mktemp("dedup-bad") / "log"
    Topic.create(root, "events", 1).close()
    yield EmbeddedLogSource(root, "events").stream(spark, None)


@pytest.mark.parametrize(
    ("change", "kwargs", "message"),
    [
        (None, {"id_column": "rid"}, "id column 'rid' is not a column"),
        (None, {"id_column": "Record_ID"}, "did you mean 'record_id'"),
        (None, {"id_column": "offset", "event_time": "ts"}, "event time column 'ts' is not"),
        ("CAST(offset AS DOUBLE) AS d", {"id_column": "d"}, "id column 'd' is double"),
        ("map('k', value) AS m", {"id_column": "m"}, "id column 'm' is map<string,binary>"),
        ("CAST(offset AS STRING) AS s", {"event_time": "s"}, "is string, not timestamp"),
        ("CAST(timestamp AS TIMESTAMP_NTZ) AS t", {"event_time": "t"}, "is timestamp_ntz"),
        (None, {"within": "10 parsecs"}, "not '<number> <unit>'"),
        (None, {"within": "ten minutes"}, "not '<number> <unit>'"),
        (None, {"within": ""}, "is not a duration"),
        (None, {"within": 600}, "within must be a duration string like '10 minutes'"),
        (None, {"within": "1 month"}, "months or years"),
        (None, {"within": "0 seconds"}, "must be a positive duration"),
        (None, {"within": "-5 seconds"}, "must be a positive duration"),
        (None, {"within": "1.0005 seconds"}, "not a whole number of milliseconds"),
        (None, {"name": "two words"}, "name must be letters, digits and underscores"),
    ],
)
def test_bad_input_is_refused_before_the_query(
    stream: DataFrame, change: str | None, kwargs: dict[str, Any], message: str
) -> None:
    df = stream if change is None else stream.selectExpr("*", change)
    args: dict[str, Any] = {
        "id_column": "record_id",
        "within": "10 minutes",
        "event_time": "timestamp",
    }
    args.update(kwargs)
    with pytest.raises(ConfigError, match=_escaped(message)):
        dedupe(df, **args)


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_watermarks_already_on_the_dataframe(stream: DataFrame) -> None:
    same = stream.withWatermark("timestamp", "10 minutes")
    assert dedupe(same, within="10 minutes", event_time="timestamp").isStreaming
    assert dedupe(same, within="600 seconds", event_time="timestamp").isStreaming
    with pytest.raises(ConfigError, match="delay of 300000 ms, but within='10 minutes'"):
        dedupe(
            stream.withWatermark("timestamp", "5 minutes"),
            within="10 minutes",
            event_time="timestamp",
        )
    other = stream.selectExpr("*", "timestamp AS t2").withWatermark("t2", "10 minutes")
    with pytest.raises(ConfigError, match=r"watermark on \['t2'\], not on the event time"):
        dedupe(other, within="10 minutes", event_time="timestamp")
    with pytest.raises(ConfigError, match="takes a pyspark DataFrame"):
        dedupe("events", within="10 minutes", event_time="timestamp")  # type: ignore[arg-type]


def test_static_dataframe_keeps_one_row_per_id_and_every_null(spark: SparkSession) -> None:
    import datetime as dt

    t = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    rows = [("a", 1, t), ("a", 2, t), (None, 3, t), (None, 4, t), ("b", 5, t)]
    df = spark.createDataFrame(rows, "record_id STRING, n INT, ts TIMESTAMP")
    out = dedupe(df, within="1 minute", event_time="ts")
    got = sorted((r.record_id or "", r.n) for r in out.collect())
    assert [i for i, _ in got] == ["", "", "a", "b"]
    assert {n for i, n in got if not i} == {3, 4}


def test_dedup_counts_reads_a_progress_entry() -> None:
    entry = {
        "batchId": 7,
        "observedMetrics": {
            "sparkonce_dedup": {"null_ids": 2},
            "sparkonce_dedup_b": {"null_ids": 1},
        },
        "stateOperators": [
            {
                "operatorName": "dedupeWithinWatermark",
                "numRowsTotal": 40,
                "numRowsDroppedByWatermark": 3,
                "customMetrics": {"numDroppedDuplicateRows": 5},
            },
            {"operatorName": "stateStoreSave", "numRowsTotal": 9},
        ],
    }
    assert dedup_counts(entry) == DedupCounts(7, 3, 5, 3, 40)
    assert dedup_counts({"batchId": 1, "observedMetrics": {}, "stateOperators": []}) is None
