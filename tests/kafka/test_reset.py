"""``sparkonce reset`` on a Kafka sink, against the test broker: the ledger topic is emptied
(owner records included) while the output topic's records stay, and a ledger topic that
also holds another pipeline's progress is refused. The epochs are taken by Python processes
that have exited, as a finished run leaves them. No Spark."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sparkonce.cli import main
from sparkonce.cli.common import EXIT_USAGE
from sparkonce.sinks.inspect import inspector_for
from sparkonce.sinks.kafka import KafkaSink

if TYPE_CHECKING:
    from tests.services.kafka import KafkaBroker

SRC = Path(__file__).resolve().parents[2] / "src"

ACQUIRE = """
import sys
from sparkonce.sinks.kafka import kafka_sink_from_uri

with kafka_sink_from_uri(sys.argv[1]) as sink:
    sink.acquire(sys.argv[2])
"""


def _acquire_in_a_process_that_exits(url: str, pipeline: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run([sys.executable, "-c", ACQUIRE, url, pipeline], env=env, check=True, timeout=120)


def test_kafka_reset_empties_the_ledger_topic_and_keeps_the_output(
    kafka_broker: KafkaBroker,
    kafka_topic: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = kafka_topic("reset", partitions=1)
    url = f"kafka://{kafka_broker.bootstrap}/{topic}"
    assert main(["kafka", "produce", kafka_broker.bootstrap, topic, "--value", "kept"]) == 0
    _acquire_in_a_process_that_exits(url, "p")
    _acquire_in_a_process_that_exits(url, "p")
    with KafkaSink(kafka_broker.bootstrap, topic) as sink:
        owner = sink.owner("p")
        assert owner is not None and owner.epoch == 2
    capsys.readouterr()

    assert main(["reset", "--pipeline", "p", "--sink", url, "--yes"]) == 0
    assert "output kept" in capsys.readouterr().out
    with KafkaSink(kafka_broker.bootstrap, topic) as sink:
        assert sink.owner("p") is None and sink.ledger("p") == []
        assert [r["value"] for r in inspector_for(sink).rows()] == ["kept"]
        assert sink.acquire("p").epoch == 1  # the next run starts over

    # Another pipeline's records in the same ledger topic: Kafka cannot delete one
    # pipeline's records, so the reset is refused and nothing is deleted.
    _acquire_in_a_process_that_exits(url, "q")
    assert main(["reset", "--pipeline", "q", "--sink", url, "--yes"]) == EXIT_USAGE
    assert "also holds the progress of p" in capsys.readouterr().err
    with KafkaSink(kafka_broker.bootstrap, topic) as sink:
        assert sink.owner("q") is not None
