"""Pipelines with several named outputs, run for real (Spark, SQLite, PostgreSQL).

The cross-store crash test kills a real driver (``sparkonce run``) right after the first
store committed a batch and before the second did, then restarts it: every output must
equal a failure-free run's, and both stores must hold the same ``uuid()`` values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import functions as F

from sparkonce import ConfigError, EmbeddedLogSource, Pipeline, PostgresSink, SQLiteSink
from sparkonce.protocol import CrashPoint
from sparkonce.verify.driver import Driver
from tests.outputs import multi_pipeline as mp

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NAME = "multi"


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return mp.write_log(tmp_path)


def _stores(tmp_path: Path) -> tuple[str, str]:
    return f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"


def _pipeline_file(tmp_path: Path, log_dir: Path, *, stable: bool | None = None) -> Path:
    """The two-store pipeline as a file, for real drivers (stores from _stores)."""
    store_a, store_b = _stores(tmp_path)
    path = tmp_path / "pipeline.py"
    path.write_text(
        mp.pipeline_text(
            name=NAME,
            log_dir=log_dir,
            store_a=store_a,
            store_b=store_b,
            checkpoint=tmp_path / "ckpt",
            stable=stable,
        )
    )
    return path


def test_three_outputs_in_two_stores(spark: SparkSession, tmp_path: Path, log_dir: Path) -> None:
    store_a, store_b = _stores(tmp_path)
    checkpoint = tmp_path / "ckpt"
    pipeline = mp.load(
        mp.pipeline_text(
            name=NAME, log_dir=log_dir, store_a=store_a, store_b=store_b, checkpoint=checkpoint
        )
    )
    assert pipeline.output_set.stable, "two stores: stable output is on by default"
    report = pipeline.run(spark)

    assert report.batches_committed >= 3
    batch = report.batches[0].result
    assert set(batch.per_output) == {"totals", "dead_letters", "accepted", "audit"}
    assert batch.per_output["accepted"] == batch.per_output["audit"]
    mp.check_outputs(store_a, store_b, NAME)
    # One ledger row per batch in each store (store A's three outputs share one).
    ledger_a, ledger_b = mp.ledger_ends(store_a, NAME), mp.ledger_ends(store_b, NAME)
    assert [s for s, _ in ledger_a] == list(range(report.batches_committed))
    assert ledger_a == ledger_b
    # Every copy was collected once both stores covered its batch.
    stable = checkpoint / "sparkonce" / "stable"
    assert stable.is_dir() and not [p for p in stable.iterdir() if not p.name.startswith(".")]

    # A second run finds nothing new and changes nothing.
    again = mp.load(
        mp.pipeline_text(
            name=NAME, log_dir=log_dir, store_a=store_a, store_b=store_b, checkpoint=checkpoint
        )
    ).run(spark)
    assert again.batches_committed == 0
    assert mp.ledger_ends(store_a, NAME) == ledger_a


def test_outputs_in_postgres_share_one_transaction(
    spark: SparkSession, tmp_path: Path, log_dir: Path, pg_url: str
) -> None:
    """Two PostgreSQL outputs and a SQLite one: one ledger row per batch in each store."""
    import psycopg

    from sparkonce.outputs import parse_json

    def transform(df: Any) -> dict[str, Any]:
        parsed = parse_json(df, "user STRING, amount BIGINT", required=("user", "amount"))
        good = parsed.good.select("record_id", F.col("data.amount").alias("amount"))
        return {"good": good, "bad": parsed.bad, "copy": good}

    pipeline = Pipeline(
        NAME,
        EmbeddedLogSource(log_dir, mp.TOPIC, max_records_per_partition=mp.LIMIT),
        checkpoint=tmp_path / "ckpt",
        transform=transform,
        outputs={
            "good": PostgresSink(pg_url, "good"),
            "bad": PostgresSink(pg_url, "bad"),
            "copy": SQLiteSink(f"sqlite:///{tmp_path / 'c.db'}", "copy"),
        },
    )
    assert pipeline.output_set is not None and len(pipeline.output_set.groups) == 2
    report = pipeline.run(spark)
    want = mp.expected()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*), count(DISTINCT record_id) FROM good").fetchone() == (
            want["good"],
            want["good"],
        )
        assert conn.execute("SELECT count(*) FROM bad").fetchone() == (want["bad"],)
        ledger = conn.execute(
            "SELECT seq, row_count FROM sparkonce_ledger WHERE pipeline = %s ORDER BY seq", (NAME,)
        ).fetchall()
    assert [s for s, _ in ledger] == list(range(report.batches_committed))
    assert sum(n for _, n in ledger) == mp.RECORDS  # good + bad rows, one entry per batch


def test_stable_output_for_a_single_sink(
    spark: SparkSession, tmp_path: Path, log_dir: Path
) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    pipeline = Pipeline(
        NAME,
        EmbeddedLogSource(log_dir, mp.TOPIC, max_records_per_partition=mp.LIMIT),
        SQLiteSink(url, "out"),
        tmp_path / "ckpt",
        transform=lambda df: df.select("record_id", F.expr("rand()").alias("r")),
        stable_output=True,
    )
    report = pipeline.run(spark)
    assert report.rows_committed == mp.RECORDS
    first = report.batches[0].result
    assert first.per_output == {"output": first.row_count} and first.row_count > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sink": "both"}, "either sink"),
        ({"outputs": {"bad name": "a"}}, "invalid"),
        ({"outputs": {"a": "a", "b": "a"}}, "same sink object"),
        ({"outputs": {"a": "a", "b": "same-table"}}, "both write"),
        ({"outputs": {}}, "non-empty"),
    ],
)
def test_bad_outputs_are_refused(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    sinks = {"a": SQLiteSink(url, "t1"), "same-table": SQLiteSink(url, "t1")}
    args: dict[str, Any] = {}
    if kwargs.get("sink") == "both":
        args = {"sink": sinks["a"], "outputs": {"x": SQLiteSink(url, "t2")}}
    else:
        args = {"outputs": {n: sinks[s] for n, s in kwargs["outputs"].items()}}
    with pytest.raises(ConfigError, match=message):
        Pipeline(NAME, EmbeddedLogSource(tmp_path, "t"), checkpoint=tmp_path / "c", **args)


def test_one_database_two_users_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="different users"):
        Pipeline(
            NAME,
            EmbeddedLogSource(tmp_path, "t"),
            checkpoint=tmp_path / "c",
            outputs={
                "a": PostgresSink("postgresql://alice@127.0.0.1:5432/db", "a"),
                "b": PostgresSink("postgresql://bob@127.0.0.1:5432/db", "b"),
            },
        )


def test_transform_must_return_the_declared_outputs(
    spark: SparkSession, tmp_path: Path, log_dir: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    source = EmbeddedLogSource(log_dir, mp.TOPIC)
    outputs = {"a": SQLiteSink(url, "a"), "b": SQLiteSink(url, "b")}
    cases: list[tuple[Any, str]] = [
        (lambda df: df, "must return"),
        (lambda df: {"a": df}, "missing: \\['b'\\]"),
        (lambda df: {"a": df, "b": df, "c": df}, "not declared: \\['c'\\]"),
    ]
    for transform, message in cases:
        p = Pipeline(NAME, source, checkpoint=tmp_path / "c", outputs=outputs, transform=transform)
        with pytest.raises(ConfigError, match=message):
            p.run(spark)
    complete = Pipeline(
        NAME,
        source,
        checkpoint=tmp_path / "c",
        outputs=outputs,
        transform=lambda df: {"a": df.groupBy("key").count(), "b": df.select("value")},
        output_mode="complete",
    )
    with pytest.raises(ConfigError, match="complete"):
        complete.run(spark)
    single = Pipeline(NAME, source, SQLiteSink(url, "s"), tmp_path / "c", transform=lambda df: {})
    with pytest.raises(ConfigError, match="declare them with"):
        single.run(spark)
    # Nothing was taken: no epoch in the store.
    import sqlite3

    conn = sqlite3.connect(tmp_path / "a.db")
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    owners = conn.execute("SELECT count(*) FROM sparkonce_owner").fetchone()
    assert owners == (0,), tables


def test_lost_checkpoint_with_stores_apart_is_refused(
    spark: SparkSession, tmp_path: Path, log_dir: Path
) -> None:
    """Store A one batch ahead of store B, checkpoint gone: refused, nothing changed."""
    import shutil
    import sqlite3

    from sparkonce import CheckpointError

    store_a, store_b = _stores(tmp_path)
    checkpoint = tmp_path / "ckpt"
    text = mp.pipeline_text(
        name=NAME, log_dir=log_dir, store_a=store_a, store_b=store_b, checkpoint=checkpoint
    )
    mp.load(text).run(spark)
    conn = sqlite3.connect(tmp_path / "b.db")
    with conn:
        last = conn.execute("SELECT max(seq) FROM sparkonce_ledger").fetchone()[0]
        conn.execute("DELETE FROM sparkonce_ledger WHERE seq = ?", (last,))
    conn.close()
    shutil.rmtree(checkpoint)
    with pytest.raises(CheckpointError, match="stores end at different offsets"):
        mp.load(text).run(spark)
    assert mp.ledger_ends(store_b, NAME)[-1][0] == last - 1


# Crash lane, to keep make test within its budget. make test runs this pipeline without a
# crash (test_three_outputs_in_two_stores, above), the same crash between two stores'
# commits with stable output in tests/outputs/test_bad_input_pipeline.py, and stable output
# of non-deterministic columns in tests/outputs/test_stable.py.
@pytest.mark.crash_lane
def test_crash_between_two_stores_then_recover(tmp_path: Path, log_dir: Path) -> None:
    """SIGKILL after store A committed batch 0 and before store B did; then run again."""
    store_a, store_b = _stores(tmp_path)
    path = _pipeline_file(tmp_path, log_dir)
    crashed = Driver(path, tmp_path / "crash.log", crash_at=CrashPoint.AFTER_LEDGER_COMMIT)
    code = crashed.start().wait(timeout=300)
    assert code == -9, crashed.log_tail(30)
    # Store A has batch 0, store B has nothing: the crash fell between the two commits.
    assert [s for s, _ in mp.ledger_ends(store_a, NAME)] == [0]
    assert mp.ledger_ends(store_b, NAME) == []
    copies = [p for p in (tmp_path / "ckpt/sparkonce/stable").iterdir() if p.name[0] != "."]
    assert len(copies) == 1, "batch 0's stable copy is kept until store B has it"
    manifest = json.loads((copies[0] / "manifest.json").read_text())
    assert manifest["key"]["spark_batch_id"] == 0

    again = Driver(path, tmp_path / "again.log")
    assert again.start().wait(timeout=300) == 0, again.log_tail(30)
    mp.check_outputs(store_a, store_b, NAME)
    assert mp.ledger_ends(store_a, NAME) == mp.ledger_ends(store_b, NAME)
    assert not [p for p in (tmp_path / "ckpt/sparkonce/stable").iterdir() if p.name[0] != "."]


@pytest.mark.crash_lane
def test_without_stable_output_the_same_crash_splits_the_stores(
    tmp_path: Path, log_dir: Path
) -> None:
    """The same crash with stable_output=False: batch 0 is recomputed for store B, so its
    uuid() values differ from store A's. This is what the test above would catch."""
    store_a, store_b = _stores(tmp_path)
    path = _pipeline_file(tmp_path, log_dir, stable=False)
    crashed = Driver(path, tmp_path / "crash.log", crash_at=CrashPoint.AFTER_LEDGER_COMMIT)
    assert crashed.start().wait(timeout=300) == -9, crashed.log_tail(30)
    again = Driver(path, tmp_path / "again.log")
    assert again.start().wait(timeout=300) == 0, again.log_tail(30)
    with pytest.raises(AssertionError, match="different event ids"):
        mp.check_outputs(store_a, store_b, NAME)


