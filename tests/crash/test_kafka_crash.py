"""Crash tests on a real Kafka broker: Kafka -> PostgreSQL and Kafka -> Kafka at every crash
point (both also through SparkKafkaSource, Spark's own connector); a batch that the connector
numbers differently when it is replayed; embedded log -> Kafka for each fault kind, and a
zombie.

Each pipeline runs as a real driver process (``sparkonce run FILE``) that is SIGKILLed once at
every named crash point of the commit protocol, in turn: run 1 dies at ``before-commit``, run 2
(same checkpoint) at ``after-rows``, run 3 at ``before-ledger-commit``, run 4 at
``after-ledger-commit``, and run 5 finishes. After every kill, a ``read_committed`` reader must
see no record twice. At the end the output must equal a failure-free in-process run of the same
pipeline file (the oracle), record for record, and the ledger must be a gap-free chain.

A last test pauses a run (SIGSTOP) before its tasks write, lets a newer run finish, then
resumes the old one: the zombie must be fenced (exit code 3) and change nothing.

``make test`` runs only :func:`test_each_fault_kind_once_on_kafka`, the Kafka sink's
representative (``covers``) for each fault kind. Every crash point of kafka-to-kafka and of
Spark's connector into PostgreSQL and Kafka, and the renumbered replay, run in ``make
test-crash``; KafkaSource into
PostgreSQL and the zombie test in ``make test-campaign``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparkonce.faults import FaultPlan
from sparkonce.offsets import check_chain
from sparkonce.protocol import FAIL_TASKS_ENV, PAUSE_ENV, PAUSE_TASKS_ENV, CrashPoint
from sparkonce.sinks import sink_from_url
from sparkonce.sinks.inspect import inspector_for
from sparkonce.verify.driver import SIGKILL_EXIT, Driver
from sparkonce.verify.injection import RETRY_MASTER
from tests.crash.conftest import process_state, run_driver, wait_until_stopped

RECORDS = 1200
PARTITIONS = 3
LIMIT = 50  # records per input partition per batch: about 8 batches
NAME = "kafka-crash"
EXIT_FENCED = 3

_FILE = '''"""A sparkonce Kafka crash-test pipeline, written by tests/crash/test_kafka_crash.py."""

from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, KafkaSource, Pipeline, SparkKafkaSource, sink_from_url


def to_table(df):
    return df.select(
        F.col("record_id"),
        F.col("partition"),
        F.col("offset"),
        F.col("value").cast("string").cast("long").alias("value"),
    )


def to_kafka(df):
    return df.select(
        F.col("record_id").alias("key"),
        F.concat_ws(
            "/", F.col("partition").cast("string"), F.col("offset").cast("string"),
            F.col("value").cast("string"),
        ).alias("value"),
    )


pipeline = Pipeline(
    name={name!r},
    source={source},
    transform={transform},
    sink=sink_from_url({sink_url!r}{table}),
    checkpoint={checkpoint!r},
)
'''


def _write(path: Path, *, source: str, sink_url: str, checkpoint: Path, name: str = NAME) -> Path:
    kafka_out = sink_url.startswith("kafka://")
    path.write_text(
        _FILE.format(
            name=name,
            source=source,
            transform="to_kafka" if kafka_out else "to_table",
            sink_url=sink_url,
            table="" if kafka_out else ", 'events_out'",
            checkpoint=str(checkpoint),
        )
    )
    return path


def _produce(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(1, RECORDS + 1):
        producer.produce(topic, value=str(i).encode(), key=f"k{i % 6}".encode())
    assert producer.flush(30) == 0


def _output(sink_url: str) -> Counter[Any]:
    """What readers see, as a multiset of (partition, offset, value) per input record."""
    sink = sink_from_url(sink_url, None if sink_url.startswith("kafka://") else "events_out")
    try:
        rows = inspector_for(sink).rows()
    finally:
        sink.close()
    if sink_url.startswith("kafka://"):
        return Counter(tuple(int(x) for x in str(r["value"]).split("/")) for r in rows)
    return Counter((int(r["partition"]), int(r["offset"]), int(r["value"])) for r in rows)


def _ledger(sink_url: str, name: str = NAME) -> list[Any]:
    sink = sink_from_url(sink_url, None if sink_url.startswith("kafka://") else "events_out")
    try:
        return sink.ledger(name)
    finally:
        sink.close()


@pytest.fixture
def setup(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    kafka_broker: Any,
    kafka_topic: Callable[..., str],
) -> Callable[[str], tuple[str, str, str]]:
    """``setup(kind)`` -> (source expression, sink URL, oracle sink URL) for one pipeline kind."""

    def make(kind: str) -> tuple[str, str, str]:
        topic = kafka_topic("in", partitions=PARTITIONS)
        _produce(kafka_broker.bootstrap, topic)
        source = (
            f"SparkKafkaSource({kafka_broker.bootstrap!r}, {topic!r}, "
            f"max_records_per_batch={LIMIT * PARTITIONS})"
            if kind.startswith("sparkkafka")
            else f"KafkaSource({kafka_broker.bootstrap!r}, {topic!r}, "
            f"max_records_per_partition={LIMIT})"
        )
        if kind.endswith("postgres"):
            sink_url = str(request.getfixturevalue("pg_url"))
            oracle_url = f"sqlite:///{tmp_path / 'oracle.db'}"
        else:
            sink_url = f"kafka://{kafka_broker.bootstrap}/{kafka_topic('out', partitions=2)}"
            oracle_url = f"kafka://{kafka_broker.bootstrap}/{kafka_topic('oracle', partitions=2)}"
        return source, sink_url, oracle_url

    return make


def _oracle(spark: Any, tmp_path: Path, source: str, oracle_url: str) -> Counter[Any]:
    from sparkonce.pipeline.loader import load_pipeline

    saved = {k: os.environ.pop(k) for k in ("SPARKONCE_CRASH_AT", PAUSE_ENV) if k in os.environ}
    try:
        path = _write(
            tmp_path / "oracle.py",
            source=source,
            sink_url=oracle_url,
            checkpoint=tmp_path / "oracle-checkpoint",
            name="oracle",
        )
        load_pipeline(path).run(spark, timeout=300)
    finally:
        os.environ.update(saved)
    return _output(oracle_url)


@pytest.mark.crash
@pytest.mark.parametrize(
    "kind",
    [
        # KafkaSource's crash points are kafka-to-kafka's, and the SQL sink's on PostgreSQL
        # are in test_crash_points.py: this pair runs in make test-campaign.
        pytest.param("kafka-to-postgres", marks=pytest.mark.campaign_lane),
        pytest.param("kafka-to-kafka", marks=pytest.mark.crash_lane),
        # (embedded log -> Kafka: the sink's crash points are kafka-to-kafka's; the
        # embedded source's are in tests/crash/test_crash_points.py.)
        # Through Spark's own Kafka connector (SparkKafkaSource).
        pytest.param("sparkkafka-to-postgres", marks=pytest.mark.crash_lane),
        pytest.param("sparkkafka-to-kafka", marks=pytest.mark.crash_lane),
    ],
)
def test_kill_at_every_crash_point_then_recover(
    kind: str,
    spark: Any,
    tmp_path: Path,
    setup: Callable[[str], tuple[str, str, str]],
    drivers: list[Driver],
) -> None:
    source, sink_url, oracle_url = setup(kind)
    expected = _oracle(spark, tmp_path, source, oracle_url)
    assert sum(expected.values()) == RECORDS and set(expected.values()) == {1}
    pipeline_file = _write(
        tmp_path / "pipeline.py", source=source, sink_url=sink_url, checkpoint=tmp_path / "chk"
    )
    committed = 0
    for i, point in enumerate(CrashPoint, start=1):
        run = Driver(pipeline_file, tmp_path / f"run{i}.log", crash_at=point, crash_hit=2)
        drivers.append(run.start())
        code = run_driver(run)
        assert code == SIGKILL_EXIT, f"run {i} ({point}) exited {code}:\n{run.log_tail()}"
        seen = _output(sink_url)
        twice = [r for r, n in seen.items() if n > 1]
        assert not twice, f"after the kill at {point}, readers see {twice[:5]} twice"
        assert seen.keys() <= expected.keys(), f"after {point}: rows no clean run writes"
        entries = _ledger(sink_url)
        assert len(entries) >= committed, f"ledger shrank after {point}"
        committed = len(entries)
    final = Driver(pipeline_file, tmp_path / "final.log")
    drivers.append(final.start())
    code = run_driver(final)
    assert code == 0, f"the last run exited {code}:\n{final.log_tail()}"
    got = _output(sink_url)
    missing, extra = expected - got, got - expected
    assert got == expected, f"missing {list(missing)[:5]}, extra {list(extra)[:5]}"
    entries = _ledger(sink_url)
    assert check_chain(e.ranges for e in entries) == []
    assert [e.seq for e in entries] == list(range(len(entries)))
    assert sum(e.row_count for e in entries) == RECORDS


def _planning_order(topic: str, partitions: int) -> list[int]:
    """The order in which Spark's connector (4.x) numbers the topic's partitions in the run
    that plans a batch, for at most 4 partitions: a java.util.HashMap's iteration order of
    Kafka's TopicPartition (16 buckets). A replay reads the batch's offsets back from the
    checkpoint and numbers them in partition order. Only used to pick a topic whose two
    orders differ; the test then checks from the ledger's markers that they did."""

    def java_hash(text: str) -> int:
        h = 0
        for ch in text:
            h = (31 * h + ord(ch)) & 0xFFFFFFFF
        return h

    def bucket(p: int) -> int:
        h = (31 * (31 + p) + java_hash(topic)) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & 15

    return sorted(range(partitions), key=lambda p: (bucket(p), p))


