"""KafkaSource configuration: validation, URIs, and secrets kept out of every string (no broker)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from sparkonce import ConfigError, KafkaSource
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sources import source_from_uri
from sparkonce.sources.embedded import SCHEMA_DDL as EMBEDDED_SCHEMA
from sparkonce.sources.kafka import (
    SCHEMA_DDL,
    KafkaBatchReader,
    KafkaDataSource,
    KafkaStreamReader,
    schema_ddl,
    validate_client_config,
)

SECRET = "hunter2-very-secret"
SECURE = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "PLAIN",
    "sasl.username": "alice",
    "sasl.password": SECRET,
    "ssl.key.password": SECRET + "-key",
}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bootstrap_servers": ""}, "bootstrap_servers is empty"),
        ({"bootstrap_servers": "localhost"}, "not host:port"),
        ({"bootstrap_servers": "h:99999"}, "not host:port"),
        ({"topic": ""}, "topic name"),
        ({"topic": "a/b"}, "topic name"),
        ({"topic": ".."}, "topic name"),
        ({"topic": "x" * 250}, "topic name"),
        ({"max_records_per_partition": 0}, "max_records_per_partition must be a positive"),
        ({"max_records_per_partition": 2.5}, "max_records_per_partition must be a positive"),
        ({"max_records_per_batch": -1}, "max_records_per_batch must be a positive"),
        ({"max_records_per_batch": True}, "max_records_per_batch must be a positive"),
        ({"starting_offsets": "newest"}, "starting_offsets 'newest'"),
        ({"starting_offsets": '{"0": -1}'}, "starting_offsets"),
        ({"starting_offsets": "[1, 2]"}, "starting_offsets"),
        ({"value_format": "json"}, "value_format 'json' is not supported"),
        ({"client_config": {"bootstrap.servers": "x:1"}}, "bootstrap_servers"),
        ({"client_config": {"group.id": "g"}}, "group_id="),
        ({"client_config": {"enable.auto.commit": "true"}}, "never commits"),
        ({"client_config": {"isolation.level": "read_uncommitted"}}, "read_committed"),
        ({"client_config": {"auto.offset.reset": "latest"}}, "never a reset"),
        ({"client_config": {"socket.timeout.ms": [1]}}, "string, number or boolean"),
        ({"client_config": {"": "x"}}, "setting names"),
        ({"client_config": ["a"]}, "must be a mapping"),
        ({"group_id": " "}, "group_id must be a non-empty"),
        ({"timeout": 0}, "timeout must be"),
        ({"timeout": "10"}, "timeout must be"),
    ],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"bootstrap_servers": "127.0.0.1:9092", "topic": "events", **kwargs}
    with pytest.raises(ConfigError, match=message):
        KafkaSource(**args)


def test_good_settings() -> None:
    src = KafkaSource(
        " 127.0.0.1:9092, broker2:9093 ",
        "events.v1_x-y",
        max_records_per_partition=100,
        max_records_per_batch=250,
        starting_offsets='{"0": 42, "1": 17}',
        value_format="utf8",
        client_config={"isolation.level": "read_committed", "fetch.max.bytes": 1 << 20},
        group_id="monitor",
        timeout=2,
    )
    assert src.bootstrap_servers == "127.0.0.1:9092,broker2:9093"
    assert src.uri() == "kafka://127.0.0.1:9092,broker2:9093/events.v1_x-y"
    assert src.describe() == (
        "KafkaSource(kafka://127.0.0.1:9092,broker2:9093/events.v1_x-y value_format=utf8)"
    )
    # isolation.level=read_committed is what the source uses anyway: dropped, not passed on.
    assert dict(src.connection.config) == {"fetch.max.bytes": 1 << 20}
    assert src.timeout == 2.0


def test_secrets_never_shown() -> None:
    src = KafkaSource("127.0.0.1:9092", "events", client_config=SECURE)
    shown = [repr(src), str(src), src.describe(), src.uri(), repr(src.connection)]
    for text in shown:
        assert SECRET not in text
    assert "sasl.password': '***'" in repr(src)
    assert "'sasl.username': 'alice'" in repr(src)
    # Executors get the settings through an option whose name Spark's redaction pattern hides.
    opts = src.options()
    (name,) = [k for k, v in opts.items() if SECRET in v]
    assert "secret" in name.lower()
    assert json.loads(opts[name]) == SECURE
    with pytest.raises(ConfigError) as info:
        validate_client_config({**SECURE, "logger": "x"})
    assert SECRET not in str(info.value)


def test_options_and_starting_offsets() -> None:
    src = KafkaSource("127.0.0.1:9092", "events", max_records_per_partition=5)
    opts = src.options()
    assert opts["startingOffsets"] == "earliest"
    assert opts["maxRecordsPerPartition"] == "5"
    assert "maxRecordsPerBatch" not in opts
    # The ledger's end offsets win; other topics' offsets are ignored.
    start = {("events", 1): 17, ("events", 0): 42, ("other", 0): 9}
    assert json.loads(src.options(start)["startingOffsets"]) == {"0": 42, "1": 17}
    reader = KafkaStreamReader(src.options(start))
    assert reader.starting == {0: 42, 1: 17}
    assert reader.max_per_partition == 5 and reader.max_per_batch is None
    assert reader._client is None  # nothing connects until Spark asks for offsets


def test_readers_pickle_without_a_client() -> None:
    import pickle

    src = KafkaSource("127.0.0.1:9092", "events", client_config={"client.id": "x"})
    reader = KafkaStreamReader(src.options())
    reader._client = object()  # type: ignore[assignment]  # stands for a live consumer
    clone = pickle.loads(pickle.dumps(reader))
    assert clone._client is None
    assert clone.connection.config == {"client.id": "x"}


def test_batch_reader_explicit_ranges() -> None:
    src = KafkaSource("127.0.0.1:9092", "events")
    ranges = BatchRanges((OffsetRange("events", 0, 3, 9), OffsetRange("events", 2, 4, 4)))
    opts = src.options()
    opts["ranges"] = ranges.to_json()
    parts = KafkaBatchReader(opts).partitions()
    assert [(p.topic, p.partition, p.start, p.end) for p in parts] == [("events", 0, 3, 9)]


def test_schema() -> None:
    assert SCHEMA_DDL == EMBEDDED_SCHEMA
    assert schema_ddl("utf8") == EMBEDDED_SCHEMA.replace("BINARY", "STRING")
    assert KafkaDataSource({"valueFormat": "utf8"}).schema() == schema_ddl("utf8")
    assert KafkaDataSource({}).schema() == SCHEMA_DDL
    assert KafkaDataSource.name() == "sparkonce_kafka"


def test_reader_options_are_validated() -> None:
    base = KafkaSource("127.0.0.1:9092", "events").options()
    with pytest.raises(ConfigError, match="needs option 'topic'"):
        KafkaStreamReader({k: v for k, v in base.items() if k != "topic"})
    with pytest.raises(ConfigError, match="valueFormat"):
        KafkaStreamReader({**base, "valueFormat": "json"})
    with pytest.raises(ConfigError, match="maxRecordsPerBatch"):
        KafkaStreamReader({**base, "maxRecordsPerBatch": "0"})


def test_uri_round_trip() -> None:
    src = KafkaSource("b1:9092,b2:9092", "events", client_config=SECURE)
    again = source_from_uri(src.uri())
    assert isinstance(again, KafkaSource)
    assert (again.bootstrap_servers, again.topic) == ("b1:9092,b2:9092", "events")
    assert not again.connection.config  # URIs never carry settings (nor secrets)
    for bad in ("kafka://", "kafka://b1:9092", "kafka:///events", "kafka://b1/events"):
        with pytest.raises(ConfigError):
            KafkaSource.from_uri(bad)


def test_batch_ranges_are_the_offset_itself() -> None:
    src = KafkaSource("127.0.0.1:9092", "events")
    current = '{"events":{"0":[3,9],"1":[0,0]}}'
    assert src.batch_ranges('{"events":{"0":[0,3],"1":[0,0]}}', current) == (
        BatchRanges.from_json(current)
    )
    # A no-data batch (the watermark moved, no new input) repeats the offset: it covers
    # nothing, and must not look like a replay of the batch before.
    assert src.batch_ranges(current, current) == BatchRanges.from_json(
        '{"events":{"0":[9,9],"1":[0,0]}}'
    )


def test_waiting_for_a_new_topic_keeps_to_its_deadline() -> None:
    """A real client with no broker behind the address: the wait ends at its own
    deadline (1 s), not after a full metadata timeout per poll."""
    import time

    from sparkonce.kafka.client import TIMEOUT_S, KafkaConnection, KafkaUnavailableError

    conn = KafkaConnection("127.0.0.1:1")
    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match="partition leaders"):
        conn._wait_for_topic("nowhere", timeout=1.0)
    assert time.monotonic() - started < TIMEOUT_S / 2


def test_kafka_unavailable_is_one_store_unavailable_error_of_the_hierarchy() -> None:
    """One hierarchy: a Kafka or database store that cannot be reached is a
    StoreUnavailableError (retryable; the CLI's exit code 4), importable from its old
    places too."""
    import sparkonce
    import sparkonce.kafka
    import sparkonce.kafka.client
    from sparkonce.errors import (
        KafkaUnavailableError,
        SinkUnavailableError,
        SparkOnceError,
        StoreUnavailableError,
    )
    from sparkonce.pipeline.failure import find_cause

    assert sparkonce.KafkaUnavailableError is KafkaUnavailableError
    assert sparkonce.kafka.KafkaUnavailableError is KafkaUnavailableError
    assert sparkonce.kafka.client.KafkaUnavailableError is KafkaUnavailableError
    for cls in (KafkaUnavailableError, SinkUnavailableError):
        assert issubclass(cls, StoreUnavailableError) and issubclass(cls, ConnectionError)
        assert issubclass(cls, SparkOnceError) and cls.retryable
    # A task's traceback names the class by its module: rebuilt on the driver as the same class.
    line = "sparkonce.errors.KafkaUnavailableError: Kafka at b:9092 did not answer"
    cause = find_cause(f"Traceback (most recent call last):\n{line}\n")
    assert cause.error is KafkaUnavailableError


def test_a_failed_tasks_error_names_the_refused_record_not_the_purged_ones() -> None:
    """A refused record fails the transaction and librdkafka purges the queued rest; their
    reports can come first, but the error must give the broker's reason."""
    from confluent_kafka import KafkaError

    from sparkonce.sinks.kafka_tasks import _cause

    purged = KafkaError(KafkaError._PURGE_QUEUE)
    refused = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    text = _cause([purged, purged, refused, KafkaError(KafkaError._PURGE_INFLIGHT)])
    assert "MSG_SIZE_TOO_LARGE" in text and "PURGE" not in text
    assert "every report was of a purged record" in _cause([purged])


def _arrow_batches(n: int, rows: int = 1000) -> list[Any]:
    import pyarrow as pa

    return [
        pa.RecordBatch.from_pylist([{"value": f"{i}:{r}"} for r in range(rows)]) for i in range(n)
    ]


def test_a_task_reads_its_input_ahead_only_while_its_producer_starts() -> None:
    """Step 3 reads the task's input while init_transactions and the ledger read run, and
    stops reading ahead the moment they are done: a replayed task that finds its marker
    must not read its whole input for nothing."""
    from concurrent.futures import Future

    from sparkonce.sinks.kafka_tasks import prefetch as _prefetch

    done: Future[Any] = Future()
    done.set_result(None)
    source = iter(_arrow_batches(5))
    assert _prefetch(source, done) == []
    assert len(list(source)) == 5  # nothing was taken from the input

    # The producer becomes ready while the third batch is being read.
    starting: Future[Any] = Future()
    batches = _arrow_batches(10)

    def upstream() -> Iterator[Any]:
        for i, rb in enumerate(batches):
            if i == 2:
                starting.set_result(None)
            yield rb

    rest = upstream()
    ahead = _prefetch(rest, starting)
    assert ahead == batches[:3]
    assert list(rest) == batches[3:]  # the rest is still there, in order

    # An input shorter than the start is read whole; a large one stops at the byte limit.
    never: Future[Any] = Future()
    assert _prefetch(iter(batches[:4]), never) == batches[:4]
    limit = batches[0].nbytes * 2
    assert _prefetch(iter(batches), never, limit) == batches[:2]


def test_transactional_producers_connect_to_every_broker_unless_the_user_says_otherwise() -> None:
    """Sparse connections leave init_transactions waiting on librdkafka's 500 ms coordinator
    timer in about 4 calls of 10; sparkonce's transactional producers turn them off, and a
    client_config that sets the option keeps its own value."""
    from sparkonce.kafka.client import KafkaConnection

    conf = KafkaConnection("b:9092", {"linger.ms": 5}).transactional_config("t-id", 60_000)
    assert conf["enable.sparse.connections"] is False
    assert (conf["transactional.id"], conf["transaction.timeout.ms"]) == ("t-id", 60_000)
    assert (conf["enable.idempotence"], conf["acks"], conf["linger.ms"]) == (True, "all", 5)
    own = KafkaConnection("b:9092", {"enable.sparse.connections": True})
    assert own.transactional_config("t-id", 60_000)["enable.sparse.connections"] is True
