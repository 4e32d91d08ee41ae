from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparkonce import sink_from_url


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/spark/" in str(item.fspath):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(params=["sqlite", "postgres", "postgres-2pc", "kafka"])
def family_sink(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], Any]:
    """Make a sink of one family for a table (or topic) name."""
    family = request.param

    def make(table: str) -> Any:
        if family == "sqlite":
            return sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", table)
        if family == "kafka":
            from sparkonce import KafkaSink

            broker = request.getfixturevalue("kafka_broker")
            topic = request.getfixturevalue("kafka_topic")(table, partitions=2)
            return KafkaSink(broker.bootstrap, topic)
        url = request.getfixturevalue("pg_url")
        return sink_from_url(url, table, two_phase=family == "postgres-2pc")

    make.family = family  # type: ignore[attr-defined]
    return make
