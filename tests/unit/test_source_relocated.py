"""``Source.relocated`` and ``sparkonce run --source``: only the location moves (no Spark, no
broker).

A relocated source reads another log directory and topic, or other brokers and topic, with
every other option of the pipeline file's source; another kind of source, or a URI that
does not parse, is a ConfigError that says what to give, with passwords masked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkonce import ConfigError, EmbeddedLogSource, KafkaSource, Pipeline, SQLiteSink
from sparkonce.cli import main
from sparkonce.cli.common import EXIT_USAGE
from sparkonce.sources.base import Source

SECRET = "hunter2-very-secret"


def _embedded(tmp_path: Path) -> EmbeddedLogSource:
    return EmbeddedLogSource(
        tmp_path / "log",
        "events",
        max_records_per_partition=7,
        max_records_per_batch=30,
        starting_offsets='{"0": 3}',
    )


def _kafka() -> KafkaSource:
    return KafkaSource(
        "b1:9092",
        "orders",
        max_records_per_partition=11,
        max_records_per_batch=50,
        starting_offsets="latest",
        value_format="utf8",
        client_config={"sasl.password": SECRET, "security.protocol": "SASL_SSL"},
        group_id="monitor",
        timeout=7.5,
    )


def test_an_embedded_log_source_moves_to_another_directory_and_topic(tmp_path: Path) -> None:
    source = _embedded(tmp_path)
    moved = source.relocated(f"sparkonce-log://{tmp_path / 'other'}?topic=copy")
    assert isinstance(moved, EmbeddedLogSource)
    assert (moved.path, moved.topic) == ((tmp_path / "other").resolve(), "copy")
    kept = ("max_records_per_partition", "max_records_per_batch", "starting_offsets")
    assert {a: getattr(moved, a) for a in kept} == {a: getattr(source, a) for a in kept}
    assert (source.path, source.topic) == ((tmp_path / "log").resolve(), "events")  # a copy
    assert moved.options()["maxRecordsPerPartition"] == "7"
    # A relative directory, as a user would type it.
    relative = source.relocated("sparkonce-log://data/log?topic=events")
    assert relative.path == Path("data/log").resolve()


def test_a_kafka_source_moves_to_other_brokers_and_topic_keeping_its_settings() -> None:
    source = _kafka()
    moved = source.relocated("kafka://b2:9093,b3:9093/orders-copy")
    assert isinstance(moved, KafkaSource)
    assert (moved.bootstrap_servers, moved.topic) == ("b2:9093,b3:9093", "orders-copy")
    kept = (
        "max_records_per_partition",
        "max_records_per_batch",
        "starting_offsets",
        "value_format",
        "group_id",
        "timeout",
    )
    assert {a: getattr(moved, a) for a in kept} == {a: getattr(source, a) for a in kept}
    assert dict(moved.connection.config) == dict(source.connection.config)
    assert SECRET not in repr(moved) and SECRET not in moved.describe()
    assert moved.uri() == "kafka://b2:9093,b3:9093/orders-copy"


@pytest.mark.parametrize(
    ("which", "uri", "problem", "form"),
    [
        ("embedded", "kafka://b:9092/t", "names a Kafka topic", "sparkonce-log://PATH?topic=TOPIC"),
        ("embedded", "/data/log", "not a source URI", "sparkonce-log://PATH?topic=TOPIC"),
        ("embedded", "sparkonce-log:///data/log", "not an embedded log URI", "?topic=TOPIC"),
        ("embedded", "sparkonce-log:///d?topic=a/b", "topic name 'a/b' is invalid", "PATH"),
        ("kafka", "sparkonce-log:///d?topic=t", "names an embedded log", "kafka://HOST:PORT"),
        ("kafka", "kafka://b:9092", "not a Kafka source URI", "kafka://HOST:PORT"),
        ("kafka", "kafka://broker/t", "not host:port", "kafka://HOST:PORT"),
        ("kafka", "postgresql://u:pw@h/db", "not a source URI", "kafka://HOST:PORT"),
    ],
)
def test_another_kind_or_a_bad_uri_is_refused_saying_what_to_give(
    tmp_path: Path, which: str, uri: str, problem: str, form: str
) -> None:
    source = _embedded(tmp_path) if which == "embedded" else _kafka()
    with pytest.raises(ConfigError) as err:
        source.relocated(uri)
    text = str(err.value)
    assert text.startswith("--source "), text
    assert problem in text and form in text and source.describe() in text
    assert "keeping every other option" in text
    assert ":pw@" not in text and SECRET not in text


def test_a_source_that_cannot_move_says_so(tmp_path: Path) -> None:
    class Numbers(Source):
        def stream(self, spark, start):
            raise AssertionError

        def latest_offsets(self) -> dict[tuple[str, int], int]:
            return {}

        def uri(self) -> str:
            return "numbers://"

        def describe(self) -> str:
            return "Numbers()"

    with pytest.raises(ConfigError, match=r"Numbers\(\) cannot read from another location"):
        Numbers().relocated("numbers://elsewhere")


def test_with_overrides_moves_only_the_source(tmp_path: Path) -> None:
    pipeline = Pipeline(
        name="p",
        source=_embedded(tmp_path),
        sink=SQLiteSink(f"sqlite:///{tmp_path / 'out.db'}", "out"),
        checkpoint=tmp_path / "c",
    )
    moved = pipeline.with_overrides(source_uri=f"sparkonce-log://{tmp_path / 'b'}?topic=events")
    assert isinstance(moved.source, EmbeddedLogSource)
    assert moved.source.path == (tmp_path / "b").resolve()
    assert moved.source.max_records_per_batch == 30
    assert (moved.name, moved.sink, moved.checkpoint) == (
        pipeline.name,
        pipeline.sink,
        pipeline.checkpoint,
    )
    assert pipeline.with_overrides() is pipeline


def test_run_with_a_source_of_another_kind_is_bad_input_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sparkonce.spark.session as spark_module

    def no_spark(**_kwargs: object) -> None:
        raise AssertionError("Spark must not start")

    monkeypatch.setattr(spark_module, "build_session", no_spark)
    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink\n"
        f"pipeline = Pipeline(name='p', source=EmbeddedLogSource({str(tmp_path)!r}, 'events'),\n"
        f"    sink=SQLiteSink('sqlite:///{tmp_path / 'out.db'}', 'out'),\n"
        f"    checkpoint={str(tmp_path / 'c')!r})\n"
    )
    code = main(["run", str(pipeline), "--source", "kafka://u:s3cret@b:9092/t"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert "bad input: --source 'kafka://u:***@b:9092/t'" in err
    assert "names a Kafka topic" in err and "sparkonce-log://PATH?topic=TOPIC" in err
    assert "s3cret" not in err
