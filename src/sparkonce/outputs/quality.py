"""Dead letters: parse and validate records without letting one bad record stop the pipeline.

The failure this module exists for. Spark 4 runs SQL with ANSI mode on
(``spark.sql.ansi.enabled=true``). A transform such as ``CAST(value AS BIGINT)`` or
``F.col("value").cast("bigint")`` then raises ``CAST_INVALID_INPUT`` in the task as soon as one
record holds ``'abc'``. The task fails, the micro-batch fails, the streaming query stops, and
every restart reads the same offsets again, meets the same record and stops again: one poison
record blocks the pipeline for good. Turning ANSI mode off is no way out either, since the cast
then quietly turns ``'abc'`` into NULL and the record's content is lost without a trace.

The way that does not fail: parse with functions that cannot throw (``from_json`` in
PERMISSIVE mode, ``try_cast``, ``try_to_number``, ``is_valid_utf8``), compute for every record
an error class (NULL when it is good), and split the batch on it. Records that fail go to a
dead-letter output (another sink) with the reason; the others go on. A record is never blocked
and never dropped: each input record ends up in exactly one of ``good`` and ``bad``::

    parsed = parse_json(source_df, "id BIGINT, name STRING", required=("id",))
    checked = then(parsed, lambda df: mark_bad(df, F.col("data.id") < 0, "NEGATIVE_ID",
                                               "id must not be negative"))
    checked.good   # source columns + a `data` struct, for the main sink
    checked.bad    # DEAD_LETTER_SCHEMA rows, for the dead-letter sink

How the split stays exact: each helper adds ONE derived column (a struct holding the parsed
data, the error class and the message) and ``good``/``bad`` are the two filters
``error_class IS NULL`` / ``error_class IS NOT NULL`` of that same DataFrame. The two
conditions are complements (neither can be NULL) and every expression is deterministic, so
writing ``good`` and ``bad`` in two Spark jobs (as a foreachBatch does) splits the batch the
same way both times. Persist the batch first if you want it parsed only once.

Where code runs: every function here runs on the driver and only builds column expressions;
the parsing itself runs in Spark's executors as native (JVM) expressions. There is no Python
UDF, and the same code works for static and streaming DataFrames.

This module imports ``pyspark.sql.types`` at import time, for :data:`DEAD_LETTER_SCHEMA`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from sparkonce.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "Parsed",
    "mark_bad",
    "parse_delimited",
    "parse_json",
    "then",
    "to_number",
]

DEAD_LETTER_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("record_id", StringType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("error_class", StringType()),
        StructField("error", StringType()),
    ]
)
"""The columns of a dead letter (``Parsed.bad``).