def test_late_records_reach_the_late_output(spark: SparkSession, tmp_path: Path) -> None:
    """A windowed count with a watermark, and a `late` output for what it drops.

    10 s windows, 10 s watermark delay, one partition, four records per batch. Batch B
    drops records whose window ended at or before the watermark Spark planned for batch
    B-1 (Spark 4.2, measured in tests/outputs/test_late.py). Event times (seconds), per
    batch: 0: 101-104; 1: 201-204; 2: 205-208 (planned with watermark 194, from batch 1's
    204); 3: 105, 106, 95 (late: their windows end at 110 and 100) and 209.
    """
    import sqlite3

    from sparkonce.log import IdempotentProducer, Topic
    from sparkonce.outputs.late import late_records

    times = [101, 102, 103, 104, 201, 202, 203, 204, 205, 206, 207, 208, 105, 106, 95, 209]
    topic = Topic.create(tmp_path / "log", "events", 1)
    with topic, IdempotentProducer(topic, "p") as producer:
        for t in times:
            producer.send(str(t).encode(), b"k")

    def transform(df: Any) -> dict[str, Any]:
        seconds = F.col("value").cast("string").try_cast("int")
        events = df.select("record_id", F.timestamp_seconds(seconds).alias("ts"))
        events = events.withWatermark("ts", "10 seconds")
        counts = events.groupBy(F.window("ts", "10 seconds")).count()
        totals = counts.select(F.col("window.start").alias("start"), "count")
        return {"totals": totals, "late": late_records(events, "ts", window="10 seconds")}

    url = f"sqlite:///{tmp_path / 'out.db'}"
    report = Pipeline(
        NAME,
        EmbeddedLogSource(tmp_path / "log", "events", max_records_per_partition=4),
        checkpoint=tmp_path / "ckpt",
        transform=transform,
        outputs={
            "totals": SQLiteSink(url, "totals", mode="upsert", keys=["start"]),
            "late": SQLiteSink(url, "late"),
        },
    ).run(spark)
    late_per_batch = [b.result.per_output.get("late", 0) for b in report.batches]
    assert late_per_batch[:4] == [0, 0, 0, 3]
    conn = sqlite3.connect(tmp_path / "out.db")
    counted = sum(n for (n,) in conn.execute("SELECT count FROM totals"))
    late = conn.execute("SELECT record_id, watermark, windows, late_windows FROM late").fetchall()
    assert counted + len(late) == len(times)  # every record counted or reported late
    assert sorted(r[0] for r in late) == ["p-0-12", "p-0-13", "p-0-14"]
    assert {(r[2], r[3]) for r in late} == {(1, 1)}


def test_an_output_set_lists_the_pipelines_of_all_its_stores(tmp_path: Path) -> None:
    """What ``sparkonce ui`` lists for a pipeline with several outputs: each name once."""
    url_a, url_b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    only_b = SQLiteSink(url_b, "other")
    outputs = {"x": SQLiteSink(url_a, "t1"), "y": SQLiteSink(url_a, "t2")}
    outputs["z"] = SQLiteSink(url_b, "t3")
    p = Pipeline(NAME, EmbeddedLogSource(tmp_path, "t"), checkpoint=tmp_path / "c", outputs=outputs)
    with only_b:
        only_b.acquire("elsewhere")
    output_set = p.output_set
    assert output_set is not None and output_set.pipelines() == ["elsewhere"]
    output_set.acquire(NAME)
    assert output_set.pipelines() == [NAME, "elsewhere"]
