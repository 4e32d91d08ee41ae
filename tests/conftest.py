"""Shared fixtures: one local[2] SparkSession per test run, and a real PostgreSQL server.

The PostgreSQL server is a throwaway cluster on 127.0.0.1 started by
``tests/services/postgres.py`` (installed by ``scripts/ensure-postgres.sh``);
tests never skip because it is missing: they fail.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.services.kafka import KafkaBroker
    from tests.services.postgres import PostgresServer

_db_counter = itertools.count()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from sparkonce.pipeline.spark import build_session

    session = build_session(master="local[2]", app_name="sparkonce-tests", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server.

    Its cluster lives in a temp directory of its own, not under pytest's
    ``/tmp/pytest-of-<user>``: any other pytest session starting meanwhile resets
    that directory to mode 0700, which the ``postgres`` user then cannot enter.
    """
    from tests.services.postgres import session_server

    root = Path(tempfile.mkdtemp(prefix="sparkonce-test-pg-"))
    try:
        yield from session_server(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """The session's Kafka broker: single-node KRaft from the pinned jars (tests/services/).

    Started on first use and stopped at the end of the run; tests fail, never skip, if it
    cannot start.
    """
    from tests.services.kafka import session_broker

    root = Path(tempfile.mkdtemp(prefix="sparkonce-test-kafka-"))
    try:
        yield from session_broker(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def kafka_topic(kafka_broker: KafkaBroker) -> Callable[..., str]:
    """Create a fresh, uniquely named topic: ``kafka_topic("events", partitions=3)``."""

    def create(prefix: str = "t", partitions: int = 3) -> str:
        name = f"{prefix}-{os.getpid()}-{next(_db_counter)}"
        kafka_broker.create_topic(name, partitions)
        return name

    return create


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> str:
    """A fresh, empty database on the shared server."""
    return pg_server.create_database(f"t{os.getpid()}_{next(_db_counter)}")


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A sink store URL: a fresh SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sink.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def make_log(tmp_path: Path) -> Callable[..., Path]:
    """Create a topic 'events' and append values ``start..start+count-1`` keyed k0..k{keys-1}."""
    from sparkonce.log import IdempotentProducer, Topic

    root = tmp_path / "log"

    def produce(count: int, *, partitions: int = 3, keys: int = 5, start: int = 1) -> Path:
        topic = Topic.create(root, "events", partitions, exist_ok=True)
        with topic, IdempotentProducer(topic, "test-producer") as producer:
            for i in range(start, start + count):
                producer.send(str(i).encode(), f"k{i % keys}".encode())
        return root

    return produce
