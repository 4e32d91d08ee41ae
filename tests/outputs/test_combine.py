"""combine / split against real Spark: static round trips, one streaming query, validation."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sparkonce.errors import ConfigError
from sparkonce.outputs import (
    OUTPUT_TAG,
    OutputLayout,
    check_output_mode,
    combine,
    select_output,
    split,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType


def _loose(dtype: DataType) -> DataType:
    """The type with every nullability flag set (split may relax nullability, nothing else)."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(dtype, StructType):
        return StructType([StructField(f.name, _loose(f.dataType)) for f in dtype.fields])
    if isinstance(dtype, ArrayType):
        return ArrayType(_loose(dtype.elementType))
    if isinstance(dtype, MapType):
        return MapType(_loose(dtype.keyType), _loose(dtype.valueType))
    return dtype


def _rows(df: DataFrame) -> list[str]:
    """Collected rows, field names included, in a stable order."""
    return sorted(repr(row) for row in df.collect())


def _branches(spark: SparkSession) -> dict[str, DataFrame]:
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        DecimalType,
        DoubleType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    deep = StructType([StructField("s", StringType()), StructField("odd name.x", LongType())])
    events_schema = StructType(
        [
            StructField("id", LongType(), False),
            StructField("a b", StringType()),
            StructField("x.y", DoubleType()),
            StructField("back`tick", IntegerType()),
            StructField("amount", DecimalType(12, 3)),
            StructField("at", TimestampType()),
            StructField("raw", BinaryType()),
            StructField("tags", ArrayType(StringType())),
            StructField("attrs", MapType(StringType(), IntegerType())),
            StructField(
                "nested", StructType([StructField("deep", deep), StructField("n", LongType())])
            ),
        ]
    )
    events = [
        (
            1,
            "one",
            1.5,
            7,
            Decimal("12.345"),
            dt.datetime(2024, 1, 2, 3, 4, 5, 678901),
            b"\x00\xff",
            ["a", None, "c"],
            {"k": 1, "z": None},
            {"deep": {"s": "in", "odd name.x": 9}, "n": 3},
        ),
        (2, None, None, None, None, None, None, None, None, None),
        (
            3,
            "",
            -0.0,
            -1,
            Decimal("-0.001"),
            dt.datetime(1970, 1, 1),
            b"",
            [],
            {},
            {"deep": None, "n": None},
        ),
    ]
    totals_schema = StructType(
        [StructField("key", StringType(), False), StructField("n", IntegerType())]
    )
    totals = [("a", 1), ("b", None)]
    empty_schema = StructType(
        [StructField("reason", StringType()), StructField("payload", BinaryType())]
    )
    return {
        "events": spark.createDataFrame(events, events_schema).localCheckpoint(),
        "totals": spark.createDataFrame(totals, totals_schema).localCheckpoint(),
        "dead_letters": spark.createDataFrame([], empty_schema),
    }


def test_static_round_trip(spark: SparkSession, tmp_path: Path) -> None:
    branches = _branches(spark)
    combined, layout = combine(branches)

    assert layout.names == ("events", "totals", "dead_letters")
    assert combined.columns == [OUTPUT_TAG, "events", "totals", "dead_letters"]
    assert not combined.isStreaming
    assert combined.schema == layout.combined_schema
    tags = sorted(r[0] for r in combined.select(OUTPUT_TAG).collect())
    assert tags == ["events"] * 3 + ["totals"] * 2

    # A Parquet copy of the combined rows, read back, splits the same way.
    combined.write.parquet(str(tmp_path / "copy"))
    copy = spark.read.parquet(str(tmp_path / "copy"))

    for batch in (combined, copy):
        outputs = split(batch, layout)
        assert list(outputs) == list(layout.names)
        for name, original in branches.items():
            got = outputs[name]
            assert got.columns == original.columns, name
            assert _loose(got.schema) == _loose(original.schema), name
            assert _rows(got) == _rows(original), name
    assert _rows(select_output(copy, layout, "totals")) == _rows(branches["totals"])
    # As documented: a non-null top-level column comes back nullable, nothing else changes.
    assert not branches["totals"].schema["key"].nullable
    assert split(combined, layout)["totals"].schema["key"].nullable
    assert outputs["dead_letters"].count() == 0
    assert [f.name for f in outputs["dead_letters"].schema] == ["reason", "payload"]


