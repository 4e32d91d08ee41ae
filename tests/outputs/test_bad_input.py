"""Bad input at volume: parse_json on 12,000 generated records, most of them bad.

The records come from :mod:`tests.outputs.badinput` (Hypothesis strategies, one per kind of bad
or good record) with the outcome its oracle computes in plain Python. They go through a real
embedded log and Spark's reader of it, then ``parse_json``; every record must come out exactly
once, in the right output, with the right error class or the right values, and its source
identity and bytes unchanged. The measured quirks of Spark's JSON reader the oracle encodes are
checked against Spark one by one, and the two parse_json findings it made (a NULL message, an
undocumented reader limit) are regression tests.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sparkonce.outputs import parse_json
from sparkonce.sources.embedded import EmbeddedLogSource
from tests.outputs.badinput import (
    BAD_KINDS,
    ERROR_CLASSES,
    GOOD_KINDS,
    KIND_CLASSES,
    QUIRKS,
    REQUIRED,
    SCHEMA,
    SOURCE_SCHEMA,
    TOPIC,
    Bad,
    Good,
    Record,
    Unpredictable,
    expected,
    generate,
    kind_counts,
    log_positions,
    quirk_outcome,
    write_to_log,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from sparkonce.outputs import Parsed

pytestmark = pytest.mark.spark

COUNT = 12_000
SEED = 17
MIN_PER_BAD_KIND = 100


@pytest.fixture(scope="module")
def records() -> list[Record]:
    return generate(COUNT, SEED)


def _canonical(value: Any) -> Any:
    """``value`` comparable exactly: a float by its repr (-0.0 is not 0.0, inf is inf)."""
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, dict):
        return {name: _canonical(child) for name, child in value.items()}
    if isinstance(value, list):
        return [_canonical(child) for child in value]
    return value


def _outcome(row: dict[str, Any]) -> Good | Bad:
    if row["output"] == "good":
        assert row["error_class"] is None and row["data"] is not None, row
        return Good(row["data"])
    assert row["error_class"] is not None and row["data"] is None, row
    return Bad(row["error_class"])


def _same(got: Good | Bad, want: Good | Bad) -> bool:
    if isinstance(got, Bad) or isinstance(want, Bad):
        return got == want
    return bool(_canonical(got.values) == _canonical(want.values))


def _both_outputs(parsed: Parsed) -> DataFrame:
    """Good and bad rows in one DataFrame (one Spark job): which output, source identity, key,
    value, error_class (NULL for good) and data (NULL for bad)."""
    from pyspark.sql import functions as F

    identity = ["topic", "partition", "offset", "record_id", "key", "value"]
    data_type = parsed.good.schema["data"].dataType
    good = parsed.good.select(
        F.lit("good").alias("output"),
        *identity,
        F.lit(None).cast("string").alias("error_class"),
        "data",
    )
    bad = parsed.bad.select(
        F.lit("bad").alias("output"),
        *identity,
        "error_class",
        F.lit(None).cast(data_type).alias("data"),
    )
    return good.unionByName(bad)


def _static_source(spark: SparkSession, values: list[bytes | None]) -> DataFrame:
    rows = [(TOPIC, 0, i, b"k", value, None, f"q{i}") for i, value in enumerate(values)]
    return spark.createDataFrame(rows, SOURCE_SCHEMA)


# -- the generator and its oracle (no Spark) ------------------------------------------------------


@pytest.mark.crash_lane  # 12,000 records to generate; make test generates its own 10,000
def test_the_generator_mixes_every_kind_and_its_oracle_agrees(records: list[Record]) -> None:
    assert len(records) == COUNT
    counts = kind_counts(records)
    assert set(counts) == set(BAD_KINDS) | set(GOOD_KINDS)
    assert {
        kind: n for kind, n in counts.items() if kind in BAD_KINDS and n < MIN_PER_BAD_KIND
    } == {}
    bad = [r for r in records if isinstance(r.expected, Bad)]
    assert len(bad) >= COUNT // 2
    # each record's outcome is one its kind is built to give: the oracle and the strategies
    # check each other
    disagree = [
        (r.kind, r.expected, (r.value or b"")[:120])
        for r in records
        if (r.expected.error_class if isinstance(r.expected, Bad) else None)
        not in KIND_CLASSES[r.kind]
    ]
    assert disagree == []
    classes = Counter(r.expected.error_class for r in bad if isinstance(r.expected, Bad))
    assert all(classes[c] >= MIN_PER_BAD_KIND for c in ERROR_CLASSES), classes
    # the mix holds what the kinds promise
    by_kind = {kind: [r.value or b"" for r in records if r.kind == kind] for kind in counts}
    assert all(len(v) >= 10_000 for v in by_kind["huge_string"])
    assert sum(len(v) >= 200_000 for v in by_kind["huge_string"]) >= 20
    assert all(v.count(b"{") + v.count(b"[") > 1000 for v in by_kind["deep_nesting"])
    assert all(len(v) > 50_000 for v in by_kind["huge_name"])


def test_generation_is_deterministic_for_a_seed() -> None:
    first = generate(200, 5)
    assert first == generate(200, 5)
    assert first != generate(200, 6)


def test_the_oracle_states_each_measured_quirk() -> None:
    for rule, value, outcome in QUIRKS:
        assert _same(expected(value), quirk_outcome(outcome)), rule


@pytest.mark.parametrize(
    "value",
    [
        b'{"user":"a","amount":1} {"b":2}',  # parse_json's documented gap: good there
        b'{"user":1e23,"amount":1}',  # Java 17 writes 9.999999999999999E22
        b'{"user":[5.960464477539063e-08],"amount":1}',  # 2**-24: 5.9604644775390625E-8
        b'{"user":{"a":4.9e-324},"amount":1}',  # a subnormal
    ],
)
def test_the_oracle_refuses_what_it_cannot_predict(value: bytes) -> None:
    with pytest.raises(Unpredictable):
        expected(value)


# -- Spark ---------------------------------------------------------------------------------------


def test_spark_shows_each_measured_quirk(spark: SparkSession) -> None:
    """The rules the oracle encodes, checked on Spark: a change of Spark or Jackson shows here,
    by name, before it shows as thousands of mismatches in the volume test."""
    parsed = parse_json(
        _static_source(spark, [value for _, value, _ in QUIRKS]), SCHEMA, required=REQUIRED
    )
    rows = {row["record_id"]: row for row in _both_outputs(parsed).toArrow().to_pylist()}
    wrong = [
        (rule, _outcome(rows[f"q{i}"]), quirk_outcome(outcome))
        for i, (rule, _, outcome) in enumerate(QUIRKS)
        if not _same(_outcome(rows[f"q{i}"]), quirk_outcome(outcome))
    ]
    assert wrong == []


@pytest.mark.crash_lane  # make test runs these records through a crashing pipeline instead
def test_parse_json_sorts_bad_input_at_volume(
    spark: SparkSession, records: list[Record], tmp_path: Path
) -> None:
    log = tmp_path / "log"
    by_id = write_to_log(log, records, partitions=2)
    positions = log_positions(log)
    assert set(positions) == set(by_id) and len(by_id) == COUNT
    assert {p for p, _ in positions.values()} == {0, 1}

    # persisted: the union below reads good and bad, each a filter of the same parse
    source = EmbeddedLogSource(log, TOPIC).read_all(spark).persist()
    parsed = parse_json(source, SCHEMA, required=REQUIRED)
    rows = _both_outputs(parsed).toArrow().to_pylist()
    source.unpersist()

    # every input record exactly once: nothing lost, nothing twice, nothing in both outputs
    seen = Counter(row["record_id"] for row in rows)
    assert set(seen) == set(by_id)
    assert [rid for rid, n in seen.items() if n != 1] == []
    assert len(rows) == COUNT

    wrong: list[tuple[str, str, Any, Any]] = []
    dead_letters: Counter[str] = Counter()
    for row in rows:
        record = by_id[row["record_id"]]
        # the source identity and the bytes, as written, in either output
        assert (row["topic"], row["partition"], row["offset"]) == (
            TOPIC,
            *positions[row["record_id"]],
        ), row["record_id"]
        assert (row["key"], row["value"]) == (record.key, record.value), row["record_id"]
        got = _outcome(row)
        if not _same(got, record.expected):
            wrong.append((row["record_id"], record.kind, got, record.expected))
        if isinstance(got, Bad):
            dead_letters[record.kind] += 1
    assert wrong[:10] == [], f"{len(wrong)} records with the wrong outcome"
    # the dead letters hold every kind of bad record, many times over
    assert {
        kind: dead_letters[kind] for kind in BAD_KINDS if dead_letters[kind] < MIN_PER_BAD_KIND
    } == {}
    good_count = sum(isinstance(r.expected, Good) for r in records)
    assert sum(row["output"] == "good" for row in rows) == good_count


# -- found by this generator, fixed or documented since ---------------------------------


def test_a_dead_letter_always_has_a_message(spark: SparkSession) -> None:
    """Regression: the message was NULL when the field's last occurrence was JSON null."""
    value = b'{"user":"a","amount":"x","amount":null}'
    parsed = parse_json(_static_source(spark, [value]), SCHEMA, required=REQUIRED)
    [row] = parsed.bad.collect()
    assert row.error_class == "WRONG_TYPE"
    assert row.error is not None and "amount" in row.error


def test_a_giant_integer_is_malformed_as_documented(spark: SparkSession) -> None:
    """Over 1000 digits the reader refuses the whole value (parse_json's docstring says so)."""
    long = b'{"user":"a","amount":' + b"9" * 1001 + b"}"
    short = b'{"user":"a","amount":' + b"9" * 30 + b"}"
    parsed = parse_json(_static_source(spark, [long, short]), SCHEMA, required=REQUIRED)
    got = sorted(row.error_class for row in parsed.bad.collect())
    assert got == ["MALFORMED_JSON", "WRONG_TYPE"]


def test_floats_compare_exactly() -> None:
    """The comparison the volume test uses tells -0.0 from 0.0 (Python's == does not)."""
    assert not _same(Good({"price": -0.0}), Good({"price": 0.0}))
    assert _same(Good({"price": math.inf}), Good({"price": math.inf}))
    assert not _same(Good({"tags": ["1"]}), Good({"tags": [1]}))
