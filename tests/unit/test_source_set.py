"""Several sources in one pipeline, without Spark or a broker: ``Pipeline(sources=...)``'s
checks, and how :class:`~sparkonce.sources.source_set.SourceSet` maps Spark's offset log
lines to its sources and joins their ranges into one batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkonce import (
    CheckpointError,
    ConfigError,
    DeltaSource,
    EmbeddedLogSource,
    KafkaSource,
    Pipeline,
    SparkKafkaSource,
    SQLiteSink,
)
from sparkonce.offsets import BatchRanges, Coverage, OffsetRange, classify
from sparkonce.sources import source_from_uri
from sparkonce.sources.source_set import SourceSet
from sparkonce.spark.checkpoint import Checkpoint


def _two() -> SourceSet:
    return SourceSet(
        {"orders": KafkaSource("b1:9092", "orders"), "payments": KafkaSource("b1:9092", "pays")}
    )


def _pipeline(tmp_path: Path, **kwargs: object) -> Pipeline:
    return Pipeline(
        name="join",
        sink=SQLiteSink(f"sqlite:///{tmp_path / 's.db'}", "out"),
        checkpoint=tmp_path / "chk",
        **kwargs,  # type: ignore[arg-type]
    )


def _offsets(orders: dict[str, list[int]], pays: dict[str, list[int]]) -> tuple[str, str]:
    return json.dumps({"orders": orders}), json.dumps({"pays": pays})


def test_pipeline_takes_exactly_one_of_source_and_sources(tmp_path: Path) -> None:
    a, b = KafkaSource("b1:9092", "orders"), KafkaSource("b1:9092", "pays")
    p = _pipeline(tmp_path, sources={"orders": a, "payments": b})
    assert isinstance(p.source, SourceSet) and p.source.names == ("orders", "payments")
    assert "orders: KafkaSource(" in p.source.describe() and "payments:" in p.source.describe()
    with pytest.raises(ConfigError, match=r"either source=\.\.\. .* or sources="):
        _pipeline(tmp_path, source=a, sources={"payments": b})
    with pytest.raises(ConfigError, match=r"source must be a sparkonce Source .* or give sources"):
        _pipeline(tmp_path)
    with pytest.raises(ConfigError, match="sources must be a mapping"):
        _pipeline(tmp_path, sources=[a, b])
    import dataclasses

    again = dataclasses.replace(p, name="join2")  # rebuilt from sources, not refused
    assert isinstance(again.source, SourceSet) and again.source.names == p.source.names


def test_topics_must_differ_and_only_topic_keyed_sources_join(tmp_path: Path) -> None:
    a = KafkaSource("b1:9092", "orders")
    with pytest.raises(ConfigError, match=r"'a' and 'b' both read topic 'orders'.*with itself"):
        _pipeline(tmp_path, sources={"a": a, "b": KafkaSource("b2:9092", "orders")})
    with pytest.raises(ConfigError, match="cannot be one of several sources yet"):
        _pipeline(tmp_path, sources={"a": a, "b": SparkKafkaSource("b1:9092", "pays")})
    with pytest.raises(ConfigError, match="cannot be one of several sources yet"):
        _pipeline(tmp_path, sources={"a": a, "d": DeltaSource(str(tmp_path / "t"))})
    with pytest.raises(ConfigError, match="source name 'a b'"):
        _pipeline(tmp_path, sources={"a b": a})
    log = EmbeddedLogSource(tmp_path / "log", "clicks")
    assert _pipeline(tmp_path, sources={"a": a, "clicks": log}).source.describe().count("(") >= 3


@pytest.mark.parametrize("order", ["orders first", "payments first"])
def test_offset_lines_map_to_sources_by_topic_in_any_order(order: str) -> None:
    s = _two()
    o, p = _offsets({"0": [0, 5], "1": [0, 4]}, {"0": [0, 3]})
    lines = [o, p] if order == "orders first" else [p, o]
    offset = s.offset_from_log(lines, "offsets/0")
    assert list(json.loads(offset)) == ["orders", "payments"]  # the set's own order
    assert s.batch_ranges(None, offset) == BatchRanges(
        (
            OffsetRange("orders", 0, 0, 5),
            OffsetRange("orders", 1, 0, 4),
            OffsetRange("pays", 0, 0, 3),
        )
    )
    # A self-join of one member writes its line twice: the same offsets, one source.
    assert s.offset_from_log([o, p, o], "offsets/0") == offset


def test_offset_lines_that_match_no_source_or_two_are_refused() -> None:
    s = _two()
    o, p = _offsets({"0": [0, 5]}, {"0": [0, 3]})
    with pytest.raises(CheckpointError, match="names no topic of this pipeline's sources"):
        s.offset_from_log([o, json.dumps({"other": {"0": [0, 1]}})], "offsets/4")
    both = json.dumps({"orders": {"0": [0, 5]}, "pays": {"0": [0, 3]}})
    with pytest.raises(CheckpointError, match=r"names topics of several sources \(orders, pay"):
        s.offset_from_log([both], "offsets/4")
    with pytest.raises(CheckpointError, match="two offset lines with different offsets"):
        s.offset_from_log([o, p, json.dumps({"orders": {"0": [5, 9]}})], "offsets/4")
    with pytest.raises(CheckpointError, match=r"no offset line names .*\['payments'\]"):
        s.offset_from_log([o], "offsets/4")


def test_a_member_with_nothing_new_sits_at_its_end_and_a_no_data_batch_is_empty() -> None:
    s = _two()
    first = s.offset_from_log(list(_offsets({"0": [0, 5]}, {"0": [0, 3]})), "offsets/0")
    # Batch 1: only orders moved; payments' line is batch 0's again.
    second = s.offset_from_log(list(_offsets({"0": [5, 9]}, {"0": [0, 3]})), "offsets/1")
    ranges = s.batch_ranges(first, second)
    assert str(ranges) == "orders[0]:5..9 pays[0]:3..3"
    committed = BatchRanges.from_json(s.batch_ranges(None, first).to_json()).ends()
    assert classify(ranges, committed) is Coverage.NEW
    # Batch 2: the watermark moved, no source did: a no-data batch covers nothing.
    third = s.offset_from_log(list(_offsets({"0": [5, 9]}, {"0": [0, 3]})), "offsets/2")
    empty = s.batch_ranges(second, third)
    assert empty.empty and str(empty) == "orders[0]:9..9 pays[0]:3..3"
    # The replay of batch 1 after it committed is skipped.
    after = {**committed, ("orders", 0): 9}
    assert classify(s.batch_ranges(first, second), after) is Coverage.COMMITTED


def test_the_checkpoint_hands_the_set_every_line(tmp_path: Path) -> None:
    o, p = _offsets({"0": [0, 5]}, {"0": [0, 3]})
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text(f'v1\n{{"batchWatermarkMs":0}}\n{p}\n{o}\n')
    chk = Checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="expected one streaming source, found 2"):
        chk.source_offset(0)  # a pipeline with one source refuses two as before
    with pytest.raises(CheckpointError, match="give several streams as sources="):
        chk.source_offset(0, KafkaSource("b1:9092", "orders"))
    offset = chk.source_offset(0, _two())
    assert offset is not None
    assert str(_two().batch_ranges(None, offset)) == "orders[0]:0..5 pays[0]:0..3"


def test_uri_reopens_every_member_and_ledger_starts_split_by_topic(tmp_path: Path) -> None:
    s = _two()
    again = source_from_uri(s.uri())
    assert isinstance(again, SourceSet) and again.describe() == s.describe()
    assert s._part("orders", {("orders", 0): 4, ("pays", 0): 2}) == {("orders", 0): 4}
    assert s._part("payments", {("orders", 0): 4}) is None  # starts at its own offsets
    with pytest.raises(ConfigError, match="several streams, not one"):
        s.stream(None, None)  # type: ignore[arg-type]


def test_read_limits_connect_and_relocation_name_the_set(tmp_path: Path) -> None:
    from sparkonce.faults import NO_FAULTS
    from sparkonce.pipeline.connect import refuse_on_connect
    from sparkonce.pipeline.query import aligned_reads

    limited = SourceSet(
        {
            "orders": KafkaSource("b1:9092", "orders", max_records_per_partition=40),
            "payments": KafkaSource("b1:9092", "pays", max_records_per_batch=90),
        }
    )
    assert limited.read_limits() == {
        "orders.max_records_per_partition": 40,
        "payments.max_records_per_batch": 90,
    }
    aligned = limited.aligned()
    assert aligned is not None
    assert all(m.limits.proportional for m in aligned.sources.values())
    assert "per source (orders: 40 times the number of partitions; payments: 90)" in (
        aligned_reads(limited)
    )
    assert _two().aligned() is None  # no limits: nothing changes
    p = _pipeline(tmp_path, sources=dict(limited.sources))
    with pytest.raises(ConfigError, match=r"Connect sessions do not support the source SourceSet"):
        refuse_on_connect(p, faults=NO_FAULTS)
    with pytest.raises(ConfigError, match="is several sources; --source moves"):
        p.with_overrides(source_uri="kafka://b1:9092/other")


def test_a_self_join_of_one_source_stays_one_source(tmp_path: Path) -> None:
    """``source=`` joined with itself: Spark writes the one source's line twice, the same."""
    o, _ = _offsets({"0": [0, 5]}, {"0": [0, 3]})
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text(f'v1\n{{"batchWatermarkMs":0}}\n{o}\n{o}\n')
    one = KafkaSource("b1:9092", "orders")
    offset = Checkpoint(tmp_path).source_offset(0, one)
    assert offset is not None and str(one.batch_ranges(None, offset)) == "orders[0]:0..5"