def _fails(key: str) -> bool:
    """Whether an injected write failure picks this task key in batch 0 (seq 0)."""
    return FaultPlan(fail_tasks=frozenset({"write"})).fail_task("write", f"{NAME}:0:{key}", 0)


@pytest.mark.crash
@pytest.mark.crash_lane
def test_a_replay_the_connector_numbers_differently_writes_each_record_once(
    tmp_path: Path, kafka_broker: Any, drivers: list[Driver]
) -> None:
    """Spark's connector numbers a batch's Kafka partitions in one order when it plans the
    batch and in another when a new run replays it. Run 1 commits the first two tasks of
    batch 0 and fails the third (an injected write failure, no task retries); run 2 replays
    the batch with other task numbers. KafkaSink knows a task by the Kafka range it reads,
    so the replay skips exactly the committed ranges and writes the rest once. Keyed by
    task number instead, it skipped a range nobody wrote and wrote another twice."""
    # A topic whose planned order is not partition order, and whose third task (in planned
    # order, so it runs after the first two on local[2]) is the one the fault picks.
    for i in range(100_000):
        topic = f"renumber-{os.getpid()}-{i}"
        order = _planning_order(topic, PARTITIONS)
        picked = [_fails(f"{topic}-{p}") for p in order]
        if order != sorted(order) and picked == [False, False, True]:
            break
    kafka_broker.create_topic(topic, PARTITIONS)
    out = f"renumber-out-{os.getpid()}"
    kafka_broker.create_topic(out, 2)
    _produce(kafka_broker.bootstrap, topic)
    sink_url = f"kafka://{kafka_broker.bootstrap}/{out}"
    source = (
        f"SparkKafkaSource({kafka_broker.bootstrap!r}, {topic!r}, "
        f"max_records_per_batch={LIMIT * PARTITIONS})"
    )
    pipeline_file = _write(
        tmp_path / "pipeline.py", source=source, sink_url=sink_url, checkpoint=tmp_path / "chk"
    )
    first = Driver(pipeline_file, tmp_path / "run1.log", env={FAIL_TASKS_ENV: "write"})
    drivers.append(first.start())
    code = run_driver(first)
    assert code not in (0, SIGKILL_EXIT), f"run 1 exited {code}:\n{first.log_tail()}"
    spark_log = first.log_path.with_name(first.log_path.name + ".spark.log").read_text()
    assert "injected task failure before the commit of task" in spark_log
    final = Driver(pipeline_file, tmp_path / "run2.log")
    drivers.append(final.start())
    code = run_driver(final)
    assert code == 0, f"run 2 exited {code}:\n{final.log_tail()}"
    _every_record_once(sink_url)
    _check_ledger(sink_url)

    # The premise, from the markers of batch 0: run 1 committed tasks whose number is not
    # their Kafka partition, and run 2 wrote the rest under numbers that are.
    from sparkonce.kafka.client import KafkaConnection
    from sparkonce.ledger.kafka_topic import LedgerTopic

    ledger = LedgerTopic(KafkaConnection(kafka_broker.bootstrap, {}), f"{out}.sparkonce-ledger")
    try:
        records, _ = ledger.read(0)
    finally:
        ledger.close()
    markers = [r for r in records if r.get("type") == "marker" and r["seq"] == 0]
    by_run = {e: [m for m in markers if m["epoch"] == e] for e in (1, 2)}
    assert by_run[1] and by_run[2], markers
    moved = [m for m in by_run[1] if m["task"] != f"{topic}-{m['partition']}"]
    assert moved, f"run 1 numbered the partitions in order, no renumbering to test: {markers}"
    assert all(m["task"] == f"{topic}-{m['partition']}" for m in by_run[2]), markers
    assert len({m["task"] for m in markers}) == len(markers) == PARTITIONS, markers


