"""KafkaProducer and the ``sparkonce kafka`` commands against the real single-node broker."""

from __future__ import annotations

import io
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from sparkonce import KafkaProducer
from sparkonce.cli import EXIT_UNAVAILABLE, EXIT_USAGE, main
from sparkonce.errors import ConfigError, TopicNotFoundError
from sparkonce.kafka import RECORD_ID_HEADER, KafkaDeliveryError, KafkaUnavailableError
from tests.services.kafka import KafkaBroker

pytestmark = pytest.mark.kafka

UNREACHABLE = "127.0.0.1:1"


@dataclass
class Got:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str | bytes | None]


def read_all(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> list[Got]:
    """Every committed record of ``topic``, per partition in offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[Got] = []
    at_eof: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(at_eof) < partitions:
            assert time.monotonic() < deadline, f"read_all({topic}) timed out"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err, partition = msg.error(), msg.partition()
            assert partition is not None, msg
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                at_eof.add(partition)
                continue
            at_eof.discard(partition)
            offset, headers = msg.offset(), msg.headers() or []
            # A consumed record has an offset, and its headers are (name, value) pairs.
            assert offset is not None and isinstance(headers, list), msg
            out.append(Got(partition, offset, msg.key(), msg.value(), dict(headers)))
    finally:
        consumer.close()
    return sorted(out, key=lambda g: (g.partition, g.offset))


def murmur2(data: bytes) -> int:
    """Kafka's Java ``Utils.murmur2`` (as an unsigned 32-bit int)."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    whole = len(data) // 4 * 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    rest = data[whole:]
    if len(rest) == 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if rest:
        h ^= rest[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def java_partition(key: bytes, partitions: int) -> int:
    """The Java client's default partition for a keyed record."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def test_murmur2_matches_kafka_test_vectors() -> None:
    def signed(x: int) -> int:
        return x - (1 << 32) if x >= 1 << 31 else x

    assert signed(murmur2(b"21")) == -973932308
    assert signed(murmur2(b"foobar")) == -790332482
    assert signed(murmur2(b"a-little-bit-long-string")) == -985981536
    assert signed(murmur2(b"a-little-bit-longer-string")) == -1486304829
    assert signed(murmur2(b"abc")) == 479470107


# -- the producer ---------------------------------------------------------------------------
def test_records_arrive_with_keys_values_and_record_ids(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("kp", partitions=3)
    with KafkaProducer(kafka_broker.bootstrap, topic) as producer:
        assert producer.partitions == 3
        producer.send(b"v-bytes", b"k-bytes", record_id="rid-1")
        producer.send("v-str", "k-str", record_id="rid-2")
        producer.send("no-key", record_id="rid-3")
        producer.send(b"no-id", "k-str")
        assert producer.flush(30) == 4
        producer.send("after-flush", "k-str", record_id="rid-5")
    assert producer.delivered == 5 and producer.failed == 0
    got = read_all(kafka_broker.bootstrap, topic, 3)
    assert len(got) == 5
    by_value = {g.value: g for g in got}
    assert by_value[b"v-bytes"].key == b"k-bytes"
    assert by_value[b"v-str"].key == b"k-str"
    assert by_value[b"no-key"].key is None
    assert {v: g.headers.get(RECORD_ID_HEADER) for v, g in by_value.items()} == {
        b"v-bytes": b"rid-1",
        b"v-str": b"rid-2",
        b"no-key": b"rid-3",
        b"no-id": None,
        b"after-flush": b"rid-5",
    }
    # Same key, same partition, in send order.
    same = [g.value for g in got if g.key == b"k-str"]
    assert same == [b"v-str", b"no-id", b"after-flush"]


def test_same_key_goes_to_the_java_clients_partition(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("kp-keys", partitions=5)
    keys = [f"user-{i}".encode() for i in range(40)]
    with KafkaProducer(kafka_broker.bootstrap, topic) as producer:
        for round_ in range(3):
            for key in keys:
                producer.send(f"{key.decode()}:{round_}", key)
    got = read_all(kafka_broker.bootstrap, topic, 5)
    assert len(got) == 120
    partitions_of: dict[bytes, set[int]] = {}
    for g in got:
        assert g.key is not None
        partitions_of.setdefault(g.key, set()).add(g.partition)
    assert all(len(ps) == 1 for ps in partitions_of.values())
    assert {k: ps.pop() for k, ps in partitions_of.items()} == {
        k: java_partition(k, 5) for k in keys
    }
    assert len({java_partition(k, 5) for k in keys}) > 1  # the keys really spread out
    for key in keys:  # per key, send order is kept
        values = [g.value for g in got if g.key == key]
        assert values == [f"{key.decode()}:{r}".encode() for r in range(3)]


def test_explicit_partition(kafka_broker: KafkaBroker, kafka_topic: Callable[..., str]) -> None:
    topic = kafka_topic("kp-part", partitions=3)
    with KafkaProducer(kafka_broker.bootstrap, topic) as producer:
        producer.send("a", "k", partition=2)
        producer.send("b", partition=2)
    got = read_all(kafka_broker.bootstrap, topic, 3)
    assert [(g.partition, g.value) for g in got] == [(2, b"a"), (2, b"b")]


def test_a_given_timestamp_is_the_records_timestamp(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    """A re-sent record keeps its original timestamp; without one the broker sees now."""
    topic = kafka_topic("kp-ts", partitions=1)
    given = 1_704_067_200_123  # 2024-01-01T00:00:00.123Z
    before_ms = int(time.time() * 1000)
    with KafkaProducer(kafka_broker.bootstrap, topic) as producer:
        producer.send("old", record_id="r1", timestamp_ms=given)
        producer.send("new", record_id="r2")
        for bad in (-1, 1.5, True, "1704067200123"):
            with pytest.raises(ConfigError, match="timestamp_ms must be milliseconds"):
                producer.send("x", timestamp_ms=bad)  # type: ignore[arg-type]
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "group.id": f"test-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    stamps: dict[bytes, tuple[int, int]] = {}
    deadline = time.monotonic() + 30
    try:
        while len(stamps) < 2 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                value = msg.value()
                assert value is not None, msg
                stamps[value] = msg.timestamp()
    finally:
        consumer.close()
    from confluent_kafka import TIMESTAMP_CREATE_TIME

    assert stamps[b"old"] == (TIMESTAMP_CREATE_TIME, given)
    kind, now_ms = stamps[b"new"]
    assert kind == TIMESTAMP_CREATE_TIME and now_ms >= before_ms
    assert [g.value for g in read_all(kafka_broker.bootstrap, topic, 1)] == [b"old", b"new"]


def test_flush_reports_a_failed_delivery(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("kp-fail", partitions=2)
    with KafkaProducer(kafka_broker.bootstrap, topic) as producer:
        # The new producer does not know the topic's partitions yet, so librdkafka queues the
        # record and fails it in a delivery report once it has the metadata.
        producer.send("lost", "k", record_id="bad-1", partition=99)
        producer.send("good-1", "k", record_id="ok-1")
        producer.send("good-2", record_id="ok-2")
        with pytest.raises(KafkaDeliveryError) as info:
            producer.flush(30)
        err = info.value
        assert [(f.record_id, f.partition, f.key) for f in err.failures] == [("bad-1", 99, b"k")]
        assert err.delivered == 2 and not err.retryable
        text = str(err)
        assert "1 record was not delivered" in text and topic in text
        assert "'bad-1'" in text and "partition 99" in text and "Unknown partition" in text
        assert kafka_broker.bootstrap in text
        assert producer.flush(10) == 0  # each failure is reported once
        # Now the producer knows the topic: the same mistake is refused at send().
        with pytest.raises(KafkaDeliveryError, match="partition 99") as info:
            producer.send("lost-too", record_id="bad-2", partition=99)
        assert [f.record_id for f in info.value.failures] == ["bad-2"]
        producer.send("good-3", record_id="ok-3")
    assert (producer.delivered, producer.failed) == (3, 2)
    got = read_all(kafka_broker.bootstrap, topic, 2)
    assert Counter(g.headers[RECORD_ID_HEADER] for g in got) == Counter([b"ok-1", b"ok-2", b"ok-3"])


def test_a_failure_is_not_hidden_by_the_context_manager(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("kp-exit", partitions=1)
    with (
        pytest.raises(KafkaDeliveryError, match="'bad'"),
        KafkaProducer(kafka_broker.bootstrap, topic) as producer,
    ):
        producer.send("x", record_id="bad", partition=5)
    assert producer.failed == 1


def test_missing_topic(kafka_broker: KafkaBroker) -> None:
    with pytest.raises(TopicNotFoundError) as info:
        KafkaProducer(kafka_broker.bootstrap, "no-such-topic-xyz")
    text = str(info.value)
    assert "'no-such-topic-xyz' does not exist" in text and kafka_broker.bootstrap in text
    assert "sparkonce kafka create" in text


def test_unreachable_broker_is_named() -> None:
    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError) as info:
        KafkaProducer(UNREACHABLE, "t", client_config={"sasl.password": "hunter2"}, timeout=2.0)
    assert time.monotonic() - started < 15
    assert UNREACHABLE in str(info.value) and "hunter2" not in str(info.value)
    assert info.value.retryable


def test_bad_arguments_are_config_errors(
    kafka_broker: KafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    with pytest.raises(ConfigError, match=r"enable\.idempotence=true"):
        KafkaProducer(UNREACHABLE, "t", client_config={"enable.idempotence": False})
    with pytest.raises(ConfigError, match="acks=all"):
        KafkaProducer(UNREACHABLE, "t", client_config={"acks": "1"})
    with pytest.raises(ConfigError, match="transactional"):
        KafkaProducer(UNREACHABLE, "t", client_config={"transactional.id": "x"})
    with pytest.raises(ConfigError, match="not host:port"):
        KafkaProducer("no-port", "t")
    topic = kafka_topic("kp-args", partitions=1)
    with KafkaProducer(kafka_broker.bootstrap, topic, client_config={"acks": "all"}) as p:
        with pytest.raises(ConfigError, match="partition must be >= 0"):
            p.send("x", partition=-1)
        with pytest.raises(ConfigError, match="value must be bytes or str"):
            p.send(42)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="record_id"):
            p.send("x", record_id="")
        assert "hunter2" not in repr(p)
    with pytest.raises(ConfigError, match="closed"):
        p.send("x")


# -- the CLI --------------------------------------------------------------------------------
def test_cli_create_produce_describe_tail(
    kafka_broker: KafkaBroker,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    b = kafka_broker.bootstrap
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    assert main(["kafka", "create", b, topic, "--partitions", "2"]) == 0
    assert f"created Kafka topic {topic!r} with 2 partitions" in capsys.readouterr().out
    assert main(["kafka", "create", b, topic, "--partitions", "2"]) == 0
    assert "already exists" in capsys.readouterr().out

    argv = ["kafka", "produce", b, topic, "--key", "k1"]
    assert main([*argv, "--value", "a", "--value", "b", "--value", "c"]) == 0
    assert "delivered 3 records" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("k2=x\nk2=y=z\nk3=w\n"))
    assert main(["kafka", "produce", b, topic, "--separator", "="]) == 0
    assert "delivered 3 records" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("p\nq\n"))
    assert main(["kafka", "produce", b, topic, "--partition", "1"]) == 0
    assert "delivered 2 records" in capsys.readouterr().out

    got = read_all(b, topic, 2)
    assert len(got) == 8
    pairs = [(g.key, g.value) for g in got if g.key in (b"k1", b"k2", b"k3")]
    assert sorted(pairs) == sorted(
        [(b"k1", b"a"), (b"k1", b"b"), (b"k1", b"c"), (b"k2", b"x"), (b"k2", b"y=z"), (b"k3", b"w")]
    )
    ends = {p: sum(1 for g in got if g.partition == p) for p in (0, 1)}

    assert main(["kafka", "describe", b, topic]) == 0
    out = capsys.readouterr().out
    rows = [
        [c.strip() for c in ln.split("│") if c.strip()]
        for ln in out.splitlines()
        if ln.startswith("│")
    ]
    assert rows == [["0", "0", str(ends[0])], ["1", "0", str(ends[1])]]
    assert "2 partitions" in out and "read_committed" in out

    assert main(["kafka", "tail", b, topic, "-n", "2", "--partition", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split("\t")[-1] for ln in lines] == ["p", "q"]
    assert all(ln.split("\t")[0] == "1" for ln in lines)
    assert main(["kafka", "tail", b, topic, "-n", "100"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert sorted(ln.split("\t")[-1] for ln in lines) == sorted(
        g.value.decode() for g in got if g.value
    )


def test_cli_shows_only_committed_records(
    kafka_broker: KafkaBroker,
    kafka_topic: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    b = kafka_broker.bootstrap
    topic = kafka_topic("cli-txn", partitions=1)
    txn = Producer(
        {"bootstrap.servers": b, "transactional.id": f"t-{uuid.uuid4()}", "log_level": 0}
    )
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, b"aborted", partition=0)  # offset 0; abort marker at 1
    assert txn.flush(30) == 0  # written, not just queued (an abort purges the queue)
    txn.abort_transaction(30)
    txn.begin_transaction()
    txn.produce(topic, b"committed", partition=0)  # offset 2; commit marker at 3
    txn.commit_transaction(30)
    txn.begin_transaction()
    txn.produce(topic, b"open", partition=0)  # offset 4, in a transaction still open
    assert txn.flush(30) == 0
    try:
        assert main(["kafka", "describe", b, topic]) == 0
        row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("│"))
        assert [c.strip() for c in row.split("│") if c.strip()] == ["0", "0", "4"]
        assert main(["kafka", "tail", b, topic, "-n", "10"]) == 0
        assert capsys.readouterr().out.splitlines() == ["0\t2\t\t\tcommitted"]
    finally:
        txn.abort_transaction(30)


def test_cli_bad_input_writes_nothing(
    kafka_broker: KafkaBroker,
    kafka_topic: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    b = kafka_broker.bootstrap
    topic = kafka_topic("cli-bad", partitions=1)
    argv = ["kafka", "produce", b, topic, "--separator", "=", "--value", "a=1", "--value", "x"]
    assert main(argv) == EXIT_USAGE
    assert "'x' has no separator '='" in capsys.readouterr().err
    assert read_all(b, topic, 1) == []  # the good line was not sent either
    assert main(["kafka", "produce", b, topic, "--value", "v", "--config", "sasl.pw"]) == 2
    assert "--config #1 is not KEY=VALUE" in capsys.readouterr().err
    assert main(["kafka", "tail", b, f"{topic}-missing"]) == 2  # bad input, as documented
    assert "does not exist" in capsys.readouterr().err
    assert main(["kafka", "produce", b, topic, "--value", "v", "--partition", "3"]) == 1
    assert "Unknown partition" in capsys.readouterr().err


def test_cli_exit_codes_for_unreachable_and_bad_bootstrap(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (
        ["kafka", "describe", UNREACHABLE, "t", "--timeout", "2"],
        ["kafka", "produce", UNREACHABLE, "t", "--value", "v", "--timeout", "2"],
        ["kafka", "create", UNREACHABLE, "t", "--timeout", "2", "--config", "sasl.password=s3cret"],
    ):
        assert main(argv) == EXIT_UNAVAILABLE, argv
        err = capsys.readouterr().err
        assert "unavailable" in err and UNREACHABLE in err and "s3cret" not in err
    assert main(["kafka", "tail", "not a host:port", "t"]) == EXIT_USAGE
    assert "not host:port" in capsys.readouterr().err
    assert main(["kafka", "create", "host:99999", "t"]) == EXIT_USAGE
