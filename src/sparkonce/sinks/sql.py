"""Transactional SQL sinks: SQLite (the embedded default) and PostgreSQL.

Guarantee: **effectively-once**. Each micro-batch's rows, the epoch check and
the ledger row commit in one transaction of the database, so a batch's rows
are visible exactly once whatever crashes, retries or zombie runs occur. Work
may run more than once; only one run's effects become visible. Because only one
attempt of a batch can ever commit, this holds for non-deterministic transforms
too, as long as this is the pipeline's only sink.

Where each hook runs: everything here runs on the **driver**. The batch's rows
are collected to the driver (``DataFrame.toArrow()``) and written from there,
which bounds a batch by driver memory; keep batches bounded with the source's
read limits.

Replay: a batch whose offsets the ledger already covers is skipped (step 2).
Fencing: a run whose epoch is no longer the owner's gets
:class:`~sparkonce.errors.FencedError` at step 1 and its batch is rolled back.

Spark's output modes (``Pipeline(output_mode=...)``, passed to :meth:`SqlSink.validate`):

* ``"append"`` and ``"update"``: each batch's rows are inserted (sink ``mode="append"``)
  or upserted by key (``mode="upsert"``). With ``"update"`` and an append sink, each
  batch appends the groups that changed, so a group appears once per batch that changed it.
* ``"complete"``: each batch holds the whole result, so its commit replaces the table's
  whole content: ``DELETE FROM <table>`` and the batch's rows, in the same transaction as
  the epoch check and the ledger row (readers never see an empty or a half-written table).

Upsert and repeated keys: an upsert batch may hold one row per key. With
``latest_by=[...]`` (output columns, typically the source's ``partition`` and ``offset``)
the rows of a repeated key are reduced to the one with the greatest ``latest_by`` tuple
(NULL is lowest); two rows of one key with equal ``latest_by`` values are refused, with the
key named. Without ``latest_by`` a repeated key is refused, and nothing of the batch commits.

Schema check: :meth:`SqlSink.validate` runs before the run takes its epoch. It refuses
output columns the table lacks, and an output column whose Spark type does not fit the
column's declared type (what the sink would create for it, see
:meth:`sparkonce.db.Dialect.column_type`, or a wider integer). SQLite would otherwise store
a string in an ``INTEGER`` column without an error.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Hashable
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar

from sparkonce.commit import Staged, Stager
from sparkonce.config import (
    Guarantee,
    OutputMode,
    StoreURL,
    WriteMode,
    check_identifier,
    check_write_mode,
)
from sparkonce.db import (
    Dialect,
    dialect_for,
    fetchall,
    qi,
    qlist,
)
from sparkonce.errors import ConfigError, SinkError
from sparkonce.ledger.base import BatchContext, CommitResult
from sparkonce.ledger.sql import SqlLedgerStore
from sparkonce.sinks.base import TransactionalSink

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType

log = logging.getLogger(__name__)


# -- upsert: repeated keys ---------------------------------------------------------------


def _check_latest_by(
    latest_by: tuple[str, ...] | list[str], mode: WriteMode, keys: tuple[str, ...]
) -> tuple[str, ...]:
    """Validate the ``latest_by`` option of an upsert sink (see the module docstring)."""
    if isinstance(latest_by, str) or not isinstance(latest_by, (tuple, list)):
        raise ConfigError(
            f"latest_by must be a list of column names, e.g. latest_by=['partition', 'offset'], "
            f"got {latest_by!r}"
        )
    names = tuple(check_identifier(c, "latest_by column") for c in latest_by)
    if names and mode != "upsert":
        raise ConfigError(
            "latest_by=[...] only applies to mode='upsert' (it picks which row of a key "
            "repeated in a batch wins); remove latest_by or use mode='upsert' with keys=[...]"
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"latest_by {list(names)} names a column twice")
    both = [c for c in names if c in keys]
    if both:
        raise ConfigError(
            f"latest_by column(s) {both} are also keys; rows of one key have the same value "
            "there, so it cannot tell them apart. Use other columns, such as the source's "
            "'partition' and 'offset'"
        )
    return names


def repeated_key_message(table: str, keys: tuple[str, ...], key: tuple[Any, ...], n: int) -> str:
    """Why an upsert batch with a repeated key (and no ``latest_by``) is refused."""
    named = dict(zip(keys, key, strict=True))
    return (
        f"upsert into {table!r}: the batch holds {n} rows for key {named}, so which one wins "
        "would depend on row order. Aggregate or deduplicate by the key in the transform, or "
        "set latest_by=[...] on the sink to the output columns whose greatest value marks the "
        "row that wins (for a change stream, the source's 'partition' and 'offset'). Nothing "
        "of this batch was committed."
    )


def latest_by_tie_message(
    table: str,
    keys: tuple[str, ...],
    key: tuple[Any, ...],
    latest_by: tuple[str, ...],
    values: dict[str, Any],
) -> str:
    """Why an upsert batch whose repeated key ties on ``latest_by`` is refused."""
    named = dict(zip(keys, key, strict=True))
    return (
        f"upsert into {table!r}: the batch holds several rows for key {named} with the same "
        f"latest_by values {values}, so which one wins would depend on row order. Add a "
        f"column that tells them apart to latest_by={list(latest_by)} (such as the source's "
        "'offset' beside its 'partition'), or deduplicate by the key in the transform. "
        "Nothing of this batch was committed."
    )


def _orderable(dtype: DataType | None, value: Any) -> tuple[Any, ...]:
    """A sort key for one ``latest_by`` value: NULL lowest; SQLite's text forms parsed back.

    The SQLite sink turns decimals, dates and timestamps into text before writing; they
    are compared as what they stand for, not as strings.
    """
    from pyspark.sql import types as T

    if value is None:
        return (0,)
    if isinstance(value, str):
        if isinstance(dtype, T.DecimalType):
            return (1, Decimal(value))
        if isinstance(dtype, T.DateType):
            return (1, date.fromisoformat(value))
        if isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
            return (1, datetime.fromisoformat(value))
    return (1, value)


# -- output types against declared column types -------------------------------------------

_PARAMS = re.compile(r"\([^)]*\)")


def _base_type(declared: str) -> str:
    """A declared type without its parameters, upper case: ``VARCHAR(20)`` -> ``VARCHAR``."""
    return " ".join(_PARAMS.sub(" ", declared).upper().split())


def sqlite_affinity(declared: str) -> str:
    """SQLite's column affinity for a declared type (its rules, in their order)."""
    t = declared.upper()
    if "INT" in t:
        return "INTEGER"
    if any(s in t for s in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if "BLOB" in t or not t.strip():
        return "BLOB"
    if any(s in t for s in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


_PG_INT_WIDTH = {"SMALLINT": 2, "INTEGER": 4, "BIGINT": 8}
_PG_TIMESTAMPS = ("TIMESTAMP WITH TIME ZONE", "TIMESTAMP WITHOUT TIME ZONE")


def type_fits(dialect: str, dtype: DataType, declared: str) -> bool:
    """Whether values of Spark type ``dtype`` keep their type and value in a column declared
    ``declared`` (SQLite as written in its DDL; PostgreSQL as ``format_type`` shows it).

    What the sink itself would create (``Dialect.column_type``) fits; so does a wider
    integer, a float into a double, a string into any text type, a timestamp into either
    kind of timestamp, and a decimal into a numeric that loses no digit. Anything else
    (a string into ``INTEGER``, a long into ``REAL`` or ``TEXT``...) does not.
    """
    from pyspark.sql import types as T

    base = _base_type(declared)
    if dialect == "sqlite":
        if not base:
            return True  # an untyped column stores every value exactly as written
        affinity = sqlite_affinity(declared)
        if isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
            return affinity == "INTEGER"  # SQLite stores every integer in up to 64 bits
        if isinstance(dtype, T.BooleanType):
            return affinity == "INTEGER" or base in ("BOOLEAN", "BOOL")
        if isinstance(dtype, (T.FloatType, T.DoubleType)):
            return affinity == "REAL"
        if isinstance(dtype, (T.StringType, T.DecimalType)):
            return affinity == "TEXT"  # decimals are written as text, exact
        if isinstance(dtype, T.DateType):
            return affinity == "TEXT" or base in ("DATE", "DATETIME")
        if isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
            return affinity == "TEXT" or base in ("TIMESTAMP", "TIMESTAMPTZ", "DATETIME")
        if isinstance(dtype, T.BinaryType):
            return affinity == "BLOB"
        return False
    ints = {T.ByteType: 2, T.ShortType: 2, T.IntegerType: 4, T.LongType: 8}
    for cls, width in ints.items():
        if isinstance(dtype, cls):
            return _PG_INT_WIDTH.get(base, 0) >= width
    if isinstance(dtype, T.FloatType):
        return base in ("REAL", "DOUBLE PRECISION")
    if isinstance(dtype, T.DoubleType):
        return base == "DOUBLE PRECISION"
    if isinstance(dtype, T.StringType):
        return base in ("TEXT", "CHARACTER VARYING")
    if isinstance(dtype, T.BooleanType):
        return base == "BOOLEAN"
    if isinstance(dtype, T.BinaryType):
        return base == "BYTEA"
    if isinstance(dtype, T.DateType):
        return base == "DATE"
    if isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
        return base in _PG_TIMESTAMPS
    if isinstance(dtype, T.DecimalType):
        if base != "NUMERIC":
            return False
        params = re.findall(r"\d+", declared)
        if not params:
            return True  # unconstrained numeric holds any decimal exactly
        precision, scale = int(params[0]), int(params[1]) if len(params) > 1 else 0
        return scale >= dtype.scale and precision - scale >= dtype.precision - dtype.scale
    return False


def spark_type_for(dialect: str, declared: str) -> str | None:
    """A Spark type (for ``Column.cast``) whose values fit ``declared``, if one is obvious."""
    base = _base_type(declared)
    if dialect == "sqlite":
        if base in ("BOOLEAN", "BOOL"):
            return "boolean"
        if base in ("DATE",):
            return "date"
        if base in ("TIMESTAMP", "TIMESTAMPTZ", "DATETIME"):
            return "timestamp"
        affinity = sqlite_affinity(declared)
        return {"INTEGER": "long", "REAL": "double", "TEXT": "string", "BLOB": "binary"}.get(
            affinity
        )
    if base == "NUMERIC":
        params = re.findall(r"\d+", declared)
        if params:
            return f"decimal({params[0]},{params[1] if len(params) > 1 else 0})"
        return "decimal(38,18)"
    known = {
        "SMALLINT": "short",
        "INTEGER": "int",
        "BIGINT": "long",
        "REAL": "float",
        "DOUBLE PRECISION": "double",
        "TEXT": "string",
        "CHARACTER VARYING": "string",
        "BOOLEAN": "boolean",
        "BYTEA": "binary",
        "DATE": "date",
        "TIMESTAMP WITH TIME ZONE": "timestamp",
        "TIMESTAMP WITHOUT TIME ZONE": "timestamp_ntz",
    }
    return known.get(base)


class SqlStager(Stager):
    """How a SQL sink stages a batch and writes it (the stager of :class:`SqlSink`).

    The batch's rows are collected on the driver (:meth:`prepare`) and written into
    ``table`` inside the commit's transaction (:meth:`publish`), through ``store``'s
    connection. It also checks the output against the table (:meth:`validate`).
    """

    stages_on_driver = True

    def __init__(
        self,
        store: SqlLedgerStore,
        table: str,
        mode: WriteMode,
        keys: tuple[str, ...],
        latest_by: tuple[str, ...],
    ) -> None:
        self.store = store
        self.url: StoreURL = store.url
        self.dialect: Dialect = store.dialect
        self.table = table
        self.mode = mode
        self.keys = keys
        self.latest_by = latest_by
        # Spark's output mode of the running query, as given to validate() (once per run).
        self.output_mode: OutputMode = "append"
        self._table_checked = False

    @property
    def conn(self) -> Any:
        return self.store.conn

    # -- schema --------------------------------------------------------------
    def validate(self, schema: StructType, output_mode: OutputMode = "append") -> None:
        """Check the output against the sink and its tables (driver, before the epoch).

        Remembers ``output_mode`` for this run's commits (``"complete"`` replaces the
        table's content each batch). Refuses, with :class:`ConfigError`: bad column
        names, keys or ``latest_by`` columns missing from the output, types the store
        cannot hold, and columns the existing table lacks or declares with a type the
        output's type does not fit.
        """
        if output_mode not in ("append", "update", "complete"):
            raise ConfigError(
                f"output mode {output_mode!r} is not one of Spark's: 'append', 'update' or "
                "'complete'"
            )
        names = [f.name for f in schema.fields]
        for name in names:
            check_identifier(name, "output column")
        missing = [k for k in self.keys if k not in names]
        if missing:
            raise ConfigError(
                f"upsert keys {missing} are not columns of the pipeline's output "
                f"(columns: {names}); fix keys=[...] or the transform"
            )
        missing = [c for c in self.latest_by if c not in names]
        if missing:
            raise ConfigError(
                f"latest_by columns {missing} are not columns of the pipeline's output "
                f"(columns: {names}); keep them in the transform's output (for example the "
                "source's 'partition' and 'offset') or fix latest_by=[...]"
            )
        for f in schema.fields:
            self.dialect.column_type(f.dataType, f.name)  # raises for unsupported types
        for relation in self._relations():
            declared = self._declared_types(relation)
            if not declared:
                continue
            absent = [n for n in names if n not in declared]
            if absent:
                raise ConfigError(
                    f"table {relation!r} in {self.url} has no column(s) {absent}; its columns "
                    f"are {sorted(declared)}. Alter the table or rename the output columns."
                )
            for f in schema.fields:
                self._check_type(relation, f.name, f.dataType, declared[f.name])
        self.output_mode = output_mode

    def _relations(self) -> tuple[str, ...]:
        """The relations this sink writes the output's columns into."""
        return (self.table,)

    def _check_type(self, relation: str, column: str, dtype: DataType, declared: str) -> None:
        """Refuse an output type the declared column type does not fit (see ``type_fits``)."""
        if type_fits(self.dialect.name, dtype, declared):
            return
        created = self.dialect.column_type(dtype, column)
        cast = spark_type_for(self.dialect.name, declared)
        fix = (
            f"cast it in the transform to a type that fits, e.g. F.col({column!r}).cast({cast!r})"
            if cast
            else "cast it in the transform to a type that fits"
        )
        silent = (
            " SQLite would store such values without an error, changing their type."
            if self.dialect.name == "sqlite"
            else ""
        )
        raise ConfigError(
            f"table {relation!r} in {self.url} declares column {column!r} as {declared}, but "
            f"the pipeline's output has {column!r} as {dtype.simpleString()} (the sink would "
            f"create a column of type {created} for it).{silent} Either alter the table's "
            f"column to {created} (or drop the table and let the sink create it), or {fix}. "
            "Nothing was written and no epoch was taken."
        )

    def _declared_types(self, relation: str) -> dict[str, str]:
        """The columns of ``relation`` (table or view) and their declared types, in order."""
        if self.dialect.name == "sqlite":
            rows = fetchall(self.conn, self.dialect, f"PRAGMA table_info({qi(relation)})")
            return {str(r[1]): str(r[2] or "") for r in rows}
        rows = fetchall(
            self.conn,
            self.dialect,
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relname = %s "
            "AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND a.attnum > 0 "
            "AND NOT a.attisdropped ORDER BY a.attnum",
            (relation,),
        )
        return {str(r[0]): str(r[1]) for r in rows}

    def _create_table(self, conn: Any, schema: StructType) -> None:
        cols = []
        for f in schema.fields:
            null = " NOT NULL" if f.name in self.keys else ""
            cols.append(f"{qi(f.name)} {self.dialect.column_type(f.dataType, f.name)}{null}")
        if self.keys:
            cols.append(f"PRIMARY KEY ({qlist(self.keys)})")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {qi(self.table)} ({', '.join(cols)})")

    def prepare(self, ctx: BatchContext, df: DataFrame, seq: int) -> Staged:
        """Collect the batch's rows on the driver (outside the store transaction)."""
        return self.prepare_arrow(ctx, df.toArrow(), df.schema, seq)

    def prepare_arrow(self, ctx: BatchContext, table: Any, schema: StructType, seq: int) -> Staged:
        """The batch's rows, already collected on the driver, as Python rows."""
        columns = list(table.column_names)
        rows = self._rows_from_arrow(table, schema)
        return Staged(len(rows), (schema, columns, rows))

    def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        """Step 3: write the rows. In complete mode the batch is the whole result: it
        replaces the table's content, in this same transaction."""
        schema, columns, rows = staged.payload
        if not self._table_checked:
            self._create_table(txn, schema)
        if self.output_mode == "complete":
            txn.execute(f"DELETE FROM {qi(self.table)}")
        staged.written = self._write_rows(txn, columns, rows, schema)

    def after_commit(self, ctx: BatchContext) -> None:
        self._table_checked = True

    def keeps_empty_no_data_batches(self) -> bool:
        return self.output_mode == "complete"

    # -- row writing ----------------------------------------------------------------
    def _write_rows(
        self,
        conn: Any,
        columns: list[str],
        rows: list[tuple[Any, ...]],
        schema: StructType | None = None,
    ) -> int:
        """Write the batch's rows; returns how many were written (an upsert with
        ``latest_by`` writes one per key)."""
        if not rows:
            return 0
        if self.mode == "upsert":
            rows = self._one_row_per_key(columns, rows, schema)
        self._insert(conn, columns, rows)
        return len(rows)

    def _one_row_per_key(
        self, columns: list[str], rows: list[tuple[Any, ...]], schema: StructType | None
    ) -> list[tuple[Any, ...]]:
        """Upsert: refuse NULL keys; reduce a repeated key by ``latest_by``, or refuse it."""
        idx = [columns.index(k) for k in self.keys]
        groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        for r in rows:
            key = tuple(r[i] for i in idx)
            if any(v is None for v in key):
                raise SinkError(
                    f"upsert into {self.table!r}: a row has a NULL key "
                    f"{dict(zip(self.keys, key, strict=True))}; key columns must not be NULL. "
                    "Nothing of this batch was committed."
                )
            groups.setdefault(key, []).append(r)
        if len(groups) == len(rows):
            return rows
        if not self.latest_by:
            key, group = next((k, g) for k, g in groups.items() if len(g) > 1)
            raise SinkError(repeated_key_message(self.table, self.keys, key, len(group)))
        absent = [c for c in self.latest_by if c not in columns]
        if absent:
            raise ConfigError(
                f"latest_by columns {absent} are not columns of the batch ({columns})"
            )
        types = {f.name: f.dataType for f in schema.fields} if schema is not None else {}
        order = [(columns.index(c), types.get(c)) for c in self.latest_by]

        def rank(row: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(_orderable(dtype, row[i]) for i, dtype in order)

        reduced = []
        for key, group in groups.items():
            if len(group) == 1:
                reduced.append(group[0])
                continue
            ranked = sorted(group, key=rank, reverse=True)
            tied = next((a for a, b in itertools.pairwise(ranked) if rank(a) == rank(b)), None)
            if tied is not None:
                values = {c: tied[i] for c, (i, _) in zip(self.latest_by, order, strict=True)}
                raise SinkError(
                    latest_by_tie_message(self.table, self.keys, key, self.latest_by, values)
                )
            reduced.append(ranked[0])
        return reduced

    def _insert(self, conn: Any, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError

    def _upsert_clause(self, columns: list[str]) -> str:
        rest = [c for c in columns if c not in self.keys]
        if not rest:
            return f" ON CONFLICT ({qlist(self.keys)}) DO NOTHING"
        sets = ", ".join(f"{qi(c)} = excluded.{qi(c)}" for c in rest)
        return f" ON CONFLICT ({qlist(self.keys)}) DO UPDATE SET {sets}"

    def _rows_from_arrow(self, table: Any, schema: StructType) -> list[tuple[Any, ...]]:
        cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
        return list(zip(*cols, strict=True)) if cols else []

    # -- errors ----------------------------------------------------------------
    def _output_dropped(self) -> None:
        """The output table was dropped (an inspector's reset): create it again when needed."""
        self._table_checked = False


class SqlSink(TransactionalSink):
    """Driver-commit transactional sink over a SQL store (see the module docstring).

    ``mode="append"`` inserts every row; ``mode="upsert"`` inserts or replaces
    rows by ``keys`` (the table gets a primary key on them when the sink creates
    it). ``latest_by`` (upsert only) names output columns whose greatest value picks
    the row that wins when a batch repeats a key. With Spark's output mode
    ``"complete"`` every batch replaces the table's content. The sink creates the
    output table from the DataFrame's schema if it is missing, and its own metadata
    tables ``sparkonce_owner`` and ``sparkonce_ledger``.

    ``ledger_keep`` (None: keep every entry): prune each pipeline's ledger to its newest
    ``ledger_keep`` entries (at least 1) in every commit's transaction, keeping every entry
    at the ledger's end; replays, resume points and fencing work as before (see
    :mod:`sparkonce.ledger.sql`). ``sparkonce status`` then shows the kept entries only.

    It is its ledger store (:class:`~sparkonce.ledger.sql.SqlLedgerStore`) plus its stager
    (:class:`SqlStager`, of the dialect's kind: ``stager_type``).
    """

    guarantee: ClassVar[Guarantee] = "effectively-once"
    supports_connection_drop: ClassVar[bool] = True
    scheme: ClassVar[str] = ""
    stager_type: ClassVar[type[SqlStager]] = SqlStager
    store: SqlLedgerStore
    stager: SqlStager

    def __init__(
        self,
        url: str | StoreURL,
        table: str,
        *,
        mode: WriteMode = "append",
        keys: tuple[str, ...] | list[str] = (),
        latest_by: tuple[str, ...] | list[str] = (),
        ledger_keep: int | None = None,
    ) -> None:
        self.url = url if isinstance(url, StoreURL) else StoreURL.parse(url)
        if self.scheme and self.url.scheme != self.scheme:
            raise ConfigError(
                f"{type(self).__name__} needs a {self.scheme} URL, got {str(self.url)!r}"
            )
        self.table = check_identifier(table, "table")
        self.mode: WriteMode
        self.mode, self.keys = check_write_mode(mode, keys)
        self.latest_by = _check_latest_by(latest_by, mode, self.keys)
        self.dialect: Dialect = dialect_for(self.url)
        self.store = SqlLedgerStore(
            self.url,
            self.dialect,
            inspect_hint=self._status_hint("{pipeline}"),
            keep=ledger_keep,
        )
        self.stager = self.stager_type(self.store, self.table, self.mode, self.keys, self.latest_by)

    # -- the store --------------------------------------------------------------------
    def open_store(self) -> None:
        self.store.conn  # noqa: B018 - connects and creates the metadata tables

    def close_store(self) -> None:
        self.store.close()

    @property
    def conn(self) -> Any:
        """The store's connection (connects first)."""
        self.open()
        return self.store.conn

    def describe(self) -> str:
        keys = f" keys={list(self.keys)}" if self.keys else ""
        if self.latest_by:
            keys += f" latest_by={list(self.latest_by)}"
        return f"{type(self).__name__}({self.url} table={self.table} mode={self.mode}{keys})"

    def __repr__(self) -> str:
        return self.describe()

    def _status_hint(self, pipeline: str) -> str:
        return f"sparkonce status --pipeline {pipeline} --sink '{self.url}'"

    # -- one of several outputs ------------------------------------------------------
    def store_key(self) -> Hashable:
        """One SQLite file, or one PostgreSQL database (host, port, database name)."""
        u = self.url
        if u.scheme == "sqlite":
            assert u.path is not None
            return ("sqlite", str(u.path.expanduser().resolve()))
        return ("postgresql", (u.host or "").lower(), u.port or 5432, u.dbname)

    # -- the stager's ----------------------------------------------------------------
    @property
    def output_mode(self) -> OutputMode:
        """Spark's output mode of the running query, as given to :meth:`validate`."""
        return self.stager.output_mode

    def validate(self, schema: StructType, output_mode: OutputMode = "append") -> None:
        """Check the output against the sink and its tables (driver, before the epoch):
        :meth:`SqlStager.validate`."""
        self.open()
        self.stager.validate(schema, output_mode)

    def commit_rows(
        self, ctx: BatchContext, schema: StructType, columns: list[str], rows: list[tuple[Any, ...]]
    ) -> CommitResult:
        """Commit a batch given as Python rows, without Spark (tests, the simulation)."""
        self.open()
        assert self._committer is not None
        staged = Staged(len(rows), (schema, columns, rows))
        return self._committer.commit_with(ctx, lambda _seq: staged)

    # -- errors ----------------------------------------------------------------
    def _drop_connection(self) -> None:
        self.store.reconnect()

    def _output_dropped(self) -> None:
        """The output table was dropped (an inspector's reset): create it again when needed."""
        self.stager._output_dropped()


class SQLiteStager(SqlStager):
    """Writes a batch into a SQLite table (``executemany``); SQLite's value conversions."""

    def _insert(self, conn: Any, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        marks = ", ".join("?" for _ in columns)
        sql = f"INSERT INTO {qi(self.table)} ({qlist(columns)}) VALUES ({marks})"
        if self.mode == "upsert":
            sql += self._upsert_clause(columns)
        conn.executemany(sql, rows)

    def _rows_from_arrow(self, table: Any, schema: StructType) -> list[tuple[Any, ...]]:
        rows = super()._rows_from_arrow(table, schema)
        if not any(_needs_sqlite_conversion(f.dataType) for f in schema.fields):
            return rows
        return [tuple(_sqlite_value(v) for v in r) for r in rows]


class SQLiteSink(SqlSink):
    """Transactional sink into a SQLite database file (the embedded default).

    Guarantee: **effectively-once** (see :mod:`sparkonce.sinks.sql`): rows, the
    epoch check and the ledger row commit in one SQLite transaction, taken with
    ``BEGIN IMMEDIATE`` and made durable with ``synchronous=FULL``.
    """

    scheme = "sqlite"
    stager_type = SQLiteStager


def _needs_sqlite_conversion(dtype: Any) -> bool:
    from pyspark.sql import types as T

    return isinstance(
        dtype, (T.DecimalType, T.DateType, T.TimestampType, T.TimestampNTZType, T.BooleanType)
    )


def _sqlite_value(v: Any) -> Any:
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    if isinstance(v, bool):
        return int(v)
    return v


class PostgresStager(SqlStager):
    """Writes a batch into a PostgreSQL table: ``COPY``, or ``COPY`` into a temporary
    stage and ``INSERT ... ON CONFLICT`` for an upsert."""

    def _insert(self, conn: Any, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        collist = qlist(columns)
        if self.mode == "append":
            with (
                conn.cursor() as cur,
                cur.copy(f"COPY {qi(self.table)} ({collist}) FROM STDIN") as cp,
            ):
                for r in rows:
                    cp.write_row(r)
            return
        conn.execute(
            f"CREATE TEMP TABLE sparkonce_stage (LIKE {qi(self.table)} INCLUDING DEFAULTS) "
            "ON COMMIT DROP"
        )
        with conn.cursor() as cur, cur.copy(f"COPY sparkonce_stage ({collist}) FROM STDIN") as cp:
            for r in rows:
                cp.write_row(r)
        conn.execute(
            f"INSERT INTO {qi(self.table)} ({collist}) SELECT {collist} FROM sparkonce_stage"
            + self._upsert_clause(columns)
        )


class PostgresSink(SqlSink):
    """Transactional sink into PostgreSQL, through psycopg 3.

    Guarantee: **effectively-once** (see :mod:`sparkonce.sinks.sql`): rows are
    loaded with COPY, and the epoch check (``SELECT ... FOR UPDATE`` on the
    owner row), the rows and the ledger row commit in one transaction. A
    connection dropped mid-commit is retried on a new connection; if the lost
    COMMIT had succeeded the retry finds the ledger row and does nothing.
    """

    scheme = "postgresql"
    stager_type: ClassVar[type[SqlStager]] = PostgresStager


def first_bad_key(
    df: DataFrame, keys: tuple[str, ...], latest_by: tuple[str, ...] = ()
) -> tuple[dict[str, Any], dict[str, Any], int] | None:
    """The first key of an upsert batch that cannot be merged, found by Spark's tasks (one
    aggregation; only the one row found reaches the driver), or ``None``.

    A key is bad when a key column is NULL, or when it appears more than once with the
    same ``latest_by`` values (with no ``latest_by``: more than once at all). Returns the
    key's columns, its ``latest_by`` values and how many rows share them; the sink words
    the error. Shared by the upsert sinks that stage with Spark (Delta, Iceberg). Kept out of
    sinks/base.py, which the mutation run mutates: only Spark tests reach it.
    """
    from pyspark.sql import functions as F

    null_key = F.lit(False)
    for k in keys:
        null_key = null_key | F.col(k).isNull()
    bad = (
        df.groupBy(*keys, *latest_by)
        .agg(F.count(F.lit(1)).alias("_sparkonce_n"))
        .where((F.col("_sparkonce_n") > 1) | null_key)
        .limit(1)
        .collect()
    )
    if not bad:
        return None
    row = bad[0]
    return (
        {k: row[k] for k in keys},
        {c: row[c] for c in latest_by},
        int(row["_sparkonce_n"]),
    )