def _every_record_once(sink_url: str) -> Counter[Any]:
    """What readers see, checked against the input without an oracle run.

    The input holds the values 1..RECORDS once each and the transform copies each record
    with its partition and offset, so the output must hold every value once, and no input
    position twice.
    """
    got = _output(sink_url)
    twice = [r for r, n in got.items() if n > 1]
    assert not twice, f"readers see {twice[:5]} twice"
    values = sorted(v for (_, _, v) in got)
    missing = sorted(set(range(1, RECORDS + 1)) - set(values))
    assert values == list(range(1, RECORDS + 1)), f"missing {missing[:5]}, {len(values)} records"
    assert len({(p, o) for (p, o, _) in got}) == RECORDS
    return got


def _check_ledger(sink_url: str) -> None:
    entries = _ledger(sink_url)
    assert check_chain(e.ranges for e in entries) == []
    assert [e.seq for e in entries] == list(range(len(entries)))
    assert sum(e.row_count for e in entries) == RECORDS


@pytest.mark.crash
@pytest.mark.covers("kafka", "task-failure")
@pytest.mark.covers("kafka", "zombie")
@pytest.mark.covers("kafka", "crash-point")
def test_each_fault_kind_once_on_kafka(
    tmp_path: Path,
    kafka_broker: Any,
    kafka_topic: Callable[..., str],
    make_log: Callable[..., Path],
    drivers: list[Driver],
) -> None:
    """make test's Kafka sink crash test: each fault kind that applies to it (a Kafka sink
    has no store connection to drop) once, in its own driver run, as
    tests/crash/test_fault_kinds.py does for the SQL sinks. Embedded log -> Kafka, 4 batches.

    1. task-failure, then zombie-to-be: run A (``local[2,4]``) commits batch 0 while about
       half of its tasks fail halfway on their first attempt; reading and writing are one
       task here, so a failed attempt can leave its Kafka transaction open, which the
       retry's ``init_transactions`` (same transactional id) aborts. A then stops itself
       inside its 2nd commit, before its tasks start.
    2. crash-point: run B (a new machine, empty checkpoint) takes epoch 2 and is killed at
       ``after-rows`` of its first batch: every task of batch 1 has committed its records and
       marker, the ledger entry is missing. Readers see batch 1 already (per-partition
       atomicity), never a record twice.
    3. Run C (B's checkpoint) replays batch 1, whose tasks find their markers and write
       nothing, and finishes: every record once.
    4. zombie: A is continued and must be fenced (exit code 3), changing nothing.
    """
    per_batch = 100  # records per input partition per batch: 3 x 400 records, 4 batches
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=6)
    source = f"EmbeddedLogSource({str(log_dir)!r}, 'events', max_records_per_partition={per_batch})"
    sink_url = f"kafka://{kafka_broker.bootstrap}/{kafka_topic('out', partitions=2)}"
    files = {
        m: _write(tmp_path / f"{m}.py", source=source, sink_url=sink_url, checkpoint=tmp_path / m)
        for m in ("a", "b")
    }

    def owner_epoch() -> int | None:
        sink = sink_from_url(sink_url)
        try:
            owner = sink.owner(NAME)
        finally:
            sink.close()
        return None if owner is None else owner.epoch

    def seen_once(where: str) -> Counter[Any]:
        seen = _output(sink_url)
        twice = [r for r, n in seen.items() if n > 1]
        assert not twice, f"{where}: readers see {twice[:5]} twice"
        return seen

    # 1. task-failure, then A pauses inside its 2nd commit, before its tasks start.
    run_a = Driver(
        files["a"],
        tmp_path / "run_a.log",
        env={PAUSE_ENV: "before-commit@2", FAIL_TASKS_ENV: "read"},
        extra_args=("--master", RETRY_MASTER),
    )
    drivers.append(run_a.start())
    wait_until_stopped(run_a)
    where = f"run A paused (task failures, then zombie-to-be)\n{run_a.log_tail()}"
    assert {e["stage"] for e in run_a.events("task-failure")} == {"read"}, f"no failure: {where}"
    assert sum(seen_once(where).values()) == per_batch * PARTITIONS, where
    assert [(e.seq, e.epoch) for e in _ledger(sink_url)] == [(0, 1)], where

    # 2. crash-point: B takes over and dies after its tasks committed batch 1.
    run_b = Driver(files["b"], tmp_path / "run_b.log", crash_at=CrashPoint.AFTER_ROWS)
    drivers.append(run_b.start())
    code = run_driver(run_b)
    assert code == SIGKILL_EXIT, f"run B exited {code}, not SIGKILL:\n{run_b.log_tail()}"
    where = f"run B killed at after-rows\n{run_b.log_tail()}"
    assert sum(seen_once(where).values()) == 2 * per_batch * PARTITIONS, where
    assert [(e.seq, e.epoch) for e in _ledger(sink_url)] == [(0, 1)], where
    assert owner_epoch() == 2, where

    # 3. C recovers on B's checkpoint: the markers make batch 1's tasks write nothing again.
    run_c = Driver(files["b"], tmp_path / "run_c.log")
    drivers.append(run_c.start())
    code = run_driver(run_c)
    assert code == 0, f"run C exited {code}:\n{run_c.log_tail()}"
    after_c = _every_record_once(sink_url)
    _check_ledger(sink_url)
    assert owner_epoch() == 3

    # 4. zombie: A wakes up and must be fenced before its tasks write anything.
    assert run_a.poll() is None, f"run A died while paused:\n{run_a.log_tail()}"
    os.killpg(run_a.pid, signal.SIGCONT)
    code = run_driver(run_a)
    assert code == EXIT_FENCED, f"run A exited {code}, not fenced:\n{run_a.log_tail()}"
    [fenced] = run_a.events("fenced")
    assert (fenced["epoch"], fenced["owner_epoch"]) == (1, 3), run_a.log_tail()
    assert _output(sink_url) == after_c, "the fenced run wrote records"
    _check_ledger(sink_url)


