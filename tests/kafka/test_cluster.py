"""sparkonce on a replicated cluster: three KRaft nodes, replication factor 3 everywhere and
``min.insync.replicas=2`` (tests/services/kafka.py ``start_cluster``), as issue 44 used.

One cluster per module (about 11 s to start). Brokers are killed with SIGKILL, as a machine
failure would, and started again on the same ports with their data.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services import kafka as kafka_service

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kafka_service.KafkaCluster]:
    workdir: Path = tmp_path_factory.mktemp("kafka-cluster")
    cluster = kafka_service.start_cluster(workdir)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def healthy(kafka_cluster: kafka_service.KafkaCluster) -> kafka_service.KafkaCluster:
    """The module's cluster with every node running and every replica in sync (a test that
    killed a node may have failed before it started it again)."""
    for node_id, broker in kafka_cluster.nodes.items():
        if broker.pid is None:
            kafka_cluster.start_node(node_id)
    kafka_cluster.wait_in_sync()
    return kafka_cluster


def test_the_cluster_has_three_nodes_and_replicates_topics_three_times(
    healthy: kafka_service.KafkaCluster,
) -> None:
    healthy.create_topic("rf-default", 2)
    assert healthy.replication_factor("rf-default") == 3
    assert len(healthy.admin().list_topics(timeout=5).brokers) == 3
    assert healthy.controller() in healthy.nodes
    assert healthy.coordinator("sparkonce.p.out.driver") in healthy.nodes


def test_java_string_hash_is_javas() -> None:
    # Values of Java's "...".hashCode().
    assert kafka_service.java_string_hash("") == 0
    assert kafka_service.java_string_hash("abc") == 96354
    assert kafka_service.java_string_hash("sparkonce.p.out.driver") == _java_hash_by_hand(
        "sparkonce.p.out.driver"
    )
    assert kafka_service.java_string_hash("polygenelubricants") == -(2**31)


def _java_hash_by_hand(text: str) -> int:
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) % 2**32
    return h - 2**32 if h >= 2**31 else h


# --- item 1: topics replicated as the cluster says ----------------------------------------------


def test_topics_sparkonce_creates_have_the_clusters_replication_factor(
    healthy: kafka_service.KafkaCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    from sparkonce.cli import main
    from sparkonce.sinks.kafka import KafkaSink

    assert main(["kafka", "create", healthy.bootstrap, "rf-out", "--partitions", "2"]) == 0
    assert "2 partitions and 3 replicas" in capsys.readouterr().out
    sink = KafkaSink(healthy.bootstrap, "rf-out")
    sink.open_store()
    try:
        assert sink.store.replication_note is None
    finally:
        sink.close_store()
    # Kafka's own DescribeTopics and DescribeConfigs, not sparkonce's reading of them.
    assert healthy.replication_factor("rf-out") == 3
    assert healthy.replication_factor("rf-out.sparkonce-ledger") == 3
    assert _topic_config(healthy, "rf-out.sparkonce-ledger", "min.insync.replicas") == "2"
    assert _topic_config(healthy, "rf-out.sparkonce-ledger", "retention.ms") == "-1"

    assert main(["kafka", "create", healthy.bootstrap, "rf-one", "--replication-factor", "1"]) == 0
    assert healthy.replication_factor("rf-one") == 1


def test_a_ledger_topic_with_one_replica_on_three_brokers_gets_a_warning(
    healthy: kafka_service.KafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    from sparkonce.sinks.kafka import KafkaSink

    healthy.create_topic("rf-thin", 1)
    sink = KafkaSink(healthy.bootstrap, "rf-thin", ledger_replication_factor=1)
    with caplog.at_level("WARNING", logger="sparkonce.ledger.kafka_topic"):
        sink.open_store()
    sink.close_store()
    note = sink.store.replication_note
    assert note is not None and "'rf-thin.sparkonce-ledger'" in note
    assert "1 replica and min.insync.replicas=1 on a cluster of 3 brokers" in note
    assert note in caplog.text
    assert healthy.replication_factor("rf-thin.sparkonce-ledger") == 1
    # explain shows it (it connects to nothing; the sink opened in this process).
    from sparkonce.pipeline.explain import _kafka_ledger_part

    part = _kafka_ledger_part("output", sink)
    assert part.verdict == "replicated less than the cluster allows" and part.why == note


def _topic_config(cluster: kafka_service.KafkaCluster, topic: str, name: str) -> str:
    from confluent_kafka.admin import ConfigResource

    admin = cluster.admin()
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return str(admin.describe_configs([resource])[resource].result(timeout=10)[name].value)


# --- item 2: retries across leader changes and broker restarts ---------------------------------


# In the rotation: make test's Kafka-to-Kafka scenario below kills a leader mid-run too.
@pytest.mark.crash_lane
def test_offset_queries_ride_out_the_kill_of_the_partitions_leader(
    healthy: kafka_service.KafkaCluster,
) -> None:
    """The leader of the partition being asked dies (SIGKILL): the query waits for the new
    leader instead of failing with "did not answer"."""
    from confluent_kafka import Producer

    from sparkonce.kafka.client import KafkaConnection
    from sparkonce.kafka.consumer import KafkaReader

    healthy.create_topic("moving", 1)
    producer = Producer({"bootstrap.servers": healthy.bootstrap, "enable.idempotence": True})
    for i in range(50):
        producer.produce("moving", str(i).encode(), partition=0)
    assert producer.flush(30) == 0
    conn = KafkaConnection(healthy.bootstrap, retry_s=60)
    with KafkaReader(conn, timeout=2.0) as reader:
        assert reader.watermarks("moving", 0) == (0, 50)
        leader = healthy.leader("moving", 0)
        healthy.kill(leader)
        # Asked at once: the dead leader is still the one in the clients' metadata.
        assert reader.watermarks("moving", 0) == (0, 50)
        assert [int(m.value()) for m in reader.read("moving", 0, 0, 50)] == list(range(50))
    assert healthy.leader("moving", 0) != leader


# --- item 5: a Kafka-to-Kafka run through the kill of a leader and of a coordinator ------------


@pytest.mark.campaign_lane  # in the rotation: make test's budget (66 s under load)
def test_a_kafka_to_kafka_run_rides_out_killed_leader_and_coordinator(
    healthy: kafka_service.KafkaCluster, spark: Any, tmp_path: Path
) -> None:
    """Between batches of one run: SIGKILL the leader of an output partition, run batches
    without it, start it again (while the run goes on); then SIGKILL the transaction
    coordinator of the driver's transactional id, the same way. The run ends with no error,
    and an independent read_committed consumer reads every input value exactly once. About
    35 to 65 s here, by the machine's load (two kills' stalls of about 6 s each, and the
    query's start)."""
    from confluent_kafka import Producer

    from sparkonce import KafkaSink, KafkaSource, Pipeline
    from sparkonce.ledger.kafka_topic import transactional_id
    from sparkonce.pipeline.runner import run_pipeline

    healthy.create_topic("k2k-in", 3)
    healthy.create_topic("k2k-out", 3)
    producer = Producer({"bootstrap.servers": healthy.bootstrap, "enable.idempotence": True})
    values = [f"v{i}" for i in range(1050)]  # 7 batches of 3 x 50
    for i, value in enumerate(values):
        producer.produce("k2k-in", value.encode(), key=str(i).encode())
    assert producer.flush(30) == 0

    kills: list[tuple[int, str, int]] = []  # (batch, role, node)
    restarts: list[threading.Thread] = []  # a killed node starts again while the run goes on
    batches = itertools.count()

    def restart(node: int) -> None:
        thread = threading.Thread(target=healthy.start_node, args=(node,), daemon=True)
        thread.start()
        restarts.append(thread)

    def on_batch(report: Any) -> None:
        seq = next(batches)
        if seq == 0:
            node = healthy.leader("k2k-out", 0)
            healthy.kill(node)
            kills.append((seq, "leader of k2k-out[0]", node))
        elif seq == 1:
            restart(kills[-1][2])
        elif seq == 3:
            restarts[-1].join()
            healthy.wait_in_sync()  # the next kill leaves min.insync.replicas in sync
            node = healthy.coordinator(transactional_id("k2k", "k2k-out", "driver"))
            healthy.kill(node)
            kills.append((seq, "driver's transaction coordinator", node))
        elif seq == 4:
            restart(kills[-1][2])

    pipeline = Pipeline(
        name="k2k",
        source=KafkaSource(healthy.bootstrap, "k2k-in", max_records_per_partition=50),
        sink=KafkaSink(healthy.bootstrap, "k2k-out", transaction_timeout_ms=20_000),
        checkpoint=tmp_path / "chk",
        transform=lambda df: df.select("key", "value"),
    )
    report = run_pipeline(pipeline, spark, on_batch=on_batch)  # raises on a driver exit
    assert [k[1] for k in kills] == ["leader of k2k-out[0]", "driver's transaction coordinator"]
    for thread in restarts:
        thread.join()
    assert report.rows_committed == len(values) and report.batches_committed >= 7
    assert sorted(_read_committed(healthy, "k2k-out")) == sorted(values)