def test_static_round_trip_keeps_values_exactly(spark: SparkSession) -> None:
    """Spot-check values that a sloppy cast or a column lookup by dotted name would break."""
    combined, layout = combine(_branches(spark))
    events = {r["id"]: r for r in select_output(combined, layout, "events").collect()}
    one = events[1]
    assert one["a b"] == "one" and one["x.y"] == 1.5 and one["back`tick"] == 7
    assert one["amount"] == Decimal("12.345")
    assert one["at"] == dt.datetime(2024, 1, 2, 3, 4, 5, 678901)
    assert bytes(one["raw"]) == b"\x00\xff"
    assert one["tags"] == ["a", None, "c"] and one["attrs"] == {"k": 1, "z": None}
    assert one["nested"]["deep"]["odd name.x"] == 9
    assert all(events[2][c] is None for c in events[2].__fields__ if c != "id")
    assert events[3]["nested"]["deep"] is None


def test_empty_batch_gives_empty_outputs(spark: SparkSession) -> None:
    branches = _branches(spark)
    _, layout = combine(branches)
    empty = spark.createDataFrame([], layout.combined_schema)
    outputs = split(empty, layout)
    for name, original in branches.items():
        assert outputs[name].collect() == []
        assert outputs[name].columns == original.columns
        assert _loose(outputs[name].schema) == _loose(original.schema)


# -- streaming ---------------------------------------------------------------------------------

BASE = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
# One file per micro-batch: (seconds after BASE, key, value). Rows come out of order, but
# none is late (behind the watermark): Spark may or may not aggregate a late row.
FILES: list[list[tuple[int, str, int]]] = [
    [(5, "a", 1), (20, "b", 2), (50, "a", 3)],
    [(62, "a", 10), (70, "b", 20), (30, "a", 4)],
    [(130, "b", 5), (125, "a", 6)],
    [(200, "a", 7), (150, "b", 100), (190, "b", 8)],
    [(210, "a", 1)],
]
DELAY = 60
BIG = 5  # the stateless branch keeps rows with value >= BIG


def _oracle(mode: str) -> list[dict[str, list[tuple[Any, ...]]]]:
    """Per batch, the rows each output should give, computed from FILES alone.

    One batch per file, then one batch without data (the watermark moved in the last one).
    big: the batch's rows with value >= BIG. totals, by (one-minute window start, key):
    in update mode, the groups the batch touched, with their running sums; in append mode,
    the final sums of the windows that end at or before the batch's watermark (the largest
    event time of the earlier batches minus DELAY) and did not come out before.
    """
    sums: dict[tuple[int, str], int] = defaultdict(int)
    done: set[tuple[int, str]] = set()
    latest: int | None = None
    batches: list[dict[str, list[tuple[Any, ...]]]] = []
    for rows in [*FILES, []]:
        touched = set()
        for t, key, value in rows:
            window = t // 60 * 60
            sums[window, key] += value
            touched.add((window, key))
        if mode == "update":
            totals = sorted((w, k, sums[w, k]) for w, k in touched)
        else:
            watermark = -1 if latest is None else latest - DELAY
            closed = {(w, k) for w, k in sums if w + 60 <= watermark} - done
            done |= closed
            totals = sorted((w, k, sums[w, k]) for w, k in closed)
        batches.append({"totals": totals, "big": sorted((k, v) for _, k, v in rows if v >= BIG)})
        latest = max([t for t, _, _ in rows] + ([] if latest is None else [latest]))
    return batches


def _write_files(root: Path) -> None:
    root.mkdir()
    for i, rows in enumerate(FILES):
        path = root / f"part-{i}.json"
        lines = [
            json.dumps({"ts": (BASE + dt.timedelta(seconds=t)).isoformat(), "key": k, "value": v})
            for t, k, v in rows
        ]
        path.write_text("\n".join(lines) + "\n")
        stamp = 1_700_000_000 + i * 10  # the file source takes files oldest first
        os.utime(path, (stamp, stamp))


