"""The embedded log read on a machine that does not hold it (an executor of a cluster):
the task fails with an error naming its host and the way out, never reads nothing."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sparkonce.errors import SourceError
from sparkonce.log import IdempotentProducer, Topic
from sparkonce.sources.embedded import RangePartition, _arrow_batches


def test_a_missing_log_on_the_executor_names_the_host_and_the_fix(tmp_path: Path) -> None:
    part = RangePartition(str(tmp_path / "not-here"), "events", 0, 0, 10)
    with pytest.raises(SourceError) as failed:
        list(_arrow_batches(part))
    text = str(failed.value)
    assert "does not exist" in text and socket.gethostname() in text
    assert "KafkaSource" in text and str(tmp_path / "not-here") in text


def test_a_shorter_copy_of_the_log_fails_instead_of_reading_less(tmp_path: Path) -> None:
    topic = Topic.create(tmp_path, "events", 1)
    with topic, IdempotentProducer(topic, "p") as producer:
        for i in range(5):
            producer.send(str(i).encode(), b"k")
    # The batch was planned on a machine whose copy has 10 records; this one has 5.
    part = RangePartition(str(tmp_path), "events", 0, 0, 10)
    with pytest.raises(SourceError, match="only 5 exist") as failed:
        list(_arrow_batches(part))
    assert socket.gethostname() in str(failed.value)
    # The records that are there read as before.
    (batch,) = list(_arrow_batches(RangePartition(str(tmp_path), "events", 0, 0, 5)))
    assert batch.num_rows == 5
