"""A failed query reaches the user as one error naming the cause, the batch and its ranges.

Real Spark runs: a cast that ANSI mode refuses inside a task, and a sparkonce error raised
inside a Spark task (as the two-phase sink's pre-commit raises when PostgreSQL is down).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, Pipeline, SinkUnavailableError, sink_from_url
from sparkonce.cli import EXIT_UNAVAILABLE, _report
from sparkonce.errors import PipelineError


def _log_with_a_bad_value(root: Path) -> Path:
    from sparkonce.log import IdempotentProducer, Topic

    topic = Topic.create(root, "events", 1, exist_ok=True)
    with topic, IdempotentProducer(topic, "p") as producer:
        for i in range(10):
            producer.send(b"abc" if i == 5 else str(i).encode(), b"k")
    return root


def _pipeline(tmp_path: Path, transform: object) -> Pipeline:
    return Pipeline(
        name="fails",
        source=EmbeddedLogSource(_log_with_a_bad_value(tmp_path / "log"), "events"),
        sink=sink_from_url(f"sqlite:///{tmp_path / 'out.db'}", "out"),
        checkpoint=tmp_path / "chk",
        transform=transform,  # type: ignore[arg-type]
    )


def test_a_cast_error_names_spark_error_class_batch_and_ranges(
    spark: SparkSession, tmp_path: Path
) -> None:
    def cast(df: DataFrame) -> DataFrame:
        return df.select(F.col("value").cast("string").cast("long").alias("v"))

    with pytest.raises(PipelineError) as info:
        _pipeline(tmp_path, cast).run(spark, timeout=120)
    message = str(info.value)
    assert "[CAST_INVALID_INPUT] The value 'abc'" in message
    assert "batch 0 [events[0]:0..10]" in message
    assert "STREAM_FAILED" not in message and "Traceback" not in message


def test_a_sparkonce_error_raised_in_a_task_keeps_its_class_and_exit_code(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def unreachable(df: DataFrame) -> DataFrame:
        @F.udf("long")
        def lookup(v: bytes) -> int:
            from sparkonce.errors import SinkUnavailableError

            raise SinkUnavailableError(
                "cannot connect to PostgreSQL at 127.0.0.1:9 after 4 attempt(s)"
            )

        return df.select(lookup("value").alias("v"))

    with pytest.raises(SinkUnavailableError) as info:
        _pipeline(tmp_path, unreachable).run(spark, timeout=120)
    assert str(info.value) == (
        "cannot connect to PostgreSQL at 127.0.0.1:9 after 4 attempt(s) "
        "(pipeline 'fails', batch 0 [events[0]:0..10])"
    )
    assert _report(info.value) == EXIT_UNAVAILABLE
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("sparkonce:")]
    assert len(err) == 1 and err[0].startswith("sparkonce: unavailable: cannot connect")


_CAST_PIPELINE = """
from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url


def cast(df):
    return df.select(F.col("value").cast("string").cast("long").alias("v"))


