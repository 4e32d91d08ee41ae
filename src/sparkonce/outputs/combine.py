"""Several named outputs carried by ONE Spark streaming query.

A transform may return ``{name: DataFrame}``: several outputs ("totals",
"dead_letters", "audit", ...) derived from the same source stream, each bound for its
own sink. :func:`combine` folds them into one DataFrame so that a single query (one
checkpoint) produces them all; inside ``foreachBatch``, :func:`split` (or
:func:`select_output`) takes each output back out of the batch.

Why one query
    Every output of a batch then shares one micro-batch id and one set of source
    offset ranges, so one ledger entry can describe the whole batch for every output.
    Separate queries would each have their own checkpoint, batch ids and offsets, and
    a crash between them would leave outputs that no single ledger entry can describe.

The layout (:class:`OutputLayout`)
    The combined DataFrame has one string column :data:`OUTPUT_TAG` naming the output
    a row belongs to, then one struct column per output, named after the output, in
    the mapping's order::

        _sparkonce_output | totals: struct<...> | dead_letters: struct<...> | ...

    A row of output ``n`` has ``_sparkonce_output = "n"``, its columns inside the
    struct ``n``, and NULL in every other output's struct. Branches may differ in
    schema. The branches are unioned by name, so each output only costs a struct
    column of NULLs in the other branches' rows.

    :func:`split` filters on the tag and flattens the output's struct back to top-level
    columns with their original names (spaces, dots and backticks included) and types
    (atomic, decimal, timestamp, binary, arrays, maps, nested structs). Top-level
    nullability is not kept: every column comes back ``nullable=True``, because the
    output's struct is NULL in the other outputs' rows (nullability inside arrays, maps
    and nested structs is kept). Values, nulls included, are exactly the branch's.

Output modes (checked on Spark 4.2, one watermarked ``groupBy(window, key)`` branch
plus stateless branches; :func:`check_output_mode` refuses the unusable ones before
the query starts)
    ``update``
        Works. The aggregating output gives the groups changed in the batch; the
        stateless ones give the batch's new rows. Several aggregating branches work too,
        and so does an aggregation without a watermark (its state then never shrinks).
    ``append``
        Works when every aggregating branch has a watermark: an aggregate row comes out
        once, in the batch where the watermark passes the end of its window (possibly a
        no-data batch); the stateless outputs give the batch's new rows. An aggregation
        without a watermark makes Spark refuse the query at start.
    ``complete``
        Unusable with several outputs. When no branch aggregates, Spark refuses the
        query at start (``STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION``). When one does,
        Spark *accepts* it: the aggregating output then repeats its whole result table
        every batch while the stateless outputs still give only the batch's new rows, so
        a sink that replaces its table each batch would lose the stateless outputs'
        earlier rows. (When every branch aggregates, each one repeats its whole table,
        which is consistent, but a layout cannot tell which branches aggregate.)
        :func:`check_output_mode` therefore refuses ``complete`` for more than one
        output (use ``update`` with an upserting sink, or a separate query).

Where code runs: everything here runs on the driver and only builds query plans; the
filtering and flattening run on the executors as part of the plan.

:func:`split` is lazy and returns one DataFrame per output: writing each one evaluates
the batch again. In ``foreachBatch``, persist the batch first when writing several
outputs (and unpersist it afterwards), so the source is read and the state updated once.

Static DataFrames work too, so a transform returning several outputs can be unit-tested
without streaming: ``combined, layout = combine(outputs)`` then ``split(combined,
layout)`` gives back each output.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkonce.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

OUTPUT_TAG = "_sparkonce_output"
"""Name of the string column that says which output a combined row belongs to."""

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_MODES = ("append", "update", "complete")


def check_output_name(name: object) -> str:
    """``name`` if it can name an output, else :class:`ConfigError`.

    An output name is 1-64 ASCII letters, digits and ``_``, not starting with a digit,
    and is not :data:`OUTPUT_TAG` (compared ignoring case, as Spark resolves columns).
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigError(
            f"output name {name!r} is invalid: use 1-64 letters, digits and '_', "
            "not starting with a digit"
        )
    if name.casefold() == OUTPUT_TAG.casefold():
        raise ConfigError(
            f"output name {name!r} is reserved: sparkonce uses {OUTPUT_TAG!r} as the column "
            "that tags each combined row with its output; pick another name"
        )
    return name


def _check_names(names: tuple[str, ...]) -> None:
    if not names:
        raise ConfigError("outputs are empty: give at least one {name: DataFrame} entry to combine")
    seen: dict[str, str] = {}
    for name in names:
        check_output_name(name)
        other = seen.setdefault(name.casefold(), name)
        if other != name:
            raise ConfigError(
                f"output names {other!r} and {name!r} differ only in case; Spark resolves "
                "column names ignoring case, so rename one of them"
            )


