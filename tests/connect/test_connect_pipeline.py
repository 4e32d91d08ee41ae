"""Pipelines on a real Spark Connect session: the batch function is pickled and commits in
the server's Python worker. The sinks are read with the sqlite3 module and psycopg, not
with sparkonce."""

from __future__ import annotations

import os
import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import (
    ConfigError,
    EmbeddedLogSource,
    Pipeline,
    SQLiteSink,
    sink_from_url,
)

# In the CI rotation (a Connect server is one more JVM than make test can pay for today).
pytestmark = pytest.mark.campaign_lane


def values(df: DataFrame) -> DataFrame:
    return df.select(
        "record_id",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )


def pipeline(tmp_path: Path, log_dir: Path, **sink: Any) -> Pipeline:
    return Pipeline(
        name="c1",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=20),
        sink=sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", "out", **sink),
        checkpoint=tmp_path / "chk",
        transform=values,
    )


def read(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def forget_last_commit(checkpoint: Path) -> int:
    """Make Spark forget its last finished batch, as a driver killed before Spark's commit
    log would: the next run replays it, and the ledger must skip it."""
    last = max(int(n.name) for n in (checkpoint / "commits").iterdir() if n.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    return last


def test_append_on_connect_is_exact_and_a_replay_after_a_restart_is_skipped(
    connect_spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(90, partitions=3)
    p = pipeline(tmp_path, log_dir)
    report = p.run(connect_spark)
    db = tmp_path / "sink.db"
    values_seen = [v for (v,) in read(db, "SELECT value FROM out")]
    assert sorted(values_seen) == list(range(1, 91))
    entries = read(db, "SELECT seq, epoch, row_count FROM sparkonce_ledger ORDER BY seq")
    assert report.batches_committed == len(entries) >= 2
    assert report.rows_committed == sum(e[2] for e in entries) == 90
    assert {e[1] for e in entries} == {report.epoch}

    # A restart replays the batch Spark forgot; new records follow it.
    replayed = forget_last_commit(tmp_path / "chk")
    make_log(30, partitions=3, start=91)
    again = p.run(connect_spark)
    assert again.epoch == report.epoch + 1
    assert again.batches_skipped == 1, again  # the replayed batch, found in the ledger
    counts = Counter(v for (v,) in read(db, "SELECT value FROM out"))
    assert sorted(counts) == list(range(1, 121))
    assert set(counts.values()) == {1}, {v: n for v, n in counts.items() if n > 1}
    spark_batches = [b for (b,) in read(db, "SELECT spark_batch_id FROM sparkonce_ledger")]
    assert spark_batches.count(replayed) == 1


def read_url(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` in the store at ``url``: Python's sqlite3 module or psycopg."""
    if url.startswith("sqlite:///"):
        return read(Path(url.removeprefix("sqlite:///")), sql)
    import psycopg

    with psycopg.connect(url) as conn:
        return list(conn.execute(sql).fetchall())


@pytest.mark.campaign_lane
def test_upsert_on_connect_keeps_the_latest_row_per_key(
    connect_spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], store_url: str
) -> None:
    """SQLite and PostgreSQL: an upsert by key with latest_by keeps each key's highest value
    across batches, committed in the server's Python worker."""
    log_dir = make_log(60, partitions=2, keys=5)
    p = Pipeline(
        name="c1",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=10),
        sink=sink_from_url(store_url, "out", mode="upsert", keys=["key"], latest_by=["value"]),
        checkpoint=tmp_path / "chk",
        transform=values,
    )
    report = p.run(connect_spark)
    assert report.batches_committed >= 2, report
    rows = dict(read_url(store_url, "SELECT key, value FROM out"))
    assert rows == {f"k{k}": max(i for i in range(1, 61) if i % 5 == k) for k in range(5)}
    entries = read_url(store_url, "SELECT epoch FROM sparkonce_ledger")
    assert len(entries) == report.batches_committed and {e for (e,) in entries} == {1}


class UnlistedSink(SQLiteSink):
    """A sink that is not on Connect's list (every sparkonce sink is)."""


@pytest.mark.campaign_lane
def test_a_pipeline_connect_cannot_run_is_refused_before_the_epoch(
    connect_spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(10, partitions=1)
    p = Pipeline(
        name="c1",
        source=EmbeddedLogSource(log_dir, "events"),
        sink=UnlistedSink(f"sqlite:///{tmp_path / 'other.db'}", "out"),
        checkpoint=tmp_path / "chk",
        transform=values,
    )
    with pytest.raises(ConfigError, match="Spark Connect sessions do not support the sink"):
        p.run(connect_spark)
    assert not (tmp_path / "chk").exists()  # nothing was read or written

    # A SQLite pipeline refused for what it asks (task faults) writes no owner row.
    from sparkonce.faults import FaultPlan

    q = pipeline(tmp_path, log_dir)
    with pytest.raises(ConfigError, match="do not support injected task faults"):
        q.run(connect_spark, faults=FaultPlan(fail_tasks=frozenset({"read"})))
    db = tmp_path / "sink.db"
    assert not db.exists() or read(db, "SELECT COUNT(*) FROM sparkonce_owner") == [(0,)]


_PIPELINE_FILE = """
from pyspark.sql import functions as F
from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url

pipeline = Pipeline(
    name="cli",
    source=EmbeddedLogSource({log!r}, "events", max_records_per_partition={batch}),
    sink={sink},
    checkpoint={checkpoint!r},
    transform=lambda df: df.select(
        {columns}
    ),
)
"""
# The columns the pipeline file's transform selects, unless its caller names others.
VALUE_COLUMNS = '"record_id", F.col("value").cast("string").cast("long").alias("value")'


def cli_pipeline(
    tmp_path: Path,
    log_dir: Path,
    batch: int,
    url: str | None = None,
    *,
    sink: str | None = None,
    columns: str = VALUE_COLUMNS,
) -> tuple[Path, Path]:
    """The pipeline file ``sparkonce run`` is given (``batch`` records per log partition per
    batch), and the SQLite sink it writes (unless ``url`` names another store). ``sink``:
    the file's sink expression (Python source) instead of ``sink_from_url(url, "out")``;
    ``columns``: what its transform selects."""
    pipeline_file = tmp_path / "pipeline.py"
    db = tmp_path / "sink.db"
    url = url or f"sqlite:///{db}"
    pipeline_file.write_text(
        _PIPELINE_FILE.format(
            log=str(log_dir),
            sink=sink or f"sink_from_url({url!r}, 'out')",
            checkpoint=str(tmp_path / "chk"),
            batch=batch,
            columns=columns,
        )
    )
    return pipeline_file, db


def wait_for_commits(
    client: Any, committed: str | Callable[[], int], count: int, timeout: float = 240
) -> None:
    """Wait until ``count`` batches are committed, while ``client`` (a ``sparkonce run``
    process) still runs: ``committed`` is the URL of a SQL store (its ledger table is
    counted) or a function that counts them in the store (one that raises counts 0)."""
    import time

    if isinstance(committed, str):
        url = committed

        def committed() -> int:
            return int(read_url(url, "SELECT COUNT(*) FROM sparkonce_ledger")[0][0])

    deadline = time.monotonic() + timeout
    done = 0
    while done < count:
        assert client.poll() is None, f"the client ended before its commit number {count}"
        assert time.monotonic() < deadline, (
            f"no commit number {count} in {timeout} s (the store shows {done})"
        )
        time.sleep(0.2)
        try:
            done = committed()
        except Exception:  # the store or its ledger is not there yet
            done = 0


def client_env() -> dict[str, str]:
    """This process's environment without a session choice of its own: each command names
    its server."""
    return {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARKONCE_MASTER")}


@pytest.mark.campaign_lane
def test_sparkonce_run_and_explain_take_remote_from_the_flag_and_spark_remote(
    connect_url: str, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """The command line as a user types it: ``sparkonce run --remote`` commits into SQLite on
    the Connect server (no JVM in the command's process), and ``SPARK_REMOTE`` does the same
    for ``explain``."""
    import subprocess
    import sys

    pipeline_file, db = cli_pipeline(tmp_path, make_log(40, partitions=2), batch=20)
    env = client_env()
    cmd = [sys.executable, "-m", "sparkonce"]
    done = subprocess.run(
        [*cmd, "run", str(pipeline_file), "--remote", connect_url, "--timeout", "240"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "pipeline cli: epoch 1, resumed from start; committed" in done.stdout, done.stdout
    assert "(40 rows)" in done.stdout, done.stdout
    assert sorted(v for (v,) in read(db, "SELECT value FROM out")) == list(range(1, 41))

    explained = subprocess.run(
        [*cmd, "explain", str(pipeline_file), "--json"],
        capture_output=True,
        text=True,
        env={**env, "SPARK_REMOTE": connect_url},
        timeout=300,
    )
    assert explained.returncode == 0, explained.stderr
    assert '"pipeline": "cli"' in explained.stdout, explained.stdout
    assert '"unchecked": "on a Spark Connect session' in explained.stdout, explained.stdout


@pytest.mark.campaign_lane
def test_the_plan_checks_on_connect_find_functions_by_name_and_say_what_they_cannot_check(
    connect_spark: SparkSession, make_log: Callable[..., Path]
) -> None:
    """No py4j on Connect: the plan is read from the text the server sends."""
    from sparkonce.pipeline.plan import plan_facts

    source = EmbeddedLogSource(make_log(5, partitions=1), "events")
    plain = values(source.stream(connect_spark, None))
    facts = plan_facts(plain.withColumn("r", F.rand(7)).withColumn("t", F.current_timestamp()))
    assert facts.nondeterministic == ("rand()",), facts
    assert facts.clock == ("current_timestamp()",), facts
    assert facts.unchecked.startswith("on a Spark Connect session"), facts
    assert plan_facts(plain).varies == ()
    counted = plan_facts(plain.groupBy("key").count())
    assert counted.stateful == ("Aggregate",), counted


@pytest.mark.campaign_lane
def test_two_phase_postgres_on_connect_is_exact_across_a_replay(
    connect_spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], pg_url: str
) -> None:
    """The two-phase sink's tasks pre-commit from the server's executors (mapInArrow sent by
    the worker's own Connect client); the worker's driver side flips them with the ledger
    row. A replay after a restart is skipped; psycopg reads each value once."""
    log_dir = make_log(60, partitions=2)
    p = Pipeline(
        name="c2",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=15),
        sink=sink_from_url(pg_url, "out", two_phase=True),
        checkpoint=tmp_path / "chk",
        transform=values,
    )
    first = p.run(connect_spark)
    assert first.batches_committed >= 2 and first.rows_committed == 60, first
    forget_last_commit(tmp_path / "chk")
    make_log(20, partitions=2, start=61)
    again = p.run(connect_spark)
    assert again.batches_skipped == 1 and again.rows_committed == 20, again
    counts = Counter(v for (v,) in read_url(pg_url, "SELECT value FROM out"))
    assert sorted(counts) == list(range(1, 81))
    assert set(counts.values()) == {1}, {v: n for v, n in counts.items() if n > 1}


def _produce(bootstrap: str, topic: str, first: int, last: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for n in range(first, last + 1):
        producer.produce(topic, key=f"k{n % 7}", value=str(n))
    assert producer.flush(30) == 0


def _committed_values(bootstrap: str, topic: str) -> Counter[int]:
    """Every committed record of ``topic``, with confluent-kafka's consumer at
    read_committed (aborted and open transactions are not seen), not with sparkonce."""
    return Counter(int(v or b"-1") for v in committed_messages(bootstrap, topic))


def committed_messages(bootstrap: str, topic: str) -> list[bytes | None]:
    """The value of every committed record of ``topic``, in offset order within each partition,
    read with confluent-kafka's consumer at read_committed (none for a missing topic)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{os.getpid()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        parts = [TopicPartition(topic, p, 0) for p in meta.partitions]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=30)[1] for p in parts}
        consumer.assign(parts)
        seen: list[bytes | None] = []
        done: set[int] = {p for p, end in ends.items() if end == 0}
        while len(done) < len(ends):
            msg = consumer.poll(5)
            if msg is None:
                # The last offsets of a transactional topic are its commit markers.
                positions = consumer.position(parts)
                done |= {tp.partition for tp in positions if tp.offset >= ends[tp.partition]}
                continue
            assert msg.error() is None, msg.error()
            seen.append(msg.value())
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            if offset + 1 >= ends[partition]:
                done.add(partition)
        return seen
    finally:
        consumer.close()


@pytest.mark.campaign_lane
def test_kafka_source_into_kafka_sink_on_connect_is_exact_skips_a_replay_and_fences_a_zombie(
    connect_spark: SparkSession, tmp_path: Path, kafka_broker: Any, kafka_topic: Any
) -> None:
    """KafkaSink's tasks run in the Connect server's Spark, keyed by their partition
    numbers, which KafkaSource keeps stable; the output is read with confluent-kafka's own
    consumer at read_committed."""
    from sparkonce import KafkaSink, KafkaSource
    from tests.connect.conftest import start_zombie

    source_topic, out = kafka_topic("in", partitions=3), kafka_topic("out", partitions=2)
    _produce(kafka_broker.bootstrap, source_topic, 1, 150)
    p = Pipeline(
        name="k1",
        source=KafkaSource(kafka_broker.bootstrap, source_topic, max_records_per_partition=20),
        sink=KafkaSink(kafka_broker.bootstrap, out),
        checkpoint=tmp_path / "chk",
        transform=lambda df: df.select(
            F.col("key").cast("string").alias("key"), F.col("value").cast("string").alias("value")
        ),
    )
    first = p.run(connect_spark)
    assert first.batches_committed >= 3 and first.rows_committed == 150
    seen = _committed_values(kafka_broker.bootstrap, out)
    assert sorted(seen) == list(range(1, 151)) and set(seen.values()) == {1}

    # A replay of the last batch, after Spark forgot it, is found in the ledger and skipped.
    forget_last_commit(tmp_path / "chk")
    _produce(kafka_broker.bootstrap, source_topic, 151, 180)
    again = p.run(connect_spark)
    assert again.batches_skipped == 1 and again.rows_committed == 30
    seen = _committed_values(kafka_broker.bootstrap, out)
    assert sorted(seen) == list(range(1, 181)) and set(seen.values()) == {1}

    # The second run's batch function, after a third run took the pipeline: fenced.
    _produce(kafka_broker.bootstrap, source_topic, 181, 200)
    newer = KafkaSink(kafka_broker.bootstrap, out)
    newer.open()
    try:
        assert newer.acquire("k1").epoch == again.epoch + 1
    finally:
        newer.close()
    query = start_zombie(connect_spark, p, again.epoch, tmp_path / "chk")
    with pytest.raises(Exception, match=r"FencedError|fenced"):
        query.awaitTermination()
    seen = _committed_values(kafka_broker.bootstrap, out)
    assert sorted(seen) == list(range(1, 181)) and set(seen.values()) == {1}


@pytest.mark.campaign_lane
@pytest.mark.parametrize(
    "point", ["before-commit", "after-rows", "before-ledger-commit", "after-ledger-commit"]
)
def test_a_commit_killed_at_each_crash_point_on_connect_loses_and_repeats_nothing(
    connect_url: str, tmp_path: Path, make_log: Callable[..., Path], point: str
) -> None:
    """The run's fault plan travels with the batch function: SIGKILL of the server's Python
    worker at a named step of its second commit fails the query and the client; the next
    run resumes, and SQLite (read with sqlite3) holds every value once."""
    import json
    import subprocess
    import sys

    pipeline_file, db = cli_pipeline(tmp_path, make_log(60, partitions=2), batch=10)
    run = [sys.executable, "-m", "sparkonce", "run", str(pipeline_file), "--remote", connect_url]
    events = tmp_path / "events.jsonl"
    env = dict(client_env(), SPARKONCE_CRASH_AT=f"{point}@2", SPARKONCE_FAULT_EVENTS=str(events))
    crashed = subprocess.run(run, capture_output=True, text=True, env=env, timeout=400)
    assert crashed.returncode != 0, crashed.stderr[-2000:]
    fired = [json.loads(line) for line in events.read_text().splitlines()]
    crash = [e for e in fired if e["event"] == "crash"]
    assert [(e["point"], e["hit"]) for e in crash] == [(point, 2)], fired
    committed = read(db, "SELECT COUNT(*) FROM sparkonce_ledger")[0][0]
    assert committed == (2 if point == "after-ledger-commit" else 1)

    again = subprocess.run(run, capture_output=True, text=True, env=client_env(), timeout=400)
    assert again.returncode == 0, again.stderr[-2000:]
    counts = Counter(v for (v,) in read(db, "SELECT value FROM out"))
    assert sorted(counts) == list(range(1, 61))
    assert set(counts.values()) == {1}, {v: n for v, n in counts.items() if n > 1}


@pytest.mark.campaign_lane
def test_observers_and_on_batch_on_connect_get_each_batch_from_the_ledger(
    connect_spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """The batches commit in the server; the client hands each committed batch to the
    observers and to on_batch as its ledger entry appears, with Spark's progress from the
    listener, the lag from the source, and the end; an on_batch that raises stops the
    query and fails the run."""
    from sparkonce.observe.base import RunObserver

    class Seen(RunObserver):
        def __init__(self) -> None:
            self.calls: list[str] = []
            self.batches: list[int] = []
            self.lag: dict[Any, int] = {}

        def on_start(self, start: Any) -> None:
            self.calls.append("start")

        def on_batch(self, report: Any) -> None:
            self.batches.append(report.result.seq)

        def on_progress(self, progress: Any) -> None:
            self.calls.append("progress")

        def on_lag(self, lag: Any) -> None:
            self.lag = dict(lag)

        def on_end(self, report: Any) -> None:
            self.calls.append("end")

    log_dir = make_log(120, partitions=2)
    p = pipeline(tmp_path, log_dir)
    seen, got = Seen(), list[Any]()
    report = p.run(connect_spark, observer=seen, on_batch=got.append)
    entries = read(tmp_path / "sink.db", "SELECT seq, row_count FROM sparkonce_ledger ORDER BY seq")
    assert report.batches_committed == len(entries) >= 3
    assert [b.result.seq for b in got] == [seq for seq, _ in entries] == seen.batches
    assert [b.result.row_count for b in got] == [n for _, n in entries]
    assert seen.calls[0] == "start" and seen.calls[-1] == "end"
    assert "progress" in seen.calls  # the listener's, from the server
    assert seen.lag and set(seen.lag.values()) == {0}  # all read at the end

    # An on_batch that raises fails the run and stops the query in the server.
    make_log(60, partitions=2, start=121)

    def fail(_batch: Any) -> None:
        raise RuntimeError("on_batch refused this batch")

    with pytest.raises(RuntimeError, match="on_batch refused"):
        p.run(connect_spark, on_batch=fail)
    assert not [q for q in connect_spark.streams.active]


@pytest.mark.campaign_lane
def test_spark_kafka_source_on_connect_is_exact_across_a_replay_and_refused_into_kafka_sink(
    connect_spark: SparkSession, tmp_path: Path, kafka_broker: Any, kafka_topic: Any
) -> None:
    """Spark's Kafka connector, in the Connect server, into SQLite (read with sqlite3): each
    record once, and a replay after a restart skipped. Into KafkaSink it is refused before
    the epoch: without the JVM plan, the tasks of a replay cannot be named."""
    from sparkonce import KafkaSink, SparkKafkaSource

    topic = kafka_topic("in", partitions=2)
    _produce(kafka_broker.bootstrap, topic, 1, 100)
    db = tmp_path / "sink.db"
    p = Pipeline(
        name="sk",
        source=SparkKafkaSource(kafka_broker.bootstrap, topic, max_records_per_batch=30),
        sink=sink_from_url(f"sqlite:///{db}", "out"),
        checkpoint=tmp_path / "chk",
        transform=lambda df: df.select(
            "record_id", F.col("value").cast("string").cast("long").alias("value")
        ),
    )
    first = p.run(connect_spark)
    assert first.batches_committed >= 3 and first.rows_committed == 100
    forget_last_commit(tmp_path / "chk")
    _produce(kafka_broker.bootstrap, topic, 101, 130)
    again = p.run(connect_spark)
    assert again.batches_skipped == 1 and again.rows_committed == 30
    counts = Counter(v for (v,) in read(db, "SELECT value FROM out"))
    assert sorted(counts) == list(range(1, 131)) and set(counts.values()) == {1}

    into_kafka = Pipeline(
        name="sk2",
        source=SparkKafkaSource(kafka_broker.bootstrap, topic),
        sink=KafkaSink(kafka_broker.bootstrap, kafka_topic("out", partitions=1)),
        checkpoint=tmp_path / "chk2",
        transform=lambda df: df.select(F.col("value").cast("string").alias("value")),
    )
    with pytest.raises(ConfigError, match="into KafkaSink") as refused:
        into_kafka.run(connect_spark)
    assert "no epoch was taken" in str(refused.value)
    assert not (tmp_path / "chk2").exists()


@pytest.mark.campaign_lane
def test_a_stateful_aggregation_on_connect_is_exact_across_a_replay(
    connect_spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """State in the server's checkpoint: a count per key (update mode, upsert by key). After
    Spark forgets its last batch, the replay is skipped by the ledger, and the final counts
    are those of a run that never failed (read with sqlite3)."""
    log_dir = make_log(90, partitions=3, keys=4)
    db = tmp_path / "sink.db"
    p = Pipeline(
        name="agg",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=10),
        sink=sink_from_url(f"sqlite:///{db}", "out", mode="upsert", keys=["key"]),
        checkpoint=tmp_path / "chk",
        transform=lambda df: df.groupBy(F.col("key").cast("string").alias("key")).count(),
        output_mode="update",
    )
    first = p.run(connect_spark)
    assert first.batches_committed >= 3
    forget_last_commit(tmp_path / "chk")
    make_log(30, partitions=3, keys=4, start=91)
    again = p.run(connect_spark)
    assert again.batches_skipped == 1, again
    expected = Counter(f"k{v % 4}" for v in range(1, 121))
    assert dict(read(db, "SELECT key, count FROM out")) == dict(expected)


_S3_PIPELINE_FILE = """
from pyspark.sql import functions as F
from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url

pipeline = Pipeline(
    name="s3c",
    source=EmbeddedLogSource({log!r}, "events", max_records_per_partition=10),
    sink=sink_from_url({url!r}, "out"),
    checkpoint={checkpoint!r},
    transform=lambda df: df.select(
        "record_id", F.col("value").cast("string").cast("long").alias("value")
    ),
)
"""


@pytest.mark.campaign_lane
def test_a_checkpoint_on_s3_on_connect_is_read_through_pyarrow_across_a_replay(
    tmp_path: Path, make_log: Callable[..., Path], s3: Any, s3_bucket: str
) -> None:
    """The server writes the checkpoint on S3 (moto) through S3A; the client and the
    server's Python worker read it through pyarrow, with the server's S3A settings and the
    keys from the AWS environment (a Connect server never hands out the secret ones). A
    replay after Spark's last commit file was deleted (with boto3) is skipped, and SQLite
    (read with sqlite3) holds every value once."""
    import subprocess
    import sys

    from tests.connect.conftest import s3_connect_server

    db = tmp_path / "sink.db"
    pipeline_file = tmp_path / "pipeline.py"
    pipeline_file.write_text(
        _S3_PIPELINE_FILE.format(
            log=str(make_log(60, partitions=2)),
            url=f"sqlite:///{db}",
            checkpoint=f"s3a://{s3_bucket}/chk",
        )
    )
    server, keys = s3_connect_server(tmp_path, s3)
    run = [sys.executable, "-m", "sparkonce", "run", str(pipeline_file), "--remote", server.url]
    env = {**client_env(), **keys}
    try:
        first = subprocess.run(run, capture_output=True, text=True, env=env, timeout=400)
        assert first.returncode == 0, first.stderr[-3000:]
        commits = sorted(
            int(k.rsplit("/", 1)[1])
            for k in s3.list_keys(s3_bucket, "chk/commits/")
            if k.rsplit("/", 1)[1].isdigit()
        )
        assert len(commits) >= 3, commits
        s3.client().delete_object(Bucket=s3_bucket, Key=f"chk/commits/{commits[-1]}")
        make_log(20, partitions=2, start=61)
        again = subprocess.run(run, capture_output=True, text=True, env=env, timeout=400)
        assert again.returncode == 0, again.stderr[-3000:]
    finally:
        server.stop()
    assert "skipped 1 replayed batch" in again.stdout, (again.stdout + again.stderr)[-3000:]
    counts = Counter(v for (v,) in read(db, "SELECT value FROM out"))
    assert sorted(counts) == list(range(1, 81)) and set(counts.values()) == {1}
