"""Inspectors (sparkonce.sinks.inspect): read back, reset and relocate a sink, off the Sink
contract. SQLite stores, no Spark; the two-phase and Kafka inspectors are exercised by the
tests of their sinks (tests/spark/test_twophase.py, tests/kafka/test_sink.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import types as T

from sparkonce.config import StoreURL
from sparkonce.errors import ConfigError
from sparkonce.ledger.base import BatchContext
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks import (
    KafkaSink,
    PostgresSink,
    PostgresTwoPhaseSink,
    Sink,
    SQLiteSink,
    SqlSink,
)
from sparkonce.sinks.inspect import (
    Inspector,
    KafkaInspector,
    SqlInspector,
    TwoPhaseInspector,
    inspector_for,
    register_inspector,
    relocate,
)

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])


@pytest.fixture
def sink(store_url: StoreURL) -> Iterator[SQLiteSink]:
    s = SQLiteSink(store_url, "out", mode="upsert", keys=["id"])
    yield s
    s.close()


def _commit(sink: SqlSink, epoch: int, start: int, rows: list[tuple[Any, ...]]) -> None:
    ranges = BatchRanges((OffsetRange("t", 0, start, start + len(rows)),))
    sink.commit_rows(BatchContext("p", epoch, ranges, start, "cp"), SCHEMA, ["id", "v"], rows)


def test_the_sink_contract_has_only_what_a_run_needs() -> None:
    for name in ("rows", "reset", "relocated", "fresh", "pending"):
        assert not hasattr(Sink, name), name
        assert not hasattr(PostgresTwoPhaseSink, name), name
        assert not hasattr(KafkaSink, name), name


def test_each_store_has_its_inspector(store_url: StoreURL) -> None:
    assert type(inspector_for(SQLiteSink(store_url, "out"))) is SqlInspector
    pg = "postgresql://u@127.0.0.1:5432/db"
    assert type(inspector_for(PostgresSink(pg, "out"))) is SqlInspector
    assert type(inspector_for(PostgresTwoPhaseSink(pg, "out"))) is TwoPhaseInspector
    assert type(inspector_for(KafkaSink("127.0.0.1:9092", "out"))) is KafkaInspector


def test_a_subclass_finds_its_base_class_inspector(store_url: StoreURL) -> None:
    class Custom(SQLiteSink):
        pass

    assert type(inspector_for(Custom(store_url, "out"))) is SqlInspector


def test_a_sink_without_an_inspector_is_refused_and_can_register_one(store_url: StoreURL) -> None:
    class Other(SQLiteSink):
        pass

    class Bare:
        """Not a sparkonce sink at all."""

    with pytest.raises(ConfigError, match="Bare has no inspector"):
        inspector_for(Bare())  # type: ignore[arg-type]

    class OtherInspector(SqlInspector):
        pass

    register_inspector(Other, OtherInspector)
    try:
        assert type(inspector_for(Other(store_url, "out"))) is OtherInspector
    finally:
        from sparkonce.sinks import inspect

        inspect._INSPECTORS.pop(Other)


def test_rows_of_a_missing_table_are_none(sink: SQLiteSink) -> None:
    assert inspector_for(sink).rows() == []


def test_rows_read_through_the_sinks_connection(sink: SQLiteSink) -> None:
    epoch = sink.acquire("p").epoch
    _commit(sink, epoch, 0, [(1, "a"), (2, "b")])
    inspector = inspector_for(sink)
    assert inspector.sink is sink
    assert sorted((r["id"], r["v"]) for r in inspector.rows()) == [(1, "a"), (2, "b")]
    assert [e.seq for e in inspector.ledger("p")] == [0]
    owner = inspector.owner("p")
    assert owner is not None and owner.epoch == epoch


def test_reset_drops_the_output_and_the_pipelines_metadata_only(sink: SQLiteSink) -> None:
    epoch = sink.acquire("p").epoch
    _commit(sink, epoch, 0, [(1, "a")])
    other = sink.acquire("q").epoch
    inspector = inspector_for(sink)
    inspector.reset("p")
    assert inspector.rows() == []
    assert sink.ledger("p") == [] and sink.owner("p") is None
    owner = sink.owner("q")
    assert owner is not None and owner.epoch == other  # another pipeline's owner stays
    # The same sink object commits again: it knows its table is gone and creates it.
    epoch = sink.acquire("p").epoch
    _commit(sink, epoch, 0, [(1, "again")])
    assert [(r["id"], r["v"]) for r in inspector.rows()] == [(1, "again")]


def test_a_fresh_inspector_has_its_own_connections(sink: SQLiteSink) -> None:
    epoch = sink.acquire("p").epoch
    _commit(sink, epoch, 0, [(1, "a")])
    with inspector_for(sink, fresh=True) as fresh:
        assert fresh.sink is not sink and isinstance(fresh.sink, SQLiteSink)
        assert [(r["id"], r["v"]) for r in fresh.rows()] == [(1, "a")]
    _commit(sink, epoch, 1, [(2, "b")])  # closing the fresh one left this sink alone
    assert len(inspector_for(sink).rows()) == 2


def test_relocated_keeps_the_table_mode_and_keys(tmp_path: Path, sink: SQLiteSink) -> None:
    latest = SQLiteSink(sink.url, "cdc", mode="upsert", keys=["k"], latest_by=["offset"])
    moved = relocate(latest, f"sqlite:///{tmp_path / 'other.db'}")
    assert isinstance(moved, SQLiteSink)
    assert (moved.table, moved.mode, moved.keys, moved.latest_by) == (
        "cdc",
        "upsert",
        ("k",),
        ("offset",),
    )
    assert moved.url.path == tmp_path / "other.db"
    to_pg = relocate(latest, "postgresql://u@127.0.0.1:5432/db")
    assert type(to_pg) is PostgresSink and to_pg.keys == ("k",)
    fresh = inspector_for(sink).fresh()
    assert type(fresh) is SQLiteSink and fresh is not sink and fresh.url == sink.url


def test_two_phase_relocation_needs_postgresql() -> None:
    tp = PostgresTwoPhaseSink("postgresql://u@127.0.0.1:5432/db", "out", mode="upsert", keys=["k"])
    moved = relocate(tp, "postgresql://u@127.0.0.1:5432/other")
    assert type(moved) is PostgresTwoPhaseSink and moved.keys == ("k",)
    with pytest.raises(ConfigError, match="postgresql://"):
        relocate(tp, "sqlite:///x.db")


def test_kafka_relocation_and_fresh_keep_the_client_settings() -> None:
    sink = KafkaSink(
        "127.0.0.1:9092",
        "out",
        client_config={"security.protocol": "PLAINTEXT"},
        ledger_topic="out-ledger",
        transaction_timeout_ms=5000,
    )
    moved = relocate(sink, "kafka://127.0.0.1:9093/elsewhere")
    assert isinstance(moved, KafkaSink)
    assert (moved.topic, moved.ledger_topic) == ("elsewhere", "elsewhere.sparkonce-ledger")
    assert moved.conn.config == {"security.protocol": "PLAINTEXT"}
    assert moved.transaction_timeout_ms == 5000
    fresh = inspector_for(sink).fresh()
    assert isinstance(fresh, KafkaSink) and fresh is not sink
    assert (fresh.topic, fresh.ledger_topic) == ("out", "out-ledger")


def test_pipeline_overrides_relocate_through_the_inspector(tmp_path: Path) -> None:
    from sparkonce import EmbeddedLogSource, Pipeline

    p = Pipeline(
        name="p",
        source=EmbeddedLogSource(tmp_path / "log", "events"),
        sink=SQLiteSink(f"sqlite:///{tmp_path / 'a.db'}", "out", mode="upsert", keys=["id"]),
        checkpoint=tmp_path / "chk",
    )
    moved = p.with_overrides(sink_url=f"sqlite:///{tmp_path / 'b.db'}")
    assert isinstance(moved.sink, SQLiteSink)
    assert moved.sink.url.path == tmp_path / "b.db" and moved.sink.keys == ("id",)
    assert p.with_overrides() is p


def test_inspector_is_abstract() -> None:
    with pytest.raises(TypeError):
        Inspector(None)  # type: ignore[abstract,arg-type]
