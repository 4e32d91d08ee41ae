"""The SQL sinks' schema check: output Spark types against the existing tables' declared types.

``validate`` runs before a run takes its epoch, so a refusal here never fences a live run.
SQLite would store a string in an ``INTEGER`` column without an error (type affinity), and
PostgreSQL would refuse only at write time, after the epoch was taken; both are refused here.
These tests need no Spark session (``pyspark.sql.types`` only); the PostgreSQL cases use the
test setup's real server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import types as T

from sparkonce.errors import ConfigError
from sparkonce.ledger.base import BatchContext
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks import PostgresSink, PostgresTwoPhaseSink, SQLiteSink, SqlSink
from sparkonce.sinks.inspect import inspector_for

LONG_V = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.LongType())])
STRING_V = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])

# Every Spark type the SQL sinks can store.
ALL_TYPES = T.StructType(
    [
        T.StructField("b8", T.ByteType()),
        T.StructField("i16", T.ShortType()),
        T.StructField("i32", T.IntegerType()),
        T.StructField("i64", T.LongType()),
        T.StructField("flag", T.BooleanType()),
        T.StructField("f32", T.FloatType()),
        T.StructField("f64", T.DoubleType()),
        T.StructField("s", T.StringType()),
        T.StructField("raw", T.BinaryType()),
        T.StructField("day", T.DateType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("ts_ntz", T.TimestampNTZType()),
        T.StructField("amount", T.DecimalType(12, 3)),
    ]
)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sink.db'}"
    return str(request.getfixturevalue("pg_url"))


def _sink(url: str, table: str = "out", **kwargs: Any) -> SqlSink:
    cls = SQLiteSink if url.startswith("sqlite") else PostgresSink
    return cls(url, table, **kwargs)


def _execute(sink: SqlSink, sql: str) -> None:
    sink.conn.execute(sql)


def test_a_changed_column_type_is_refused_naming_table_column_and_types(url: str) -> None:
    """The reported bug: ``v`` was written as a long; the transform now makes it a string."""
    sink = _sink(url)
    try:
        epoch = sink.acquire("p").epoch
        sink.validate(LONG_V)
        ctx = BatchContext("p", epoch, BatchRanges((OffsetRange("t", 0, 0, 2),)), 0, "cp")
        sink.commit_rows(ctx, LONG_V, ["id", "v"], [(1, 11), (2, 12)])
        declared = "INTEGER" if url.startswith("sqlite") else "bigint"

        with pytest.raises(ConfigError) as info:
            sink.validate(STRING_V, "update")
        msg = str(info.value)
        assert f"table 'out' in {sink.url} declares column 'v' as {declared}" in msg
        assert "output has 'v' as string" in msg
        assert "alter the table's column to TEXT" in msg
        assert "F.col('v').cast('long')" in msg
        assert sorted((r["id"], r["v"]) for r in inspector_for(sink).rows()) == [(1, 11), (2, 12)]
        assert len(sink.ledger("p")) == 1
    finally:
        sink.close()


def test_every_type_the_sink_creates_fits_its_own_table(url: str) -> None:
    sink = _sink(url)
    try:
        sink.stager._create_table(sink.conn, ALL_TYPES)
        sink.validate(ALL_TYPES)
        sink.validate(ALL_TYPES, "complete")
    finally:
        sink.close()


def _field(dtype: T.DataType) -> T.StructType:
    return T.StructType([T.StructField("c", dtype)])


SQLITE_CASES = [
    ("INTEGER", T.LongType(), True),
    ("BIGINT", T.IntegerType(), True),
    ("SMALLINT", T.ShortType(), True),
    ("INTEGER", T.BooleanType(), True),
    ("BOOLEAN", T.BooleanType(), True),
    ("REAL", T.FloatType(), True),
    ("DOUBLE", T.DoubleType(), True),
    ("TEXT", T.StringType(), True),
    ("VARCHAR(20)", T.StringType(), True),
    ("TEXT", T.DecimalType(10, 2), True),
    ("TEXT", T.TimestampType(), True),
    ("TIMESTAMP", T.TimestampType(), True),
    ("DATETIME", T.TimestampNTZType(), True),
    ("DATE", T.DateType(), True),
    ("BLOB", T.BinaryType(), True),
    ("", T.StringType(), True),  # an untyped column stores values exactly as written
    ("INTEGER", T.StringType(), False),
    ("INTEGER", T.DoubleType(), False),
    ("TEXT", T.LongType(), False),
    ("REAL", T.LongType(), False),
    ("NUMERIC", T.DecimalType(10, 2), False),  # NUMERIC affinity turns '12.50' into 12.5
    ("INTEGER", T.TimestampType(), False),
    ("BLOB", T.StringType(), False),
    ("TEXT", T.BinaryType(), False),
]

POSTGRES_CASES = [
    ("bigint", T.LongType(), True),
    ("bigint", T.IntegerType(), True),
    ("integer", T.ShortType(), True),
    ("smallint", T.ByteType(), True),
    ("double precision", T.FloatType(), True),
    ("text", T.StringType(), True),
    ("varchar(20)", T.StringType(), True),
    ("timestamp", T.TimestampType(), True),
    ("timestamptz", T.TimestampType(), True),
    ("timestamp(3)", T.TimestampNTZType(), True),
    ("numeric(12,2)", T.DecimalType(10, 2), True),
    ("numeric", T.DecimalType(38, 18), True),
    ("boolean", T.BooleanType(), True),
    ("bytea", T.BinaryType(), True),
    ("date", T.DateType(), True),
    ("integer", T.LongType(), False),  # a wider integer into a narrower one
    ("bigint", T.StringType(), False),
    ("text", T.LongType(), False),
    ("real", T.DoubleType(), False),
    ("bigint", T.DoubleType(), False),
    ("numeric(10,1)", T.DecimalType(10, 2), False),  # would round
    ("numeric(10,2)", T.DecimalType(12, 2), False),  # would overflow
    ("jsonb", T.StringType(), False),
    ("date", T.TimestampType(), False),
    ("boolean", T.IntegerType(), False),
]


@pytest.mark.parametrize(("declared", "dtype", "fits"), SQLITE_CASES)
def test_sqlite_declared_types(
    tmp_path: Path, declared: str, dtype: T.DataType, fits: bool
) -> None:
    sink = SQLiteSink(f"sqlite:///{tmp_path / 'sink.db'}", "out")
    try:
        _execute(sink, f'CREATE TABLE out ("c" {declared})')
        _check(sink, dtype, fits, declared)
    finally:
        sink.close()


@pytest.mark.parametrize(("declared", "dtype", "fits"), POSTGRES_CASES)
def test_postgres_declared_types(pg_url: str, declared: str, dtype: T.DataType, fits: bool) -> None:
    sink = PostgresSink(pg_url, "out")
    try:
        _execute(sink, f'CREATE TABLE out ("c" {declared})')
        _check(sink, dtype, fits, declared)
    finally:
        sink.close()


def _check(sink: SqlSink, dtype: T.DataType, fits: bool, declared: str) -> None:
    if fits:
        sink.validate(_field(dtype))
        return
    with pytest.raises(ConfigError, match="declares column 'c' as") as info:
        sink.validate(_field(dtype))
    assert f"has 'c' as {dtype.simpleString()}" in str(info.value)
    assert "Nothing was written and no epoch was taken" in str(info.value)


# -- the two-phase sink: the view or table, and the tables the executors write to -------------


def test_two_phase_append_checks_the_view(pg_url: str) -> None:
    sink = PostgresTwoPhaseSink(pg_url, "out")
    try:
        sink.stager._ensure_tables(LONG_V)
        sink.validate(LONG_V)
        with pytest.raises(ConfigError, match=r"table 'out' .* declares column 'v' as bigint"):
            sink.validate(STRING_V)
    finally:
        sink.close()


def test_two_phase_append_checks_the_data_table(pg_url: str) -> None:
    """The view may be gone; the data table the tasks COPY into is checked too."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE out__sparkonce_data (id bigint, v bigint, sparkonce_attempt bigint)"
        )
    sink = PostgresTwoPhaseSink(pg_url, "out")
    try:
        with pytest.raises(
            ConfigError, match=r"table 'out__sparkonce_data' .* declares column 'v' as bigint"
        ):
            sink.validate(STRING_V)
    finally:
        sink.close()


def test_two_phase_upsert_checks_the_table_and_the_stage(pg_url: str) -> None:
    sink = PostgresTwoPhaseSink(pg_url, "out", mode="upsert", keys=["id"])
    try:
        sink.stager._ensure_tables(LONG_V)
        sink.validate(LONG_V)
        with pytest.raises(ConfigError, match=r"table 'out' .* declares column 'v' as bigint"):
            sink.validate(STRING_V)
        # A stage left with another type (say, by an older version of the transform).
        _execute(sink, "DROP TABLE out__sparkonce_stage")
        _execute(
            sink, "CREATE TABLE out__sparkonce_stage (id bigint, v text, sparkonce_attempt bigint)"
        )
        with pytest.raises(
            ConfigError, match=r"table 'out__sparkonce_stage' .* declares column 'v' as text"
        ):
            sink.validate(LONG_V)
    finally:
        sink.close()
