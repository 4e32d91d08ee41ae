"""Which Kafka client errors are transient, what their message says, and how long
``KafkaConnection.retrying`` rides them out (issue 44 item 2)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from sparkonce.errors import KafkaUnavailableError, StoreUnavailableError
from sparkonce.kafka.client import (
    FATAL,
    LEADER_MOVED,
    NO_ANSWER,
    TOPIC_NOT_YET_KNOWN,
    TRANSACTION_OPEN,
    KafkaConnection,
    classify,
)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (KafkaError._TIMED_OUT, NO_ANSWER),
        (KafkaError._TRANSPORT, NO_ANSWER),
        (KafkaError._ALL_BROKERS_DOWN, NO_ANSWER),
        (KafkaError.REQUEST_TIMED_OUT, NO_ANSWER),
        (KafkaError._DESTROY_BROKER, LEADER_MOVED),
        (KafkaError.NOT_LEADER_FOR_PARTITION, LEADER_MOVED),
        (KafkaError.LEADER_NOT_AVAILABLE, LEADER_MOVED),
        (KafkaError.OFFSET_NOT_AVAILABLE, LEADER_MOVED),
        (KafkaError.NOT_ENOUGH_REPLICAS, LEADER_MOVED),
        (KafkaError.NOT_COORDINATOR, LEADER_MOVED),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, None),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, None),
        (KafkaError._INVALID_ARG, None),
    ],
)
def test_classify_says_which_errors_are_transient(code: int, kind: str | None) -> None:
    assert classify(KafkaException(KafkaError(code))) == kind
    assert classify(KafkaError(code)) == kind


def test_a_fatal_error_is_never_transient() -> None:
    assert classify(KafkaException(KafkaError(KafkaError._TIMED_OUT, fatal=True))) == FATAL
    assert classify(ValueError("not a Kafka error")) is None


def test_the_message_tells_no_answer_from_a_moved_leader_from_an_open_transaction() -> None:
    conn = KafkaConnection("broker1:9092,broker2:9092", {"sasl.password": "s3cret"})
    down = conn.unavailable("reading x", KafkaException(KafkaError(KafkaError._TRANSPORT)))
    moved = conn.unavailable(
        "reading x", KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "s3cret"))
    )
    held = conn.unavailable("waiting for ledger offset 39", kind=TRANSACTION_OPEN)
    assert (down.kind, moved.kind, held.kind) == (NO_ANSWER, LEADER_MOVED, TRANSACTION_OPEN)
    assert "did not answer while reading x" in str(down)
    assert "answered, but the leader moved" in str(moved) and "did not answer" not in str(moved)
    assert "s3cret" not in str(moved)
    assert "a transaction is still open while waiting for ledger offset 39" in str(held)
    assert "transaction.timeout.ms" in str(held) and "did not answer" not in str(held)
    for error in (down, moved, held):
        assert "broker1:9092,broker2:9092" in str(error)
        assert isinstance(error, StoreUnavailableError)  # exit 4


def test_retrying_rides_out_transient_errors_until_an_answer() -> None:
    conn = KafkaConnection("broker:9092", retry_s=30)
    errors = [
        conn.unavailable("q", KafkaException(KafkaError(KafkaError._DESTROY_BROKER))),
        conn.unavailable("q", KafkaException(KafkaError(KafkaError._TIMED_OUT))),
    ]
    calls: list[int] = []

    def query() -> str:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return "answer"

    assert conn.retrying("querying", query) == "answer"
    assert len(calls) == 3


def test_retrying_raises_other_errors_at_once() -> None:
    conn = KafkaConnection("broker:9092", retry_s=30)
    calls: list[int] = []

    def query() -> None:
        calls.append(1)
        raise conn.unavailable("q", kind=TRANSACTION_OPEN)

    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match="transaction is still open"):
        conn.retrying("querying", query)
    assert calls == [1] and time.monotonic() - started < 1


def test_retrying_gives_up_at_its_deadline_and_says_how_long_it_tried() -> None:
    conn = KafkaConnection("broker:9092", retry_s=1.5)
    calls: list[int] = []

    def query() -> None:
        calls.append(1)
        raise conn.unavailable("q", KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE)))

    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError) as info:
        conn.retrying("querying offsets", query)
    assert 1.0 <= time.monotonic() - started <= 3.0
    assert len(calls) >= 3
    assert info.value.kind == LEADER_MOVED
    assert "after retrying querying offsets for 2 s" in str(info.value)


def test_the_retry_deadline_is_checked() -> None:
    from sparkonce.errors import ConfigError

    with pytest.raises(ConfigError, match="retry deadline"):
        KafkaConnection("broker:9092", retry_s=-1)


class _NewTopicAdmin:
    """An admin client of a cluster where the topic was just created: the broker asked
    first does not know it yet (seen on the 3-node cluster, under load, on a driver's
    start: the run exited 4 with 'did not answer ... UNKNOWN_TOPIC_OR_PART')."""

    def __init__(self, unknown_for: int) -> None:
        self.unknown_for = unknown_for

    def list_topics(self, topic: str, timeout: float) -> object:
        from types import SimpleNamespace

        parts = {i: SimpleNamespace(replicas=[1, 2, 3]) for i in range(1)}
        meta = SimpleNamespace(partitions=parts, error=None)
        return SimpleNamespace(topics={topic: meta}, brokers={1: 0, 2: 0, 3: 0})

    def describe_configs(self, resources: list[object]) -> dict[object, object]:
        from concurrent.futures import Future
        from types import SimpleNamespace

        done: Future[object] = Future()
        if self.unknown_for > 0:
            self.unknown_for -= 1
            done.set_exception(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
        else:
            done.set_result({"min.insync.replicas": SimpleNamespace(value="2")})
        return {resources[0]: done}


def test_a_topic_the_broker_does_not_know_yet_is_retried_with_its_own_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn = KafkaConnection("broker:9092", retry_s=30)
    admin = _NewTopicAdmin(unknown_for=1)
    monkeypatch.setattr(KafkaConnection, "admin", lambda _self: admin)
    with pytest.raises(KafkaUnavailableError, match="does not know the topic yet") as caught:
        conn.replication("out.sparkonce-ledger")
    assert caught.value.kind == TOPIC_NOT_YET_KNOWN and "did not answer" not in str(caught.value)

    admin.unknown_for = 2
    assert conn.retrying("reading", lambda: conn.replication("out.sparkonce-ledger")) == (3, 2)


def test_the_ledger_store_start_check_rides_out_a_topic_not_yet_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from sparkonce.ledger.kafka_topic import KafkaLedgerStore

    conn = KafkaConnection("broker:9092", retry_s=30)
    admin = _NewTopicAdmin(unknown_for=2)
    monkeypatch.setattr(KafkaConnection, "admin", lambda _self: admin)
    monkeypatch.setattr(
        KafkaConnection, "cluster_defaults", lambda _self: SimpleNamespace(brokers=3)
    )
    store = KafkaLedgerStore.__new__(KafkaLedgerStore)
    store.conn, store.ledger_topic = conn, "out.sparkonce-ledger"
    assert store.replication_warning() is None  # 3 replicas, min.insync.replicas 2