@pytest.mark.parametrize("mode", ["update", "append"])
def test_streaming_two_outputs_one_query(spark: SparkSession, tmp_path: Path, mode: str) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    _write_files(tmp_path / "in")
    schema = StructType(
        [
            StructField("ts", TimestampType()),
            StructField("key", StringType()),
            StructField("value", LongType()),
        ]
    )
    source = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "in"))
        .withWatermark("ts", f"{DELAY} seconds")
    )
    totals = source.groupBy(F.window("ts", "1 minute"), "key").agg(F.sum("value").alias("sum v"))
    big = source.where(F.col("value") >= BIG).select("key", F.col("value").alias("big.value"))
    combined, layout = combine({"totals": totals, "big": big})
    assert combined.isStreaming
    assert check_output_mode(layout, mode) == mode

    seen: dict[int, dict[str, list[tuple[Any, ...]]]] = {}
    schemas: dict[int, dict[str, list[str]]] = {}

    def collect(batch: DataFrame, batch_id: int) -> None:
        outputs = split(batch, layout)
        schemas[batch_id] = {name: df.columns for name, df in outputs.items()}
        seen[batch_id] = {
            "totals": sorted(
                (int(r["window"]["start"].timestamp() - BASE.timestamp()), r["key"], r["sum v"])
                for r in outputs["totals"].collect()
            ),
            "big": sorted((r["key"], r["big.value"]) for r in outputs["big"].collect()),
        }

    query = (
        combined.writeStream.outputMode(mode)
        .foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None

    expected = _oracle(mode)
    assert seen == dict(enumerate(expected))
    # The oracle is not trivial: outputs differ between batches and modes, some are empty.
    assert expected[2]["big"] == [("a", 6), ("b", 5)] and expected[0]["big"] == []
    if mode == "append":
        assert [len(b["totals"]) for b in expected] == [0, 0, 0, 2, 2, 0]
    else:
        assert expected[1]["totals"] == [(0, "a", 8), (60, "a", 10), (60, "b", 20)]
    for columns in schemas.values():
        assert columns == {"totals": ["window", "key", "sum v"], "big": ["key", "big.value"]}
    # The last batch has no data (Spark ran it because the watermark moved): every output
    # is empty there, without error.
    assert seen[len(FILES)] == {"totals": [], "big": []}


# -- validation ----------------------------------------------------------------------------------


def test_output_modes(spark: SparkSession) -> None:
    outputs = {k: v for k, v in _branches(spark).items() if k != "events"}
    _, layout = combine(outputs)
    assert check_output_mode(layout, "append") == "append"
    assert check_output_mode(outputs, "update") == "update"
    with pytest.raises(ConfigError, match=r"'complete'.*\['totals', 'dead_letters'\]"):
        check_output_mode(layout, "complete")
    with pytest.raises(ConfigError, match="'upsert'"):
        check_output_mode(layout, "upsert")
    single = OutputLayout(("totals",), {"totals": layout.schemas["totals"]})
    assert check_output_mode(single, "complete") == "complete"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("9lives", "'9lives' is invalid"),
        ("has space", "'has space' is invalid"),
        ("", "'' is invalid"),
        ("x" * 65, "'x{65}' is invalid"),
        (OUTPUT_TAG, f"'{OUTPUT_TAG}' is reserved"),
        (OUTPUT_TAG.upper(), f"'{OUTPUT_TAG.upper()}' is reserved"),
    ],
)
def test_bad_names(spark: SparkSession, name: str, message: str) -> None:
    df = spark.range(1)
    with pytest.raises(ConfigError, match=message):
        combine({"fine": df, name: df})