@pytest.mark.crash
@pytest.mark.campaign_lane  # make test fences a Kafka zombie in test_each_fault_kind_once_on_kafka
def test_zombie_run_is_fenced_on_kafka(
    tmp_path: Path,
    setup: Callable[[str], tuple[str, str, str]],
    drivers: list[Driver],
) -> None:
    source, sink_url, _ = setup("kafka-to-kafka")
    pipeline_file = _write(
        tmp_path / "pipeline.py", source=source, sink_url=sink_url, checkpoint=tmp_path / "chk"
    )
    zombie = Driver(
        pipeline_file, tmp_path / "zombie.log", env={PAUSE_ENV: f"{CrashPoint.BEFORE_COMMIT}@2"}
    )
    drivers.append(zombie.start())
    wait_until_stopped(zombie)
    successor = Driver(pipeline_file, tmp_path / "successor.log")
    drivers.append(successor.start())
    assert run_driver(successor) == 0, successor.log_tail()
    after_successor = _output(sink_url)
    assert sum(after_successor.values()) == RECORDS and set(after_successor.values()) == {1}
    os.killpg(zombie.pid, signal.SIGCONT)
    code = run_driver(zombie)
    assert code == EXIT_FENCED, f"the zombie exited {code}, not fenced:\n{zombie.log_tail()}"
    assert _output(sink_url) == after_successor
    entries = _ledger(sink_url)
    assert check_chain(e.ranges for e in entries) == []