def _read_committed(cluster: kafka_service.KafkaCluster, topic: str) -> list[str]:
    """Every value of ``topic`` as Kafka's own consumer reads it at read_committed."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "tests-independent-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        partitions = list(cluster.partitions(topic))
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        values: list[str] = []
        done: set[int] = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 60
        while len(done) < len(partitions) and time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=1.0):
                if m.error() is None:
                    values.append((m.value() or b"").decode())
            for tp in consumer.position([TopicPartition(topic, p) for p in partitions]):
                if tp.offset >= ends[tp.partition]:
                    done.add(tp.partition)
        assert len(done) == len(partitions), f"read {topic} to {ends} within 60 s"
        return values
    finally:
        consumer.close()


# --- item 5: sparkonce verify --faults broker-kill ------------------------------------------------


@pytest.mark.campaign_lane  # the reference, the oracle and a trial: three Spark drivers
def test_verify_kills_a_broker_of_the_cluster_and_the_run_rides_it_out(
    healthy: kafka_service.KafkaCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sparkonce verify --faults broker-kill`` with the test services' own commands as the
    user's: the trial kills one node (SIGKILL) while the run goes on, starts it again, and
    passes: the run finished with no exit and its output equals the failure-free run's."""
    import json
    import sys

    from confluent_kafka import Producer

    from sparkonce.cli import main

    healthy.create_topic("bk-in", 3)
    healthy.create_topic("bk-out", 3)
    producer = Producer({"bootstrap.servers": healthy.bootstrap, "enable.idempotence": True})
    for i in range(900):  # 6 batches of 3 x 50
        producer.produce("bk-in", f"v{i}".encode(), key=str(i).encode())
    assert producer.flush(30) == 0
    pipeline = tmp_path / "pipeline.py"
    pipeline.write_text(
        "from sparkonce import KafkaSink, KafkaSource, Pipeline\n"
        "pipeline = Pipeline(\n"
        "    name='bk',\n"
        f"    source=KafkaSource({healthy.bootstrap!r}, 'bk-in', max_records_per_partition=50),\n"
        f"    sink=KafkaSink({healthy.bootstrap!r}, 'bk-out'),\n"
        f"    checkpoint={str(tmp_path / 'chk')!r},\n"
        "    transform=lambda df: df.select('key', 'value'),\n"
        ")\n"
    )
    services = f"{sys.executable} -m tests.services.kafka"
    pids = {n: b.pid for n, b in healthy.nodes.items()}
    out = tmp_path / "out"
    code = main(
        [
            "verify",
            str(pipeline),
            "--trials",
            "1",
            "--faults",
            "broker-kill",
            "--broker-nodes",
            ",".join(str(n) for n in healthy.nodes),
            "--broker-kill-command",
            f"{services} kill-node {healthy.workdir} {{node}}",
            "--broker-start-command",
            f"{services} start-node {healthy.workdir} {{node}}",
            "--broker-down",
            "3",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err[-3000:]
    (trial,) = json.loads((out / "verify.json").read_text())["trials"]
    assert trial["fault"]["kind"] == "broker-kill" and trial["fault"]["node"] in {"1", "2", "3"}
    assert trial["passed"] and trial["fault_fired"] and trial["driver_runs"] == 1, trial
    assert (trial["lost_rows"], trial["duplicated_rows"]) == (0, 0)
    # The node the commands killed was started again (a new process); the others ran on.
    for node_id, broker in healthy.nodes.items():
        assert broker.workdir is not None
        broker.pid = kafka_service.running_pid(broker.workdir)  # started by the command
        assert broker.pid is not None, f"node {node_id} is not running"
    restarted = {str(n) for n, b in healthy.nodes.items() if b.pid != pids[n]}
    assert restarted == {trial["fault"]["node"]}