pipeline = Pipeline(
    name="fails",
    source=EmbeddedLogSource({log!r}, "events"),
    sink=sink_from_url({url!r}, "out"),
    checkpoint={checkpoint!r},
    transform=cast,
)
"""


@pytest.mark.campaign_lane  # in the rotation: make test's budget
def test_a_failed_run_prints_one_line_and_keeps_spark_stacks_in_its_log_file(
    tmp_path: Path,
) -> None:
    """``sparkonce run`` as a user starts it: Spark's error records (PySpark's query-context
    logger in JSON with a Java stack, py4j's callback error) go to the log file only."""
    import os
    import subprocess
    import sys

    pipeline_file = tmp_path / "pipeline.py"
    pipeline_file.write_text(
        _CAST_PIPELINE.format(
            log=str(_log_with_a_bad_value(tmp_path / "log")),
            url=f"sqlite:///{tmp_path / 'out.db'}",
            checkpoint=str(tmp_path / "chk"),
        )
    )
    log_file = tmp_path / "run.log"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    cmd = [sys.executable, "-m", "sparkonce", "run", str(pipeline_file)]
    done = subprocess.run(
        [*cmd, "--log-file", str(log_file), "--timeout", "120"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    err = done.stderr.strip().splitlines()
    assert err[-1].startswith("sparkonce: PipelineError: pipeline 'fails': batch 0"), err
    assert "[CAST_INVALID_INPUT]" in err[-1] and f"(full log: {log_file})" in err[-1]
    # Above the summary, only sparkonce's own progress (and the JVM launcher's one warning).
    for line in err[:-1]:
        assert " INFO sparkonce." in line or line.startswith("WARNING: Using incubator"), err
    assert len(done.stderr) < 3000, done.stderr
    kept = log_file.read_text()
    assert "DataFrameQueryContextLogger" in kept and "at org.apache.spark" in kept
    assert "There was an exception while executing the Python Proxy" in kept


@pytest.mark.postgres
@pytest.mark.crash_lane  # about 35 s: a server of its own, and the driver's reconnects
def test_postgresql_killed_while_a_task_holds_its_pre_commit_is_unavailable_exit_4(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The two-phase sink's write task has registered its attempt and waits, inside its
    pre-commit transaction, for a lock this test holds on the pre-commit table; the server is
    killed (immediate shutdown, as a crash) right then. The task's psycopg error must reach
    the user as SinkUnavailableError (exit 4), as the same outage does between batches."""
    import contextlib
    import threading
    import time

    import psycopg
    from tests.services import postgres

    from sparkonce.sinks.twophase import DATA_SUFFIX

    server = postgres.start(tmp_path / "pg")
    url = server.create_database("kill_in_task")

    def slow_start(df: DataFrame) -> DataFrame:
        @F.udf("string")
        def late(v):  # no type hints: a plain Python UDF
            import time as _time

            if v == b"0":
                _time.sleep(4)  # the write task's first rows come late: the lock is in place
            return v.decode()

        return df.select(late("value").alias("v"))

    pipeline = Pipeline(
        name="killed",
        source=EmbeddedLogSource(_log_with_a_bad_value(tmp_path / "log"), "events"),
        sink=sink_from_url(url, "out", two_phase=True),
        checkpoint=tmp_path / "chk",
        transform=slow_start,
    )
    killed: list[str] = []

    def kill_while_a_task_waits_in_its_transaction() -> None:
        deadline = time.monotonic() + 180
        lock = psycopg.connect(url)
        try:
            while time.monotonic() < deadline:  # made by the driver just before the tasks
                with psycopg.connect(url, autocommit=True) as look:
                    made = look.execute(
                        f"SELECT to_regclass('out{DATA_SUFFIX}') IS NOT NULL"
                    ).fetchone()
                if made and made[0]:
                    break
                time.sleep(0.05)
            lock.execute(f'LOCK TABLE "out{DATA_SUFFIX}" IN ACCESS EXCLUSIVE MODE')
            while time.monotonic() < deadline:
                with psycopg.connect(url, autocommit=True) as look:
                    waiting = look.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE 'COPY%'"
                    ).fetchone()
                if waiting and waiting[0]:
                    postgres.kill(tmp_path / "pg")
                    killed.append("killed")
                    return
                time.sleep(0.1)
        finally:
            with contextlib.suppress(psycopg.OperationalError):  # the server is gone
                lock.close()

    killer = threading.Thread(target=kill_while_a_task_waits_in_its_transaction, daemon=True)
    killer.start()
    try:
        with pytest.raises(SinkUnavailableError) as info:
            pipeline.run(spark, timeout=180)
    finally:
        killer.join(30)
        postgres.stop(tmp_path / "pg")
    assert killed, "the server was not killed while a task held its transaction"
    message = str(info.value)
    assert "batch 0 [events[0]:0..10]" in message, message
    assert _report(info.value) == EXIT_UNAVAILABLE


@pytest.mark.postgres
def test_a_commit_failing_on_the_driver_names_the_batch_and_its_ranges(
    spark: SparkSession, tmp_path: Path, pg_server: Any
) -> None:
    """The sink's database is dropped after batch 0 (its sessions cut off): batch 1's commit,
    on the driver, cannot reach it. The one line names the batch and its ranges, as a
    task's failure does."""
    url = pg_server.create_database(f"gone_{os.getpid()}")

    def drop_after_batch_0(report: object) -> None:
        pg_server.drop_database(f"gone_{os.getpid()}")

    pipeline = Pipeline(
        name="gone",
        source=EmbeddedLogSource(
            _log_with_a_bad_value(tmp_path / "log"), "events", max_records_per_partition=5
        ),
        sink=sink_from_url(url, "out"),
        checkpoint=tmp_path / "chk",
        transform=lambda df: df.select(F.col("value").cast("string").alias("v")),
    )
    with pytest.raises(SinkUnavailableError) as info:
        pipeline.run(spark, timeout=120, on_batch=drop_after_batch_0)
    message = str(info.value)
    assert message.startswith("cannot connect to PostgreSQL"), message
    assert message.endswith("(pipeline 'gone', batch 1 [events[0]:5..10])"), message


@pytest.mark.kafka
@pytest.mark.crash_lane  # about 40 s: a broker of its own, killed and started again
def test_kafka_killed_while_a_write_task_produces_is_unavailable_exit_4(
    spark: SparkSession, tmp_path: Path
) -> None:
    """KafkaSink's write task has started its transactional producer (``init_transactions``,
    the ledger read) and waits for its first rows, which a UDF holds back; the broker is
    killed with SIGKILL right then, so the task produces into a dead cluster. Its client's
    error must reach the user as SinkUnavailableError (exit 4), never a PipelineError, and
    once the broker is back no record of the batch is visible to a read_committed reader."""
    import threading
    import time

    from tests.services import kafka as kafka_service

    from sparkonce.sinks.inspect import inspector_for
    from sparkonce.sinks.kafka import KafkaSink

    broker = kafka_service.start(tmp_path / "broker")
    started = tmp_path / "task-started"

    def slow_start(df: DataFrame) -> DataFrame:
        @F.udf("string")
        def late(v):  # no type hints: a plain Python UDF
            import pathlib
            import time as _time

            if v == b"0":
                pathlib.Path(str(started)).touch()
                _time.sleep(6)  # the write task's producer starts meanwhile; then the kill
            return v.decode()

        return df.select(late("value").alias("value"))

    killed: list[float] = []

    def kill_once_the_task_waits() -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not started.exists():
            time.sleep(0.05)
        if started.exists():
            time.sleep(3)  # init_transactions and the ledger read take well under 1 s
            broker.kill()
            killed.append(time.monotonic())

    try:
        broker.create_topic("out", 1)
        sink = KafkaSink(broker.bootstrap, "out", transaction_timeout_ms=10_000)
        pipeline = Pipeline(
            name="killed",
            source=EmbeddedLogSource(_log_with_a_bad_value(tmp_path / "log"), "events"),
            sink=sink,
            checkpoint=tmp_path / "chk",
            transform=slow_start,
        )
        killer = threading.Thread(target=kill_once_the_task_waits, daemon=True)
        killer.start()
        begun = time.monotonic()
        with pytest.raises(SinkUnavailableError) as info:
            pipeline.run(spark, timeout=180)
        ended = time.monotonic()
        killer.join(30)
        assert killed, "the broker was not killed while a write task waited"
        assert not isinstance(info.value, PipelineError)
        message = str(info.value)
        assert "batch 0 [events[0]:0..10]" in message, message
        assert _report(info.value) == EXIT_UNAVAILABLE
        print(f"run failed {ended - killed[0]:.1f} s after the kill ({ended - begun:.1f} s)")

        broker.restart()  # the same data: the task's transaction never committed
        assert inspector_for(sink, fresh=True).rows() == []
        assert inspector_for(sink).fresh().ledger("killed") == []
    finally:
        kafka_service.stop(tmp_path / "broker", timeout=0.0)


@pytest.mark.kafka
@pytest.mark.crash_lane  # about 40 s: a broker of its own, killed after batch 0
def test_a_kafka_commit_failing_on_the_driver_names_the_batch_and_its_ranges(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 44 item 4, on the Kafka sink: the broker is killed after batch 0, so batch 1's
    commit fails on the driver (its look at the ledger topic, before any task starts). The
    one line names the batch and its ranges before the log file, as a task's failure does."""
    from tests.services import kafka as kafka_service

    from sparkonce.errors import KafkaUnavailableError
    from sparkonce.sinks.kafka import KafkaSink

    broker = kafka_service.start(tmp_path / "broker")
    try:
        broker.create_topic("out", 1)
        pipeline = Pipeline(
            name="gone",
            source=EmbeddedLogSource(
                _log_with_a_bad_value(tmp_path / "log"), "events", max_records_per_partition=5
            ),
            sink=KafkaSink(broker.bootstrap, "out"),
            checkpoint=tmp_path / "chk",
            transform=lambda df: df.select(F.col("value").cast("string").alias("value")),
        )
        with pytest.raises(KafkaUnavailableError) as info:
            pipeline.run(spark, timeout=180, on_batch=lambda report: broker.kill())
    finally:
        kafka_service.stop(tmp_path / "broker", timeout=0.0)
    info.value.log_file = tmp_path / "run.log"  # type: ignore[attr-defined]
    assert _report(info.value) == EXIT_UNAVAILABLE
    # The report is the last line: librdkafka's own warnings about the dead broker can come
    # before it on stderr (seen in a crash-lane run).
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"sparkonce: unavailable: Kafka at bootstrap servers {broker.bootstrap}")
    assert line.endswith(
        f"(pipeline 'gone', batch 1 [events[0]:5..10]) (full log: {tmp_path / 'run.log'})"
    ), line