@dataclass(frozen=True)
class OutputLayout:
    """Which outputs a combined DataFrame holds, in order, and each output's schema.

    ``schemas[name]`` is the branch's own schema (as given to :func:`combine`); the
    combined DataFrame has :data:`OUTPUT_TAG` then one struct column per name, of that
    type. A layout is plain data (names and ``StructType`` values), built on the driver.
    """

    names: tuple[str, ...]
    schemas: dict[str, StructType] = field(hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(self.names))
        _check_names(self.names)
        if set(self.schemas) != set(self.names):
            raise ConfigError(
                f"output layout: schemas are given for {sorted(self.schemas)} but the "
                f"names are {list(self.names)}; give exactly one schema per name"
            )
        object.__setattr__(self, "schemas", {name: self.schemas[name] for name in self.names})

    @property
    def combined_schema(self) -> StructType:
        """The schema of the combined DataFrame: the tag (non-null), then each output's
        struct (nullable, holding the branch's schema as given). For example to read a
        Parquet copy of combined batches back with ``spark.read.schema(...)``."""
        from pyspark.sql.types import StringType, StructField, StructType

        fields = [StructField(OUTPUT_TAG, StringType(), False)]
        fields += [StructField(name, self.schemas[name], True) for name in self.names]
        return StructType(fields)