``topic``, ``partition``, ``offset`` and ``record_id`` name the source record; ``key`` and
``value`` are its own bytes, unchanged and never truncated (STRING keys and values of UTF-8
sources are stored as their UTF-8 bytes), so the record can be replayed once fixed;
``error_class`` is a short stable identifier (``INVALID_UTF8``, ``MALFORMED_JSON``, ...) and
``error`` a readable message naming the field and quoting the bad text, cut to about 200
characters. The pipeline name and the batch id are not columns here: the runner adds them
when it commits the dead letters, as it does for every output.
"""

# Error classes of the parse helpers (mark_bad adds the user's own).
NULL_VALUE = "NULL_VALUE"
INVALID_UTF8 = "INVALID_UTF8"
MALFORMED_JSON = "MALFORMED_JSON"
WRONG_TYPE = "WRONG_TYPE"
MISSING_FIELD = "MISSING_FIELD"
BAD_FIELD_COUNT = "BAD_FIELD_COUNT"
CAST_FAILED = "CAST_FAILED"

IDENTITY_COLUMNS = {
    "topic": StringType(),
    "partition": IntegerType(),
    "offset": LongType(),
    "record_id": StringType(),
}
MAX_TEXT = 200  # bad text quoted in a message is cut to this many characters

_WORK = "__sparkonce_quality"  # the one derived column good and bad are filtered on
_CORRUPT = "__sparkonce_corrupt"  # from_json's corrupt-record field
_PARSED = "__sparkonce_parsed"  # parse_json's from_json result, read by the derived column
_JSON_OPTIONS = {
    "mode": "PERMISSIVE",
    "columnNameOfCorruptRecord": _CORRUPT,
    # strict JSON: Spark's reader otherwise takes 'single quotes' and NaN/Infinity tokens
    "allowSingleQuotes": "false",
    "allowNonNumericNumbers": "false",
}
_ERROR_CLASS = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_NUMBER_TYPE = re.compile(
    r"(tinyint|byte|smallint|short|int|integer|bigint|long|float|real|double"
    r"|(decimal|dec|numeric)(\(\s*\d+\s*(,\s*\d+\s*)?\))?)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Parsed:
    """The two halves of one DataFrame: ``good`` goes on, ``bad`` goes to the dead letters.

    ``bad`` has the columns of :data:`DEAD_LETTER_SCHEMA`. Both are filters of the same
    derived DataFrame, so every input row is in exactly one of them.
    """

    good: DataFrame
    bad: DataFrame


# -- argument checks (driver) --------------------------------------------------------------------


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _col(name: str) -> Column:
    from pyspark.sql import functions as F

    return F.col(_quoted(name))


def _check_source(df: DataFrame, what: str) -> None:
    """Refuse a DataFrame whose dead letters could not name their source record."""
    types = {f.name: f.dataType for f in df.schema.fields}
    missing = [name for name in IDENTITY_COLUMNS if name not in types]
    if missing:
        raise ConfigError(
            f"{what}: the DataFrame has no column {', '.join(map(repr, missing))} (it has "
            f"{df.columns}); dead letters name their source record by topic, partition, offset "
            "and record_id, so keep these source columns through your transforms"
        )
    for name, expected in IDENTITY_COLUMNS.items():
        if types[name] != expected:
            raise ConfigError(
                f"{what}: column {name!r} is {types[name].simpleString()}, expected "
                f"{expected.simpleString()} as in a sparkonce source"
            )
    for name in ("key", "value"):
        if name in types and not isinstance(types[name], BinaryType | StringType):
            raise ConfigError(
                f"{what}: column {name!r} is {types[name].simpleString()}; a source's key and "
                "value are binary or string"
            )


def _check_text_column(df: DataFrame, column: str, into: str, what: str) -> None:
    if column not in df.columns:
        raise ConfigError(f"{what}: no column {column!r} to parse; the DataFrame has {df.columns}")
    kind = df.schema[column].dataType
    if not isinstance(kind, BinaryType | StringType):
        raise ConfigError(
            f"{what}: column {column!r} is {kind.simpleString()}; only binary or string "
            "columns can be parsed"
        )
    if not into:
        raise ConfigError(f"{what}: into must name the new column, got {into!r}")
    if into in df.columns:
        raise ConfigError(
            f"{what}: the DataFrame already has a column {into!r}; pass another name as into="
        )


def _struct_schema(schema: StructType | str) -> StructType:
    if isinstance(schema, str):
        try:
            parsed = StructType.fromDDL(schema)
        except Exception as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise ConfigError(f"parse_json: bad schema {schema!r}: {first_line}") from exc
        schema = parsed  # type: ignore[assignment]
    if not isinstance(schema, StructType) or not schema.fields:
        raise ConfigError(
            f"parse_json: schema must be a non-empty struct (a StructType or a DDL string such "
            f"as 'id BIGINT, name STRING'), got {schema!r}"
        )
    names = [f.name for f in schema.fields]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"parse_json: schema names {duplicates} more than once")
    if _CORRUPT in names:
        raise ConfigError(f"parse_json: the field name {_CORRUPT!r} is reserved")
    return schema


# -- column building blocks (built on the driver, evaluated in the executors) ----------------------


def _clip(text: Column) -> Column:
    """``text`` quoted, cut to :data:`MAX_TEXT` characters (with '...' when cut)."""
    from pyspark.sql import functions as F

    cut = F.when(
        F.length(text) > MAX_TEXT, F.concat(F.substring(text, 1, MAX_TEXT), F.lit("..."))
    ).otherwise(text)
    return F.concat(F.lit("'"), cut, F.lit("'"))


def _text(df: DataFrame, column: str) -> tuple[Column, Column, Column]:
    """(raw column, is valid UTF-8, the column as a string)."""
    from pyspark.sql import functions as F

    raw = _col(column)
    valid = F.is_valid_utf8(
        raw.cast("string") if isinstance(df.schema[column].dataType, BinaryType) else raw
    )
    return raw, valid, raw.cast("string")


def _utf8_message(raw: Column, column: str) -> Column:
    from pyspark.sql import functions as F

    head = F.hex(F.substring(raw.cast("binary"), 1, MAX_TEXT // 2))
    return F.concat(F.lit(f"{column} is not valid UTF-8 (first bytes, hex: "), head, F.lit(")"))


def _split(
    df: DataFrame,
    data: Column | None,
    error_class: Column,
    error: Column,
    into: str | None,
    staged: DataFrame | None = None,
) -> Parsed:
    """Add the one derived column and cut ``df`` into good and bad on its error class.

    ``staged`` is ``df`` plus a temporary column the expressions read (the parse result, so
    that Spark parses each value once instead of once per reference); it is not kept.
    """
    from pyspark.sql import functions as F

    fields = [error_class.alias("error_class"), error.alias("error")]
    if data is not None:
        fields.append(data.alias("data"))
    derived = (df if staged is None else staged).withColumn(_WORK, F.struct(*fields))
    failed = F.col(f"{_WORK}.error_class")
    kept = [_col(name) for name in df.columns]
    if data is not None and into is not None:
        kept.append(F.col(f"{_WORK}.data").alias(into))
    good = derived.filter(failed.isNull()).select(*kept)
    bad = derived.filter(failed.isNotNull()).select(*_dead_letter_columns(df))
    return Parsed(good=good, bad=bad)


def _dead_letter_columns(df: DataFrame) -> list[Column]:
    from pyspark.sql import functions as F

    columns = []
    for field in DEAD_LETTER_SCHEMA.fields:
        if field.name in ("error_class", "error"):
            column = F.col(f"{_WORK}.{field.name}")
        elif field.name in df.columns:
            column = _col(field.name)
        else:  # key or value: a transform dropped it (identity columns are checked)
            column = F.lit(None)
        columns.append(column.cast(field.dataType).alias(field.name))
    return columns


def _first(cases: Sequence[tuple[Column, Column]], otherwise: Column | None = None) -> Column:
    """CASE WHEN c1 THEN v1 WHEN c2 THEN v2 ... (evaluated lazily, first match wins)."""
    from pyspark.sql import functions as F

    result = None
    for condition, value in cases:
        result = F.when(condition, value) if result is None else result.when(condition, value)
    assert result is not None
    return result if otherwise is None else result.otherwise(otherwise)


# -- public helpers -------------------------------------------------------------------------------


def parse_json(
    df: DataFrame,
    schema: StructType | str,
    *,
    column: str = "value",
    into: str = "data",
    required: Sequence[str] = (),
) -> Parsed:
    """Parse ``column`` (binary or string) as one JSON object per record into struct ``into``.

    ``good`` has ``df``'s columns plus ``into`` (``schema``'s fields; a field absent from the
    JSON or JSON ``null`` is NULL). ``bad`` gets, with the first reason that applies:

    - ``NULL_VALUE``: the column is NULL (a Kafka tombstone, say);
    - ``INVALID_UTF8``: its bytes are not valid UTF-8;
    - ``MALFORMED_JSON``: not a JSON object (empty, truncated, syntax error, an array or a
      scalar, text after the closing brace);
    - ``WRONG_TYPE``: valid JSON, but a field does not fit its type (``"abc"`` or ``1.5`` for a
      BIGINT, a number out of range, an object where an array is expected, at any depth); the
      message names the first such top-level field and quotes its text;
    - ``MISSING_FIELD``: a field named in ``required`` (top-level) is absent or null.

    Type rules are Spark's JSON reader's: integer types take JSON integers in range only,
    floating types take any JSON number, BOOLEAN takes true/false, STRING takes any JSON value
    (a non-string is kept as its JSON text). Strict JSON: no single quotes, no NaN tokens.
    Spark's JSON reader has limits that make a whole value ``MALFORMED_JSON``, even when the
    part over the limit is in a field the schema does not name: nesting deeper than 1000
    levels, a number of more than 1000 digits (so a giant integer for a BIGINT is
    ``MALFORMED_JSON``, a shorter out-of-range one ``WRONG_TYPE``), and a field name longer
    than 50,000 characters. A repeated key: every occurrence must fit its type, and the last
    one is the value.
    Known gap: Spark's reader stops after the first complete object, and this helper only
    checks that the value ends with ``}``; so ``{"a":1} {"b":2}`` is read as ``{"a":1}``.

    Runs on the driver (builds expressions); the parse runs in the executors and never raises
    on bad data, with ANSI mode on or off.
    """
    from pyspark.sql import functions as F

    what = "parse_json"
    struct = _struct_schema(schema)
    _check_text_column(df, column, into, what)
    _check_source(df, what)
    names = [f.name for f in struct.fields]
    if isinstance(required, str):
        required = (required,)
    unknown = [name for name in required if name not in names]
    if unknown:
        raise ConfigError(
            f"{what}: required names {unknown}, which are not top-level fields of the schema "
            f"({names})"
        )

    raw, valid, text = _text(df, column)
    with_corrupt = StructType([*struct.fields, StructField(_CORRUPT, StringType())])
    staged = df.withColumn(_PARSED, F.when(valid, F.from_json(text, with_corrupt, _JSON_OPTIONS)))
    parsed = F.col(_PARSED)
    ends_as_object = text.rlike(r"\}[ \t\n\r]*\z")
    fits = parsed.isNotNull() & parsed.getField(_CORRUPT).isNull() & ends_as_object

    # Only evaluated for records that do not fit (CASE branches are lazy): is the JSON itself
    # well formed, and which field does not fit its type.
    syntax_only = StructType([StructField(_CORRUPT, StringType())])
    well_formed = F.from_json(text, syntax_only, _JSON_OPTIONS).getField(_CORRUPT).isNull()
    well_formed = parsed.isNotNull() & ends_as_object & well_formed
    blank = text.rlike(r"^[ \t\n\r]*\z")
    malformed = F.when(blank, F.lit(f"{column} is empty")).otherwise(
        F.concat(F.lit(f"{column} is not a JSON object: "), _clip(text))
    )
    field_errors = []
    for field in struct.fields:
        alone = StructType([field, StructField(_CORRUPT, StringType())])
        as_text = StructType([StructField(field.name, StringType())])
        field_text = F.from_json(text, as_text, _JSON_OPTIONS).getField(field.name)
        field_errors.append(
            (
                F.from_json(text, alone, _JSON_OPTIONS).getField(_CORRUPT).isNotNull(),
                F.concat(
                    F.lit(f"field {field.name!r} is not a valid {field.dataType.simpleString()}: "),
                    # A repeated key whose last occurrence is null reads as NULL here.
                    _clip(F.coalesce(field_text, F.lit("null"))),
                ),
            )
        )
    wrong_type = _first(
        field_errors, F.concat(F.lit("value does not fit the schema: "), _clip(text))
    )

    cases: list[tuple[Column, Column, Column]] = [
        (raw.isNull(), F.lit(NULL_VALUE), F.lit(f"{column} is null")),
        (~valid, F.lit(INVALID_UTF8), _utf8_message(raw, column)),
        (~fits & ~well_formed, F.lit(MALFORMED_JSON), malformed),
        (~fits, F.lit(WRONG_TYPE), wrong_type),
    ]
    for name in required:
        cases.append(
            (
                parsed.getField(name).isNull(),
                F.lit(MISSING_FIELD),
                F.lit(f"required field {name!r} is missing or null"),
            )
        )
    error_class = _first([(c, k) for c, k, _ in cases])
    error = _first([(c, m) for c, _, m in cases])
    return _split(df, parsed.dropFields(_CORRUPT), error_class, error, into, staged)


def parse_delimited(
    df: DataFrame,
    fields: Sequence[tuple[str, str]],
    *,
    sep: str = ",",
    column: str = "value",
    into: str = "data",
) -> Parsed:
    """Split ``column`` on ``sep`` (a literal string) into typed fields of struct ``into``.

    ``fields`` is ``[(name, type), ...]`` with Spark SQL type names (``"bigint"``,
    ``"decimal(10,2)"``, ``"date"``, ``"string"``...); each part is converted with ``try_cast``
    (numbers may have surrounding spaces; strings are kept as they are). A part that is empty
    or all spaces is NULL for a non-string field (and kept as is for a string). No quoting: a
    field cannot hold ``sep``. ``bad`` gets ``NULL_VALUE``, ``INVALID_UTF8``,
    ``BAD_FIELD_COUNT`` (not exactly ``len(fields)`` parts) or ``CAST_FAILED`` (the message
    names the first field that failed and quotes its text).

    Runs on the driver (builds expressions); the executors never raise on bad data.
    """
    from pyspark.sql import functions as F

    what = "parse_delimited"
    if not isinstance(sep, str) or not sep:
        raise ConfigError(f"{what}: sep must be a non-empty string, got {sep!r}")
    fields = list(fields)
    if not fields:
        raise ConfigError(f"{what}: fields must name at least one (name, type) pair")
    types: list[DataType] = []
    for entry in fields:
        if not (
            isinstance(entry, tuple) and len(entry) == 2 and all(isinstance(e, str) for e in entry)
        ):
            raise ConfigError(
                f"{what}: each field is a (name, type) pair of strings, got {entry!r}"
            )
        name, type_name = entry
        try:
            kind = DataType.fromDDL(type_name)
        except Exception as exc:
            raise ConfigError(f"{what}: field {name!r} has unknown type {type_name!r}") from exc
        if isinstance(kind, ArrayType | MapType | StructType | BinaryType):
            raise ConfigError(
                f"{what}: field {name!r} has type {type_name!r}; only scalar types can be "
                "cast from text"
            )
        types.append(kind)
    names = [name for name, _ in fields]
    if len(set(names)) != len(names) or not all(names):
        raise ConfigError(f"{what}: field names must be non-empty and distinct, got {names}")
    _check_text_column(df, column, into, what)
    _check_source(df, what)

    raw, valid, text = _text(df, column)
    parts = F.split(text, F.lit(_literal_regex(sep)), -1)
    count = F.size(parts)
    values, failures = [], []
    for i, ((name, _), kind) in enumerate(zip(fields, types, strict=True)):
        part = F.try_element_at(parts, F.lit(i + 1))
        if isinstance(kind, StringType):
            value = part
        else:
            value = F.when(F.trim(part) != "", part.try_cast(kind))
            failures.append(
                (
                    (F.trim(part) != "") & value.isNull(),
                    F.concat(
                        F.lit(f"field {name!r} is not a valid {kind.simpleString()}: "), _clip(part)
                    ),
                )
            )
        values.append(value.alias(name))
    cases: list[tuple[Column, Column, Column]] = [
        (raw.isNull(), F.lit(NULL_VALUE), F.lit(f"{column} is null")),
        (~valid, F.lit(INVALID_UTF8), _utf8_message(raw, column)),
        (
            count != len(fields),
            F.lit(BAD_FIELD_COUNT),
            F.concat(
                F.lit(f"expected {len(fields)} fields separated by {sep!r}, got "),
                count.cast("string"),
                F.lit(": "),
                _clip(text),
            ),
        ),
    ]
    for failed, message in failures:
        cases.append((failed, F.lit(CAST_FAILED), message))
    error_class = _first([(c, k) for c, k, _ in cases])
    error = _first([(c, m) for c, _, m in cases])
    return _split(df, F.struct(*values), error_class, error, into)


def _literal_regex(sep: str) -> str:
    """A Java regex matching ``sep`` literally (split() takes a regex)."""
    return "".join(c if c.isalnum() else "\\" + c if c.isascii() else c for c in sep)


def to_number(col: Column | str, type: str, *, format: str | None = None) -> Column:
    """``col`` as number type ``type`` (``"int"``, ``"bigint"``, ``"double"``,
    ``"decimal(10,2)"``...), or NULL when it is not one: never raises, ANSI mode or not.

    Without ``format`` this is ``try_cast`` (surrounding spaces are allowed; ``'1,234'`` is
    NULL). With ``format`` (a Spark number format such as ``"9,999.99"`` or ``"$999"``) the
    text goes through ``try_to_number`` first, then ``try_cast`` to ``type`` (a value out of
    its range is NULL). NULL in gives NULL out, so tell "absent" from "bad" with
    ``col.isNotNull() & to_number(col, ...).isNull()``. Runs on the driver (an expression).
    """
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import functions as F

    if not isinstance(type, str) or not _NUMBER_TYPE.fullmatch(type.strip()):
        raise ConfigError(
            f"to_number: {type!r} is not a number type; use tinyint, smallint, int, bigint, "
            "float, double or decimal(p,s)"
        )
    if isinstance(col, str):
        column = _col(col)
    elif isinstance(col, SparkColumn):
        column = col
    else:
        raise ConfigError(f"to_number: col must be a Column or a column name, got {col!r}")
    if format is not None:
        if not isinstance(format, str) or not format:
            raise ConfigError(f"to_number: format must be a non-empty string, got {format!r}")
        column = F.try_to_number(column.cast("string"), F.lit(format))
    return column.try_cast(type.strip())


def mark_bad(df: DataFrame, condition: Column, error_class: str, message: Column | str) -> Parsed:
    """Your own validation: rows where ``condition`` is true go to ``bad``, the rest to ``good``.

    A NULL condition counts as false (the row is good). ``error_class`` is a short stable
    identifier (letters, digits, ``_.-``; say ``"NEGATIVE_AMOUNT"``); ``message`` is a string
    or a string Column (such as ``F.concat(F.lit("amount "), F.col("data.amount"))``; a NULL
    message falls back to ``error_class``). ``good`` has exactly ``df``'s columns.

    The condition runs in the executors: build it from functions that cannot raise
    (:func:`to_number`, ``try_*``), or ANSI mode stops the query on the first bad row.
    """
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import functions as F

    what = "mark_bad"
    if not isinstance(error_class, str) or not _ERROR_CLASS.fullmatch(error_class):
        raise ConfigError(
            f"{what}: error_class must be a short identifier (a letter, then up to 63 "
            f"letters, digits or _.-), got {error_class!r}"
        )
    if not isinstance(condition, SparkColumn):
        raise ConfigError(f"{what}: condition must be a Column, got {condition!r}")
    if isinstance(message, str):
        text = F.lit(message)
    elif isinstance(message, SparkColumn):
        text = F.coalesce(message.cast("string"), F.lit(error_class))
    else:
        raise ConfigError(f"{what}: message must be a string or a Column, got {message!r}")
    _check_source(df, what)
    failed = F.coalesce(condition, F.lit(False))
    return _split(df, None, F.when(failed, F.lit(error_class)), F.when(failed, text), into=None)


def then(parsed: Parsed, check: Callable[[DataFrame], Parsed]) -> Parsed:
    """Run ``check`` on ``parsed.good`` and add its bad rows to ``parsed.bad``.

    A record that failed an earlier step never reaches ``check``, so it is bad once, with the
    first reason it failed for. Chain as ``then(then(parse_json(df, s), check1), check2)``.
    Runs on the driver.
    """
    if not isinstance(parsed, Parsed):
        raise ConfigError(f"then: expected a Parsed, got {type(parsed).__name__}")
    result = check(parsed.good)
    if not isinstance(result, Parsed):
        raise ConfigError(
            f"then: the check {check!r} returned {type(result).__name__}, not a Parsed; "
            "build it with mark_bad, parse_json or parse_delimited"
        )
    return Parsed(good=result.good, bad=parsed.bad.unionByName(result.bad))