def test_validation_names_the_bad_output(spark: SparkSession) -> None:
    df = spark.range(1)
    stream = spark.readStream.format("rate").load()
    with pytest.raises(ConfigError, match="empty"):
        combine({})
    with pytest.raises(ConfigError, match="'Totals' and 'totals'"):
        combine({"Totals": df, "totals": df})
    with pytest.raises(ConfigError, match="'rows' is a list, not a pyspark DataFrame"):
        combine({"good": df, "rows": [1, 2]})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=r"\['still'\] are static.*\['live'\] are streaming"):
        combine({"live": stream, "still": df})
    with pytest.raises(ConfigError, match=f"output 'tagged' has a column named '{OUTPUT_TAG}'"):
        combine({"ok": df, "tagged": df.withColumnRenamed("id", OUTPUT_TAG)})
    with pytest.raises(ConfigError, match="output 'dup' has two columns named 'id' and 'ID'"):
        combine({"dup": df.select("id", df["id"].alias("ID"))})

    combined, layout = combine({"a": df, "b": df.selectExpr("'x' AS s")})
    with pytest.raises(ConfigError, match=r"output 'c' is not in the layout.*\['a', 'b'\]"):
        select_output(combined, layout, "c")
    with pytest.raises(ConfigError, match=f"no string column '{OUTPUT_TAG}'"):
        split(df, layout)
    with pytest.raises(ConfigError, match="output 'b': the batch has no column 'b'"):
        split(combined.drop("b"), layout)
    other = OutputLayout(("a", "b"), {"a": layout.schemas["b"], "b": layout.schemas["a"]})
    with pytest.raises(ConfigError, match="output 'a': the batch holds it as struct<id:bigint>"):
        split(combined, other)
    with pytest.raises(ConfigError, match=r"schemas are given for \['a'\].*\['a', 'b'\]"):
        OutputLayout(("a", "b"), {"a": layout.schemas["a"]})


def test_outputs_selected_with_arrow_match_the_dataframe_path(
    spark: SparkSession, tmp_path: Path
) -> None:
    """OutputSet.output_arrow (pyarrow, on the driver: the stable copy's path) gives each
    sink the same columns, types and values as output_rows (Spark's path)."""
    from sparkonce import SQLiteSink
    from sparkonce.ledger.base import BatchContext
    from sparkonce.offsets import BatchRanges
    from sparkonce.outputs.output_set import OutputSet
    from sparkonce.outputs.quality import DEAD_LETTER_SCHEMA

    branches = _branches(spark)
    letters = [("t", 0, 5, "t-0-5", b"k", b"{bad", "MALFORMED", "line 1"), (None,) * 8]
    branches["dead_letters"] = spark.createDataFrame(letters, DEAD_LETTER_SCHEMA)
    branches["again"] = branches["totals"]  # an alias: the same object for two outputs
    combined, layout = combine({k: v for k, v in branches.items() if k != "again"})
    url = f"sqlite:///{tmp_path / 'o.db'}"
    outputs = OutputSet(
        {name: SQLiteSink(url, name) for name in branches}, stable=True, stable_root=tmp_path
    )
    outputs.use_layout(layout, {"again": "totals"})
    assert outputs.uses_driver_copy()
    ctx = BatchContext("p", 1, BatchRanges.from_json('{"t":{"0":[0,5]}}'), 4)
    tables = outputs.collect_tables(combined)  # as the stable copy collects the batch
    assert list(tables) == list(layout.names)
    for name in branches:
        expected = outputs.output_rows(combined, name, ctx, 17).toArrow()
        got = outputs.output_arrow(tables, name, ctx, 17)
        assert got.column_names == expected.column_names, name
        assert got.schema.types == expected.schema.types, name
        assert sorted(map(repr, got.to_pylist())) == sorted(map(repr, expected.to_pylist())), name
        assert got.num_rows == {"events": 3, "totals": 2, "again": 2, "dead_letters": 2}[name]
    # A copy written on the driver, read by a run whose sinks stage in Spark (a Kafka output
    # added since): the combined DataFrame rebuilt from the tables splits into the same rows.
    rebuilt = outputs.combined_from_tables(combined, tables)
    for name in layout.names:
        assert _rows(select_output(rebuilt, layout, name)) == _rows(
            select_output(combined, layout, name)
        ), name
    assert set(
        outputs.output_arrow(tables, "dead_letters", ctx, 17).column("batch_seq").to_pylist()
    ) == {17}
