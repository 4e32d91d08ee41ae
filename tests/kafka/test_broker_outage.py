"""A killed broker is an unreachable store (exit 4), never a missing topic (exit 2).

A broker of this module's own (the session's is shared), killed with SIGKILL as a machine
failure would: the ledger topic's reads must raise KafkaUnavailableError. A topic that
truly does not exist is still named as such while the cluster answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkonce.cli import EXIT_UNAVAILABLE, _report
from sparkonce.errors import KafkaUnavailableError, TopicNotFoundError
from sparkonce.kafka.client import KafkaConnection
from sparkonce.kafka.consumer import KafkaReader
from sparkonce.ledger.kafka_topic import KafkaLedgerStore
from tests.services import kafka as kafka_service

pytestmark = pytest.mark.kafka


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[kafka_service.KafkaBroker]:
    workdir = tmp_path / "broker"
    try:
        yield kafka_service.start(workdir)
    finally:
        kafka_service.stop(workdir, timeout=0.0)


def test_a_killed_broker_is_unavailable_not_a_missing_topic(
    own_broker: kafka_service.KafkaBroker,
) -> None:
    own_broker.create_topic("out", 1)
    with KafkaReader(KafkaConnection(own_broker.bootstrap, {}, retry_s=3), timeout=3.0) as reader:
        with pytest.raises(TopicNotFoundError):  # the cluster answered: truly missing
            reader.watermarks("no-such-topic", 0)
        reader.watermarks("out", 0)

        own_broker.kill()
        with pytest.raises(KafkaUnavailableError) as info:
            reader.watermarks("out", 0)
    assert own_broker.bootstrap in str(info.value)


@pytest.mark.crash_lane  # about 30 s: the ledger's reads wait out their 10 s timeouts
def test_the_ledger_of_a_killed_broker_is_unavailable_exit_4(
    own_broker: kafka_service.KafkaBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    own_broker.create_topic("out", 1)
    conn = KafkaConnection(own_broker.bootstrap, {}, retry_s=3)
    store = KafkaLedgerStore(conn, "out.sparkonce-ledger", topic="out")
    store.open()
    store.acquire("p", "kafka://src/events")
    assert store.entries("p") == []

    own_broker.kill()
    with pytest.raises(KafkaUnavailableError) as info:
        store.refresh("p")  # what the run's resume point and each commit read first
    store.close()
    assert _report(info.value) == EXIT_UNAVAILABLE
    assert "sparkonce: unavailable: Kafka at bootstrap servers" in capsys.readouterr().err