_DEAD_TASKS_FILE = '''"""The dead-task test's pipeline (tests/crash/test_kafka_crash.py)."""

from pyspark.sql import functions as F

from sparkonce import KafkaSink, KafkaSource, Pipeline

pipeline = Pipeline(
    name={name!r},
    source=KafkaSource({bootstrap!r}, {topic!r}, max_records_per_partition={limit}),
    transform=lambda df: df.select(
        F.col("record_id").alias("key"),
        F.concat_ws(
            "/", F.col("partition").cast("string"), F.col("offset").cast("string"),
            F.col("value").cast("string"),
        ).alias("value"),
    ),
    sink=KafkaSink({bootstrap!r}, {out!r}, transaction_timeout_ms=300_000),
    checkpoint={checkpoint!r},
)
'''


def _read_committed(bootstrap: str, topic: str) -> Counter[Any]:
    """Every record of ``topic`` as a plain confluent-kafka consumer sees it at
    ``read_committed`` (not sparkonce's reader): a multiset of (partition, offset, value)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"independent-{os.getpid()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    seen: Counter[Any] = Counter()
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        left = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + 60
        while left and time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=1):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        left.discard(m.partition())
                    continue
                seen[tuple(int(x) for x in (m.value() or b"").decode().split("/"))] += 1
                if (m.offset() or 0) + 1 >= ends[m.partition()]:
                    left.discard(m.partition())
        assert not left, f"read_committed reader stalled on partitions {sorted(left)}"
    finally:
        consumer.close()
    return seen


def _open_on_ledger(bootstrap: str, ledger_topic: str) -> list[dict[str, Any]]:
    """The ledger records in open (or aborted) transactions past the last stable offset."""
    from sparkonce.kafka.client import KafkaConnection
    from sparkonce.ledger.kafka_topic import LedgerTopic

    conn = KafkaConnection(bootstrap, {})
    stable = LedgerTopic(conn, ledger_topic).watermarks()[1]
    records, _ = LedgerTopic(conn, ledger_topic, isolation_level="read_uncommitted").read(stable)
    return records


@pytest.mark.crash
@pytest.mark.crash_lane  # two driver runs, about a minute
def test_a_restart_aborts_the_open_task_transactions_of_a_killed_driver(
    tmp_path: Path,
    kafka_broker: Any,
    kafka_topic: Callable[..., str],
    drivers: list[Driver],
) -> None:
    """Issue 44: run 1 (transaction_timeout_ms=300000) is SIGKILLed while its tasks have
    sent their records and markers and not committed (each stops itself there:
    SPARKONCE_PAUSE_TASKS=write), so the ledger's last stable offset stays behind their
    markers for 5 minutes. Run 2 must abort those transactions itself: it commits its first
    batch within 30 s of its start, and a plain read_committed consumer reads every input
    record exactly once. Before, run 2 waited 30 s on its owner record and exited 4."""
    topic = kafka_topic("in", partitions=PARTITIONS)
    _produce(kafka_broker.bootstrap, topic)
    out = kafka_topic("out", partitions=2)
    pipeline_file = tmp_path / "pipeline.py"
    pipeline_file.write_text(
        _DEAD_TASKS_FILE.format(
            name=NAME,
            bootstrap=kafka_broker.bootstrap,
            topic=topic,
            out=out,
            limit=LIMIT * 4,
            checkpoint=str(tmp_path / "chk"),
        )
    )
    first = Driver(pipeline_file, tmp_path / "run1.log", env={PAUSE_TASKS_ENV: "write"})
    drivers.append(first.start())
    deadline = time.monotonic() + 240
    paused: list[dict[str, Any]] = []
    while time.monotonic() < deadline and first.poll() is None:
        paused = [e for e in first.events("task-pause") if process_state(e["pid"]) == "T"]
        if len(paused) >= 2:  # both task slots of local[2]
            break
        time.sleep(0.2)
    assert paused, f"no task paused before its commit:\n{first.log_tail()}"
    first.kill()
    first.wait(timeout=60)
    for e in paused:  # the tasks die with their driver (their daemon is in another group)
        with contextlib.suppress(ProcessLookupError):
            os.kill(e["pid"], signal.SIGKILL)
    ledger_topic = f"{out}.sparkonce-ledger"
    open_markers = [
        r for r in _open_on_ledger(kafka_broker.bootstrap, ledger_topic) if r["type"] == "marker"
    ]
    assert len(open_markers) >= len(paused), f"the premise: open markers {open_markers}"

    second = Driver(pipeline_file, tmp_path / "run2.log")
    drivers.append(second.start())
    code = run_driver(second)
    assert code == 0, f"run 2 exited {code}:\n{second.log_tail()}"
    assert "aborted the open Kafka transaction of transactional id" in second.full_log()
    entries = _ledger(f"kafka://{kafka_broker.bootstrap}/{out}")
    assert entries and {e.epoch for e in entries} == {2}, entries
    started = second.started_wall + second.phases()["run-started"]
    first_commit = entries[0].committed_at.timestamp() - started
    assert first_commit < 30, f"run 2 committed its first batch {first_commit:.0f} s after start"
    got = _read_committed(kafka_broker.bootstrap, out)
    assert sorted(v for (_, _, v) in got.elements()) == list(range(1, RECORDS + 1))
    assert set(got.values()) == {1}
    assert check_chain(e.ranges for e in entries) == []
    assert sum(e.row_count for e in entries) == RECORDS