def combine(outputs: Mapping[str, DataFrame]) -> tuple[DataFrame, OutputLayout]:
    """One DataFrame holding every output of ``outputs``, and its layout (driver).

    ``outputs`` maps each output name to a DataFrame; all streaming (derived from the
    same source stream, to run as one query) or all static. Names keep the mapping's
    order. Raises :class:`ConfigError`, naming the bad output, for an empty mapping, a
    bad name (see :func:`check_output_name`), names differing only in case, a value
    that is not a DataFrame, a mix of streaming and static DataFrames, or a branch with
    no column, duplicate column names (ignoring case) or a column named
    :data:`OUTPUT_TAG`.
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    if not isinstance(outputs, Mapping):
        raise ConfigError(
            f"outputs must be a mapping {{name: DataFrame}}, got {type(outputs).__name__}"
        )
    names = tuple(outputs)
    _check_names(names)
    for name in names:
        value = outputs[name]
        if not isinstance(value, DataFrame):
            raise ConfigError(
                f"output {name!r} is a {type(value).__name__}, not a pyspark DataFrame; "
                "return a DataFrame for every output"
            )
    streaming = [name for name in names if outputs[name].isStreaming]
    if streaming and len(streaming) != len(names):
        static = [name for name in names if name not in streaming]
        raise ConfigError(
            f"outputs {static} are static DataFrames but {streaming} are streaming; "
            "derive every output from the same source stream (or make them all static)"
        )
    for name in names:
        _check_branch_columns(name, outputs[name].columns)

    layout = OutputLayout(names, {name: outputs[name].schema for name in names})
    combined: DataFrame | None = None
    for name in names:
        branch = outputs[name]
        columns = [F.lit(name).alias(OUTPUT_TAG)]
        for other in names:
            if other == name:
                inner = [branch[_quote(c)].alias(c) for c in branch.columns]
                columns.append(F.struct(*inner).alias(other))
            else:
                columns.append(F.lit(None).cast(layout.schemas[other]).alias(other))
        tagged = branch.select(*columns)
        combined = tagged if combined is None else combined.unionByName(tagged)
    assert combined is not None  # names is not empty
    return combined, layout


def _check_branch_columns(name: str, columns: list[str]) -> None:
    if not columns:
        raise ConfigError(f"output {name!r} has no column; select at least one column")
    seen: dict[str, str] = {}
    for column in columns:
        if column.casefold() == OUTPUT_TAG.casefold():
            raise ConfigError(
                f"output {name!r} has a column named {column!r}, which sparkonce reserves "
                f"for tagging combined rows ({OUTPUT_TAG!r}); rename or drop it"
            )
        other = seen.get(column.casefold())
        seen[column.casefold()] = column
        if other is not None:
            raise ConfigError(
                f"output {name!r} has two columns named {other!r} and {column!r} "
                "(ignoring case); rename one so each column can be taken back out"
            )


def split(batch: DataFrame, layout: OutputLayout) -> dict[str, DataFrame]:
    """Each output of a combined ``batch``, in layout order (driver; lazy).

    ``batch`` is a static DataFrame with the combined schema: the DataFrame given to
    ``foreachBatch``, or a stored copy read back. Each value is
    :func:`select_output` of that name; an output with no row in the batch gives an
    empty DataFrame of the output's schema.
    """
    _check_batch(batch, layout)
    return {name: _select(batch, layout, name) for name in layout.names}


def select_output(batch: DataFrame, layout: OutputLayout, name: str) -> DataFrame:
    """The rows of output ``name`` in a combined ``batch``, as the branch's own columns.

    Rows whose :data:`OUTPUT_TAG` is ``name``, with the output's struct flattened back to
    top-level columns: original names, order and types; top-level columns become
    nullable (the output's struct is NULL in other outputs' rows).
    Raises :class:`ConfigError` if ``name`` is not in the layout or ``batch`` lacks the
    tag or the output's column, or holds it with another type.
    """
    if name not in layout.schemas:
        raise ConfigError(
            f"output {name!r} is not in the layout; its outputs are {list(layout.names)}"
        )
    _check_batch(batch, layout, only=name)
    return _select(batch, layout, name)


def check_output_mode(layout_or_outputs: OutputLayout | Mapping[str, DataFrame], mode: str) -> str:
    """``mode`` if Spark's output mode ``mode`` suits these outputs, else :class:`ConfigError`.

    Call it on the driver before starting the query. ``append`` and ``update`` pass (Spark
    itself still refuses ``append`` for an aggregation without a watermark).
    ``complete`` passes for a single output only: see the module docstring for what
    Spark does with it when there are several.
    """
    if mode not in _MODES:
        raise ConfigError(f"output mode {mode!r} is not one of {list(_MODES)}")
    if isinstance(layout_or_outputs, OutputLayout):
        names = list(layout_or_outputs.names)
    elif isinstance(layout_or_outputs, Mapping):
        names = list(layout_or_outputs)
    else:
        raise ConfigError(
            "check_output_mode takes an OutputLayout or a {name: DataFrame} mapping, got "
            f"{type(layout_or_outputs).__name__}"
        )
    if mode == "complete" and len(names) > 1:
        raise ConfigError(
            f"output mode 'complete' cannot serve several outputs {names} in one query: "
            "Spark refuses it when no output aggregates, and otherwise repeats each "
            "aggregated output's whole table every batch while the other outputs carry "
            "only the batch's new rows. Use output mode 'update' (with sinks that upsert "
            "by key) or run the complete-mode output as a query of its own"
        )
    return mode


def _select(batch: DataFrame, layout: OutputLayout, name: str) -> DataFrame:
    from pyspark.sql import functions as F

    struct = F.col(_quote(name))
    columns: list[Column] = [
        struct.getField(f.name).alias(f.name) for f in layout.schemas[name].fields
    ]
    return batch.where(F.col(OUTPUT_TAG) == F.lit(name)).select(*columns)


def _check_batch(batch: DataFrame, layout: OutputLayout, only: str | None = None) -> None:
    from pyspark.sql.types import StringType

    fields = {f.name: f.dataType for f in batch.schema.fields}
    tag = fields.get(OUTPUT_TAG)
    if not isinstance(tag, StringType):
        raise ConfigError(
            f"the batch has no string column {OUTPUT_TAG!r} (its columns: "
            f"{list(fields)}); split only DataFrames built by combine(), or a copy of them"
        )
    for name in layout.names if only is None else (only,):
        found = fields.get(name)
        if found is None:
            raise ConfigError(
                f"output {name!r}: the batch has no column {name!r} (its columns: "
                f"{list(fields)}); was it combined with another layout?"
            )
        if nullable_type(found) != nullable_type(layout.schemas[name]):
            raise ConfigError(
                f"output {name!r}: the batch holds it as {found.simpleString()} but the "
                f"layout expects {layout.schemas[name].simpleString()}; split it with the "
                "layout it was combined with"
            )


def nullable_type(dtype: DataType) -> DataType:
    """``dtype`` with every nullability flag set and field metadata dropped, to compare
    types the way a union or a Parquet copy may change them."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(dtype, StructType):
        return StructType(
            [StructField(f.name, nullable_type(f.dataType), True) for f in dtype.fields]
        )
    if isinstance(dtype, ArrayType):
        return ArrayType(nullable_type(dtype.elementType), True)
    if isinstance(dtype, MapType):
        return MapType(nullable_type(dtype.keyType), nullable_type(dtype.valueType), True)
    return dtype


def _quote(column: str) -> str:
    """``column`` as a quoted identifier, so dots, spaces and backticks stay in the name."""
    return "`" + column.replace("`", "``") + "`"
