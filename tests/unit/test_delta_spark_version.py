"""DeltaSink and the pinned Kafka connector refuse a PySpark they are not built for, naming
both versions."""

from __future__ import annotations

import pytest

from sparkonce.errors import ConfigError
from sparkonce.sinks.delta import DELTA_VERSION, check_delta_supports


def test_delta_accepts_spark_4_2() -> None:
    check_delta_supports("4.2.0")
    check_delta_supports("4.2.1")


@pytest.mark.parametrize("version", ["4.3.0", "4.1.1", "5.0.0"])
def test_delta_refuses_other_spark_naming_both_versions(version: str) -> None:
    with pytest.raises(ConfigError, match=rf"PySpark {version}.*Delta {DELTA_VERSION}.*4\.2"):
        check_delta_supports(version)


def test_the_pinned_kafka_connector_is_refused_on_another_spark() -> None:
    from sparkonce.sources.spark_kafka import check_connector_matches

    pinned = [
        "/c/spark-sql-kafka-0-10_2.13-4.2.0.jar",
        "/c/spark-token-provider-kafka-0-10_2.13-4.0.0.jar",  # not the connector: not checked
        "/c/kafka-clients-3.9.2.jar",
    ]
    check_connector_matches(pinned, "4.2.1")
    check_connector_matches([], "4.3.0")  # no jars: the missing-connector error says so later
    with pytest.raises(ConfigError, match=r"PySpark 4\.3\.0.*is 4\.2\.0, built for Spark 4\.2"):
        check_connector_matches(pinned, "4.3.0")
    check_connector_matches(["/own/spark-sql-kafka-0-10_2.13-4.3.0.jar"], "4.3.0")
