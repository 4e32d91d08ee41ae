"""Dead letters and parse helpers (sparkonce.outputs.quality), against real Spark in ANSI mode.

Static DataFrames use the source schema; one test runs the helpers inside a streaming query.
The property test checks parse_json against an oracle written here in plain Python.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce.errors import ConfigError
from sparkonce.outputs import (
    DEAD_LETTER_SCHEMA,
    Parsed,
    mark_bad,
    parse_delimited,
    parse_json,
    then,
    to_number,
)

SOURCE_SCHEMA = (
    "topic STRING, partition INT, offset BIGINT, key BINARY, value BINARY, "
    "timestamp TIMESTAMP, record_id STRING"
)
SCHEMA = (
    "id BIGINT, n INT, name STRING, score DOUBLE, ok BOOLEAN, tags ARRAY<STRING>, "
    "inner STRUCT<x: INT, y: STRING>"
)


def _source(spark: SparkSession, values: Sequence[bytes | None]) -> DataFrame:
    rows = [("events", i % 3, i, b"k", value, None, f"r{i}") for i, value in enumerate(values)]
    return spark.createDataFrame(rows, SOURCE_SCHEMA)


def _outcomes(parsed: Parsed, *fields: str) -> list[tuple[str, str | None, Any]]:
    """(record_id, error_class or None, data or error) of every output row, in ONE Spark job."""
    data = F.to_json(F.col("data")) if not fields else F.to_json(F.struct(*fields))
    good = parsed.good.select("record_id", F.lit(None).cast("string").alias("cls"), data.alias("x"))
    bad = parsed.bad.select(
        "record_id", F.col("error_class").alias("cls"), F.col("error").alias("x")
    )
    return [(r.record_id, r.cls, r.x) for r in good.unionByName(bad).collect()]


def _assert_exact_split(outcomes: list[tuple[str, str | None, Any]], count: int) -> None:
    ids = [rid for rid, _, _ in outcomes]
    good = {rid for rid, cls, _ in outcomes if cls is None}
    bad = {rid for rid, cls, _ in outcomes if cls is not None}
    assert good | bad == {f"r{i}" for i in range(count)}  # nothing dropped
    assert not good & bad  # nothing in both
    assert len(ids) == count  # nothing twice


# -- the problem, and the way out -----------------------------------------------------------------


def test_plain_cast_fails_under_ansi_and_the_helpers_do_not(spark: SparkSession) -> None:
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"
    df = _source(spark, [b"1", b"abc", b"3"])
    with pytest.raises(Exception, match="CAST_INVALID_INPUT"):
        df.select(F.expr("CAST(CAST(value AS STRING) AS BIGINT)")).collect()

    split = parse_delimited(df, [("n", "bigint")])
    outcomes = _outcomes(split)
    _assert_exact_split(outcomes, 3)
    assert sorted(o for o in outcomes if o[1] is None) == [
        ("r0", None, '{"n":1}'),
        ("r2", None, '{"n":3}'),
    ]
    assert [o for o in outcomes if o[1] is not None] == [
        ("r1", "CAST_FAILED", "field 'n' is not a valid bigint: 'abc'")
    ]
    as_json = parse_json(_source(spark, [b'{"n": 1}', b'{"n": "abc"}']), "n BIGINT")
    assert sorted(_outcomes(as_json)) == [
        ("r0", None, '{"n":1}'),
        ("r1", "WRONG_TYPE", "field 'n' is not a valid bigint: 'abc'"),
    ]
    numbers = df.select(to_number(F.col("value").cast("string"), "bigint").alias("n"))
    assert sorted(numbers.collect(), key=str) == sorted([(1,), (None,), (3,)], key=str)


# -- parse_json: one case of each kind ------------------------------------------------------------

GOOD_FULL = {
    "id": 7,
    "n": -2,
    "name": "ann",
    "score": 2.5,
    "ok": True,
    "tags": ["a", "b"],
    "inner": {"x": 3, "y": "q"},
}
HUGE = "x" * 5000
CASES: list[tuple[bytes | None, str | None]] = [
    (json.dumps(GOOD_FULL).encode(), None),
    (b'{"id": 8}', None),
    (b'{"id": 9, "name": 5, "tags": [1, null]}', None),  # STRING takes any JSON value
    (b'{"id": 1, "name": "\xff"}', "INVALID_UTF8"),
    (b'{"id": 1, "name": "a', "MALFORMED_JSON"),  # truncated
    (b'{"id": "abc"}', "WRONG_TYPE"),
    (b'{"id": 99999999999999999999}', "WRONG_TYPE"),  # overflows BIGINT
    (b'{"id": 1, "n": 3000000000}', "WRONG_TYPE"),  # overflows INT
    (b'{"id": 1.5}', "WRONG_TYPE"),
    (b"", "MALFORMED_JSON"),
    (None, "NULL_VALUE"),
    (b'{"id": 1, "inner": [1, 2]}', "WRONG_TYPE"),  # array where a struct is expected
    (b'{"id": 1, "inner": {"x": "no"}}', "WRONG_TYPE"),  # wrong type one level down
    (b'{"id": 1, "tags": {"a": 1}}', "WRONG_TYPE"),  # object where an array is expected
    (b'{"name": "no id"}', "MISSING_FIELD"),
    (b'{"id": null}', "MISSING_FIELD"),
    (b'[{"id": 1}]', "MALFORMED_JSON"),
    (b'{"id": 1} trailing', "MALFORMED_JSON"),
    (b"{'id': 1}", "MALFORMED_JSON"),  # single quotes are not JSON
    (json.dumps({"id": HUGE}).encode(), "WRONG_TYPE"),
]


def test_parse_json_sorts_each_kind_of_record(spark: SparkSession) -> None:
    values = [value for value, _ in CASES]
    parsed = parse_json(_source(spark, values), SCHEMA, required=("id",))
    assert [(f.name, f.dataType) for f in parsed.bad.schema] == [
        (f.name, f.dataType) for f in DEAD_LETTER_SCHEMA
    ]
    assert parsed.good.columns == [*_source(spark, []).columns, "data"]

    good = {r.record_id: r.data for r in parsed.good.collect()}
    bad = {r.record_id: r for r in parsed.bad.collect()}
    assert set(good) | set(bad) == {f"r{i}" for i in range(len(CASES))}
    assert not set(good) & set(bad)
    for i, (value, expected) in enumerate(CASES):
        rid = f"r{i}"
        if expected is None:
            assert rid in good, (value, bad.get(rid))
        else:
            assert rid in bad, (value, good.get(rid))
            row = bad[rid]
            assert row.error_class == expected, (value, row.error)
            # the dead letter carries the source record as it was read
            assert (row.topic, row.partition, row.offset) == ("events", i % 3, i)
            assert row.value == value and row.key == b"k"

    assert good["r0"].asDict(recursive=True) == GOOD_FULL
    assert good["r1"].asDict(recursive=True) == {
        "id": 8,
        "n": None,
        "name": None,
        "score": None,
        "ok": None,
        "tags": None,
        "inner": None,
    }
    assert (good["r2"].name, good["r2"].tags) == ("5", ["1", None])
    messages = {i: bad[f"r{i}"].error for i in range(len(CASES)) if f"r{i}" in bad}
    not_utf8 = CASES[3][0]
    assert not_utf8 is not None
    assert messages[3] == f"value is not valid UTF-8 (first bytes, hex: {not_utf8.hex().upper()})"
    assert messages[5] == "field 'id' is not a valid bigint: 'abc'"
    assert messages[6] == "field 'id' is not a valid bigint: '99999999999999999999'"
    assert messages[9] == "value is empty"
    assert messages[10] == "value is null"
    assert messages[12] == """field 'inner' is not a valid struct<x:int,y:string>: '{"x":"no"}'"""
    assert messages[14] == "required field 'id' is missing or null"
    assert messages[16] == """value is not a JSON object: '[{"id": 1}]'"""
    # a huge value is cut in the message, never in the dead letter's bytes
    assert messages[19] == f"field 'id' is not a valid bigint: '{'x' * 200}...'"
    assert bad["r19"].value == json.dumps({"id": HUGE}).encode()


def test_parse_json_reads_string_values_of_utf8_sources(spark: SparkSession) -> None:
    rows = [("t", 0, 0, "k", '{"id": 1}', None, "a"), ("t", 0, 1, None, "nope", None, "b")]
    df = spark.createDataFrame(rows, SOURCE_SCHEMA.replace("BINARY", "STRING"))
    parsed = parse_json(df, "id BIGINT")
    assert [(r.record_id, r.data.id) for r in parsed.good.collect()] == [("a", 1)]
    [bad] = parsed.bad.collect()
    assert (bad.record_id, bad.key, bad.value, bad.error_class) == (
        "b",
        None,
        b"nope",
        "MALFORMED_JSON",
    )


# -- parse_json against a plain-Python oracle -----------------------------------------------------

PROP_SCHEMA = "id BIGINT, n INT, score DOUBLE, ok BOOLEAN, name STRING, nums ARRAY<BIGINT>"
LONG = (-(2**63), 2**63 - 1)
INT = (-(2**31), 2**31 - 1)


def _is_int(v: object, bounds: tuple[int, int]) -> bool:
    return type(v) is int and bounds[0] <= v <= bounds[1]


FIELD_CHECKS = {
    "id": lambda v: _is_int(v, LONG),
    "n": lambda v: _is_int(v, INT),
    "score": lambda v: type(v) in (int, float),
    "ok": lambda v: type(v) is bool,
    "name": lambda v: True,
    "nums": lambda v: type(v) is list and all(e is None or _is_int(e, LONG) for e in v),
}


def _reject_constant(name: str) -> None:
    raise ValueError(name)  # NaN/Infinity are not JSON


def oracle(raw: bytes | None) -> str | None:
    """The error class a raw value must get (None: good), from json.loads and plain checks."""
    if raw is None:
        return "NULL_VALUE"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "INVALID_UTF8"
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        return "MALFORMED_JSON"
    if type(doc) is not dict:
        return "MALFORMED_JSON"
    for name, check in FIELD_CHECKS.items():
        if doc.get(name) is not None and not check(doc[name]):
            return "WRONG_TYPE"
    if doc.get("id") is None:
        return "MISSING_FIELD"
    return None


json_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.lists(st.one_of(st.none(), st.integers(-(2**65), 2**65), st.text(max_size=2)), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
good_objects = st.fixed_dictionaries(
    {"id": st.integers(*LONG)},
    optional={
        "n": st.one_of(st.none(), st.integers(*INT)),
        "score": st.one_of(
            st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False)
        ),
        "ok": st.booleans(),
        "name": json_values,
        "nums": st.lists(st.one_of(st.none(), st.integers(*LONG)), max_size=3),
        "extra": json_values,
    },
)
# good objects, one field swapped for any JSON value, any fields with any values
objects = st.one_of(
    good_objects,
    good_objects,
    st.tuples(good_objects, st.sampled_from(list(FIELD_CHECKS)), json_values).map(
        lambda t: {**t[0], t[1]: t[2]}
    ),
    st.dictionaries(st.sampled_from([*FIELD_CHECKS, "extra"]), json_values, max_size=6),
)
encoded = st.tuples(objects, st.booleans()).map(
    lambda t: json.dumps(t[0], ensure_ascii=t[1]).encode("utf-8")
)
BAD_UTF8 = [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf4\x90\x80\x80"]
raw_values = st.one_of(
    encoded,
    encoded,
    st.tuples(encoded, st.integers(0, 10_000)).map(lambda t: t[0][: t[1] % len(t[0])]),
    st.sampled_from(BAD_UTF8).map(lambda b: b'{"id": 1, "name": "a' + b + b'"}'),
    # garbage without '}' (see parse_json's note on text after a complete object)
    st.binary(max_size=12).filter(lambda b: b"}" not in b),
    json_values.map(lambda v: json.dumps(v).encode()),  # JSON, but no object
    st.none(),
)


@settings(max_examples=5, deadline=None)
@given(st.lists(raw_values, min_size=200, max_size=300))
def test_parse_json_agrees_with_a_python_oracle(
    spark: SparkSession, values: list[bytes | None]
) -> None:
    parsed = parse_json(_source(spark, values), PROP_SCHEMA, required=("id",))
    outcomes = _outcomes(parsed, "data.id", "data.name")
    _assert_exact_split(outcomes, len(values))
    got = {rid: (cls, x) for rid, cls, x in outcomes}
    for i, raw in enumerate(values):
        cls, x = got[f"r{i}"]
        assert cls == oracle(raw), (raw, x)
        if cls is None:  # the typed values are the JSON's own
            assert raw is not None
            doc = json.loads(raw)
            out = json.loads(x)
            assert out.get("id") == doc["id"]
            if isinstance(doc.get("name"), str):
                assert out.get("name") == doc["name"]


# -- parse_delimited, to_number, mark_bad, then ---------------------------------------------------


def test_parse_delimited(spark: SparkSession) -> None:
    values = [
        b"1|a|2.50|2024-02-29",
        b"2||  |",
        b"x|b|1|2024-01-01",
        b"3|c|1",
        b"4|d|1|2023-02-30",
        b"",
    ]
    fields = [("n", "bigint"), ("s", "string"), ("amount", "decimal(5,2)"), ("day", "date")]
    outcomes = _outcomes(parse_delimited(_source(spark, values), fields, sep="|"))
    _assert_exact_split(outcomes, len(values))
    assert sorted(outcomes) == [
        ("r0", None, '{"n":1,"s":"a","amount":2.50,"day":"2024-02-29"}'),
        ("r1", None, '{"n":2,"s":""}'),  # spaces around a number are allowed; empty -> NULL
        ("r2", "CAST_FAILED", "field 'n' is not a valid bigint: 'x'"),
        ("r3", "BAD_FIELD_COUNT", "expected 4 fields separated by '|', got 3: '3|c|1'"),
        ("r4", "CAST_FAILED", "field 'day' is not a valid date: '2023-02-30'"),
        ("r5", "BAD_FIELD_COUNT", "expected 4 fields separated by '|', got 1: ''"),
    ]


def test_to_number(spark: SparkSession) -> None:
    df = spark.createDataFrame(
        [("12",), (" 7 ",), ("abc",), ("1e3",), ("99999999999",), (None,)], "s STRING"
    )
    got = df.select(
        to_number("s", "int").alias("i"),
        to_number(F.col("s"), "double").alias("d"),
        to_number("s", "decimal(4,1)").alias("dec"),
    ).collect()
    assert [tuple(r) for r in got] == [
        (12, 12.0, 12),
        (7, 7.0, 7),
        (None, None, None),
        (None, 1000.0, None),  # 1000 does not fit decimal(4,1)
        (None, 99999999999.0, None),
        (None, None, None),
    ]
    money = spark.createDataFrame([("1,234.50",), ("12x",)], "s STRING")
    assert [r[0] for r in money.select(to_number("s", "double", format="9,999.99")).collect()] == [
        1234.5,
        None,
    ]
    with pytest.raises(ConfigError, match="not a number type"):
        to_number("s", "string")


def test_mark_bad_and_then_keep_the_first_reason(spark: SparkSession) -> None:
    values = [
        b'{"id": 1}',
        b'{"id": -5}',
        b'{"id": "x"}',
        b'{"id": 2, "name": null}',
        b'{"name": "a"}',
    ]
    parsed = parse_json(_source(spark, values), "id BIGINT, name STRING")
    checked = then(
        parsed,
        lambda df: mark_bad(
            df,
            F.col("data.id") < 0,  # NULL for r4: not a failure of this check
            "NEGATIVE_ID",
            F.concat(F.lit("id is negative: "), F.col("data.id").cast("string")),
        ),
    )
    checked = then(
        checked, lambda df: mark_bad(df, F.col("data.name").isNull(), "NO_NAME", "name is null")
    )
    outcomes = _outcomes(checked, "data.id")
    _assert_exact_split(outcomes, len(values))
    assert sorted(outcomes) == [
        ("r0", "NO_NAME", "name is null"),
        ("r1", "NEGATIVE_ID", "id is negative: -5"),
        ("r2", "WRONG_TYPE", "field 'id' is not a valid bigint: 'x'"),
        ("r3", "NO_NAME", "name is null"),
        ("r4", None, "{}"),  # to_json leaves out the NULL id
    ]
    assert checked.good.columns == [*_source(spark, []).columns, "data"]
    with pytest.raises(ConfigError, match="error_class"):
        mark_bad(parsed.good, F.lit(True), "has spaces", "m")
    with pytest.raises(ConfigError, match="not a Parsed"):
        then(parsed, lambda df: df)  # type: ignore[arg-type,return-value]


def test_bad_arguments_raise_config_error(spark: SparkSession) -> None:
    df = _source(spark, [])
    with pytest.raises(ConfigError, match="no column 'payload'"):
        parse_json(df, "id BIGINT", column="payload")
    with pytest.raises(ConfigError, match="bad schema 'id BIGINT, name'"):
        parse_json(df, "id BIGINT, name")
    with pytest.raises(ConfigError, match="non-empty struct"):
        parse_json(df, "bigint")
    with pytest.raises(ConfigError, match="required names \\['nope'\\]"):
        parse_json(df, "id BIGINT", required=("nope",))
    with pytest.raises(ConfigError, match="already has a column 'value'"):
        parse_json(df, "id BIGINT", into="value")
    with pytest.raises(ConfigError, match="no column 'record_id'"):
        parse_json(df.drop("record_id"), "id BIGINT")
    with pytest.raises(ConfigError, match="only binary or string"):
        parse_json(df, "id BIGINT", column="offset")
    with pytest.raises(ConfigError, match="unknown type 'bigin'"):
        parse_delimited(df, [("n", "bigin")])
    with pytest.raises(ConfigError, match="distinct"):
        parse_delimited(df, [("n", "int"), ("n", "int")])


# -- streaming ------------------------------------------------------------------------------------


def test_parse_json_in_a_streaming_query(spark: SparkSession, tmp_path: Path) -> None:
    payloads = ['{"id": 1}', '{"id": "abc"}', "", '{"id": 4', '{"id": 5}', None, '{"x": 1}']
    inbox = tmp_path / "in"
    inbox.mkdir()
    lines = [
        json.dumps(
            {
                "topic": "events",
                "partition": i % 2,
                "offset": 100 + i,
                "key": None,
                "value": p,
                "timestamp": "2024-01-01T00:00:00Z",
                "record_id": f"r{i}",
            }
        )
        for i, p in enumerate(payloads)
    ]
    (inbox / "part-0.json").write_text("\n".join(lines) + "\n")
    stream = spark.readStream.schema(SOURCE_SCHEMA.replace("BINARY", "STRING")).json(str(inbox))
    parsed = parse_json(stream, "id BIGINT", required=("id",))
    assert parsed.good.isStreaming and parsed.bad.isStreaming
    out = parsed.good.select(
        "partition",
        "offset",
        "record_id",
        F.col("data.id").alias("id"),
        F.lit(None).cast("string").alias("error_class"),
    ).unionByName(
        parsed.bad.select(
            "partition",
            "offset",
            "record_id",
            F.lit(None).cast("bigint").alias("id"),
            "error_class",
        )
    )
    seen: list[tuple[Any, ...]] = []
    query = (
        out.writeStream.foreachBatch(lambda batch, _: seen.extend(map(tuple, batch.collect())))
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    query.awaitTermination(60)
    assert query.exception() is None
    assert sorted(seen, key=lambda r: r[1]) == [
        (0, 100, "r0", 1, None),
        (1, 101, "r1", None, "WRONG_TYPE"),
        (0, 102, "r2", None, "MALFORMED_JSON"),
        (1, 103, "r3", None, "MALFORMED_JSON"),
        (0, 104, "r4", 5, None),
        (1, 105, "r5", None, "NULL_VALUE"),
        (0, 106, "r6", None, "MISSING_FIELD"),
    ]
