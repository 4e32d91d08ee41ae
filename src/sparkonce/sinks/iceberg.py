"""Apache Iceberg sink: append mode, rows written by Spark's tasks, added by PyIceberg.

**Guarantee (DESIGN.md section 1): effectively-once**, on the SQL catalog (SQLite and
PostgreSQL, tested): work may run more than once after a failure (a batch is computed and
its files written again), but only one run's effects are ever visible: every input record
of the pipeline's source is in the table exactly once after any crash, retry or restart,
provided only sparkonce commits this pipeline (other writers may append to the table:
their rows are theirs). Each batch is one Iceberg snapshot, committed through the
catalog's atomic swap of the table's metadata together with the pipeline's ledger (see
:mod:`sparkonce.ledger.iceberg`). Other catalogs (REST, Glue, Hive...) are not tested and
not supported: the ledger's check is a requirement that PyIceberg's SQL catalog validates
in-process.

**How rows get in** (:class:`IcebergStager`): outside the commit, Spark's tasks write the
batch as Parquet into a staging directory unique to the attempt, inside the table's
location; Spark's job commit keeps only successful task attempts' files. The commit adds
exactly that directory's committed files (PyIceberg's ``add_files``) in the transaction
that records the batch's entry: one snapshot. Nothing of the rows passes through the
driver; it reads the files' footers only. Files of failed attempts are deleted by the
batch's abort; those of crashed attempts, zombies and replays skipped inside the commit are
never referenced, and the orphan sweep (:meth:`IcebergStager.sweep`, after a commit, at
most once a minute)
deletes them, never a running pipeline's in-flight batch.

What is refused before the epoch (``ConfigError`` from :meth:`IcebergSink.validate`): an
output column missing from the table or of another type, a partitioned table, a warehouse
that is not local (``file://``), Spark's ``complete`` output mode. On a Spark Connect
session the batch function, and so the commit, runs in the server's Python worker with a
catalog of its own (:meth:`IcebergSink.__reduce__`).

**Upsert** (``mode="upsert"``, ``keys=[...]``, optional ``latest_by``): the same semantics
as the other upsert sinks. A batch may hold one row per key; with ``latest_by`` (a column
name or a list of them, typically the source's ``partition`` and ``offset``) a repeated
key keeps its row with the greatest ``latest_by`` tuple (NULL lowest), and two rows of one
key with equal ``latest_by`` values are refused; without it a repeated key is refused. A
NULL key is refused. Spark's tasks check and reduce the rows (one aggregation and, with
``latest_by``, one window over the batch, cached), then write them as for an append. The
commit replaces each existing row of a batch key in the batch's one snapshot, by
copy-on-write (PyIceberg 0.12 writes no delete files): the data files holding a batch key
are rewritten without those rows. That runs on the driver, inside the commit, and reads
the key columns of the files whose bounds overlap the batch's keys and the whole of the
files that hold one: see :mod:`sparkonce.ledger.iceberg_upsert` for the cost. Refused
before the epoch: keys or ``latest_by`` columns missing from the output or the table, a
key or ``latest_by`` column of a type without an order (array, map, struct) or a float key.

**Snapshot retention** (``keep_snapshots``, default :data:`KEEP_SNAPSHOTS`): each batch's
commit also expires the main branch's snapshots older than the newest ``keep_snapshots``
(the batch's own counts), in the same catalog commit, at most 100 at a time; snapshots a
branch or tag points at stay. Iceberg's metadata file lists every snapshot and every commit
rewrites it, so without retention a commit's time grows with the history (about 1 ms per
snapshot here, ``docs/performance.md``); with it, it stays as it is at ``keep_snapshots``.
Expiry loses no progress (the resume point is in the table's properties) and no rows (an
append's files stay in the current snapshot; only the sweep deletes files, never one a
kept or expired batch added). The files only expired snapshots used (their manifest lists,
an upsert's replaced data files) stay on disk for Iceberg's own orphan-file maintenance to
remove. Time travel reaches back ``keep_snapshots`` batches; a
replay of a no-data batch older than that is not recognized, so keep more snapshots than
the no-data batches a pipeline can run in a row. ``None`` keeps every snapshot. A table
the sink creates has manifest merging on (``commit.manifest-merge.enabled``): each batch
adds a manifest, and without merging the manifest list every commit writes names them
all; set that property on a table made elsewhere.

``catalog``: a PyIceberg catalog (``pyiceberg.catalog.sql.SqlCatalog``); ``table``:
``"namespace.name"``. The table is created from the output's schema on first use when it
does not exist. ``orphan_grace_seconds``: how old an unreferenced staging directory must be
before the sweep deletes it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import unquote, urlparse

from sparkonce.commit.base import Staged, Stager
from sparkonce.config import (
    Guarantee,
    OutputMode,
    WriteMode,
    check_write_mode,
    is_count,
    mask_url,
)
from sparkonce.errors import ConfigError, SinkError
from sparkonce.ledger.iceberg import DataFiles, IcebergLedgerStore
from sparkonce.sinks.base import TransactionalSink
from sparkonce.sinks.sql import (
    _check_latest_by,
    first_bad_key,
    latest_by_tie_message,
    repeated_key_message,
)

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from sparkonce.ledger.base import BatchContext

log = logging.getLogger(__name__)

#: The snapshots an IcebergSink keeps by default: each batch commit expires older ones.
KEEP_SNAPSHOTS = 100


def _plain(t: Any) -> Any:
    """An Arrow type with large/small string and binary variants made one, and the small
    integers as Iceberg's ``int`` (it has no 8 or 16 bit type: Spark's byte and short), at
    every level of nesting."""
    import pyarrow as pa

    if pa.types.is_int8(t) or pa.types.is_int16(t):
        return pa.int32()
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    # Inside nested types too: the table's schema read back has large strings where Spark's
    # schema as Arrow has plain ones. Field names and nullability inside are not compared,
    # as they are not for top-level columns: Arrow names a list's item "item" or "element"
    # depending on who built it.
    if pa.types.is_map(t):
        return pa.map_(_plain(t.key_type), _plain(t.item_type))
    if (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    ):
        return pa.list_(_plain(t.value_type))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_plain(t.value_type), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type)) for f in t])
    return t


def check_schema(batch: pa.Schema, table: pa.Schema, where: str) -> None:
    """Raise ConfigError unless ``batch`` has ``table``'s columns with the same types."""
    mine = {f.name: f.type for f in batch}
    theirs = {f.name: f.type for f in table}
    for name, t in mine.items():
        if name not in theirs:
            raise ConfigError(
                f"column {name!r} ({t}) of the batch is not in {where} (its columns: "
                f"{', '.join(theirs)}). Add it to the table, or drop it from the output."
            )
        if _plain(t) != _plain(theirs[name]):
            raise ConfigError(
                f"column {name!r} is {t} in the batch but {theirs[name]} in {where}. "
                "Cast it in the pipeline's transform, or change the table's column type."
            )
    missing = [n for n in theirs if n not in mine]
    if missing:
        raise ConfigError(
            f"{where} has columns the batch lacks: {', '.join(missing)}. Add them to the "
            "pipeline's output (or make them optional and drop them from the table)."
        )


#: Where the executor route stages a batch, under the table's location.
STAGING_DIR = "data/sparkonce"
#: The SQL options of each staging write: Iceberg has no INT96 timestamps (Spark's default
#: for ``TimestampType`` in Parquet), so timestamps are written as INT64 microseconds.
WRITE_CONF = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}
#: How old an unreferenced staging directory must be before the sweep deletes it.
ORPHAN_GRACE_SECONDS = 15 * 60
#: How often, at most, a pipeline's commits sweep orphan staging directories.
SWEEP_EVERY_SECONDS = 60.0
_STAGED_NAME = re.compile(r"^(\d+)-(\d+)-([0-9a-f]{32})$")


def local_location(table: Any, where: str) -> Path:
    """The table's location as a local directory; a ConfigError for any other scheme."""
    url = urlparse(table.location())
    if url.scheme not in ("", "file"):
        raise ConfigError(
            f"{where} is at {table.location()}: IcebergSink's Spark tasks write data files only "
            "into a local warehouse (file://) so far. Use a SqlCatalog whose warehouse is a "
            "local directory."
        )
    return Path(unquote(url.path))


def staging_root(table: Any, pipeline: str, where: str) -> Path:
    """The directory that holds ``pipeline``'s staging directories, one per attempt."""
    return local_location(table, where) / STAGING_DIR / pipeline


def committed_files(directory: Path) -> list[Path]:
    """The data files Spark's job commit left in ``directory``: ``_SUCCESS`` must be there
    (the job committed, so only its successful task attempts' files were moved in)."""
    if not (directory / "_SUCCESS").exists():
        raise SinkError(
            f"Spark's write into {directory} did not commit (no _SUCCESS marker); nothing of "
            "the batch was committed. Check the query's error and run the pipeline again."
        )
    return sorted(
        f for f in directory.iterdir() if f.name.startswith("part-") and f.suffix == ".parquet"
    )


class IcebergStager(Stager):
    """A batch written by Spark's tasks as Parquet files into a staging directory inside
    the table's location, whose committed files are added to the table in the commit.

    The staging directory is unique per attempt: ``<location>/data/sparkonce/<pipeline>/
    <epoch>-<seq>-<uuid>``. Spark's own job commit decides which files it holds (only the
    successful task attempts'; failed and speculative ones stay in ``_temporary`` and are
    deleted by the job commit), and ``_SUCCESS`` says the job committed. The files are
    added exactly as listed after that, with the batch's entry, in one catalog commit.

    :meth:`prepare_arrow` keeps the driver route (an Arrow table PyIceberg writes itself),
    used by the protocol simulation, which has no Spark.
    """

    stages_on_driver = False  # Spark's tasks write the rows

    def __init__(
        self,
        store: IcebergLedgerStore,
        grace_seconds: float,
        keys: tuple[str, ...] = (),
        latest_by: tuple[str, ...] = (),
    ) -> None:
        self.store = store
        self.grace_seconds = grace_seconds
        self.keys = keys  # empty: an append
        self.latest_by = latest_by
        self._writing: Path | None = None  # the directory of the attempt being staged
        self._swept_at: float | None = None  # time.monotonic() of this stager's last sweep

    def one_row_per_key(self, ctx: BatchContext, df: DataFrame) -> DataFrame:
        """Upsert: refuse a NULL key, a repeated key without ``latest_by`` and a tie on
        ``latest_by``; keep each key's row with the greatest ``latest_by`` (Spark's tasks:
        one aggregation, then a window). ``df`` should be cached: it is read twice."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        keys = list(self.keys)
        where = self.store.identifier
        bad = first_bad_key(df, self.keys, self.latest_by)
        if bad is not None:
            key_cols, values, n = bad
            key = tuple(key_cols.values())
            if any(v is None for v in key):
                raise SinkError(
                    f"upsert into {where!r}: a row of batch {ctx.ranges} has a NULL key "
                    f"{key_cols}; key columns must not be NULL. "
                    "Filter or fill them in the transform. Nothing of this batch was committed."
                )
            if not self.latest_by:
                raise SinkError(repeated_key_message(where, self.keys, key, n))
            raise SinkError(latest_by_tie_message(where, self.keys, key, self.latest_by, values))
        if not self.latest_by:
            return df
        order = [F.col(c).desc_nulls_last() for c in self.latest_by]
        rank = F.row_number().over(Window.partitionBy(*keys).orderBy(*order))
        return (
            df.withColumn("_sparkonce_rank", rank)
            .where("_sparkonce_rank = 1")
            .drop("_sparkonce_rank")
        )

    def prepare(self, ctx: BatchContext, df: DataFrame, seq: int) -> Staged:
        from pyarrow import parquet as pq

        from sparkonce.spark.delta import session_conf

        table = self.store.load()
        name = f"{ctx.epoch}-{seq}-{uuid.uuid4().hex}"
        directory = staging_root(table, ctx.pipeline, self.store.describe()) / name
        self._writing = directory
        cached = None
        if self.keys:
            cached = df = df.persist()  # the check reads it, then the write
        try:
            if self.keys:
                df = self.one_row_per_key(ctx, df)
            # Per write, not for the session: a timestamp column would otherwise be INT96,
            # which add_files refuses (and it would fail inside the commit).
            with session_conf(df.sparkSession, WRITE_CONF):
                df.write.mode("error").parquet(directory.as_uri())  # Connect: no "errorifexists"
        finally:
            if cached is not None:
                cached.unpersist()
        paths: list[str] = []
        rows = 0
        for f in committed_files(directory):
            n = pq.read_metadata(f).num_rows
            if n == 0:
                f.unlink()  # an empty task's file: nothing to add
                continue
            rows += n
            paths.append(f.as_uri())
        if not paths:
            shutil.rmtree(directory, ignore_errors=True)
        return Staged(
            rows=rows,
            payload=DataFiles(tuple(paths), rows, name, self.keys),
            notes={"dir": directory},
        )

    def prepare_arrow(
        self, ctx: BatchContext, table: pa.Table, schema: StructType | None, seq: int
    ) -> Staged:
        if self.store.schema is None:
            self.store.schema = table.schema
        target = self.store.load()
        check_schema(table.schema, target.schema().as_arrow(), self.store.describe())
        if self.keys:
            raise ConfigError(
                "IcebergSink upsert stages batches with Spark's tasks only: the Arrow route "
                "(the protocol simulation's) appends. Run the pipeline on a classic Spark session."
            )
        return Staged(rows=table.num_rows, payload=table)

    def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        txn.data = staged.payload

    def abort(self, ctx: BatchContext, staged: Staged | None) -> None:
        """Delete this attempt's staging directory, once the table says it was not added.

        The batch failed, but a failure reported by the commit does not prove the catalog
        did not commit it (an answer lost after the swap): the directory is deleted only if
        no snapshot of the table names it. If the table cannot be read, it stays, for the
        orphan sweep (which knows which directory each committed batch added)."""
        directory = staged.notes.get("dir") if staged is not None else self._writing
        self._writing = None
        if directory is None or not directory.exists():
            return
        try:
            if directory.name in committed_dirs(self.store.load(), ctx.pipeline).values():
                return  # the commit went through after all: these are the batch's files
        except Exception as exc:
            log.warning("pipeline %r: kept %s (table unreadable: %s)", ctx.pipeline, directory, exc)
            return
        shutil.rmtree(directory, ignore_errors=True)

    def after_commit(self, ctx: BatchContext) -> None:
        self._writing = None
        # The sweep lists the staging root, one directory per batch ever staged (an append's
        # files live there), so it costs more with every batch; and nothing younger than the
        # grace period may go anyway. So it runs at most once per SWEEP_EVERY_SECONDS (or
        # the grace period, if shorter: 0 sweeps after every commit).
        now = time.monotonic()
        every = min(self.grace_seconds, SWEEP_EVERY_SECONDS)
        if self._swept_at is not None and now - self._swept_at < every:
            return
        self._swept_at = now
        try:
            self.sweep(ctx.pipeline, self.store.committed)
        except Exception as exc:  # best effort: the next commit sweeps again
            log.warning("pipeline %r: orphan sweep failed: %s", ctx.pipeline, exc)

    def sweep(
        self, pipeline: str, table: Any = None, grace_seconds: float | None = None
    ) -> list[Path]:
        """Delete ``pipeline``'s staging directories that no snapshot references; return them.

        A directory ``<epoch>-<seq>-<uuid>`` is deleted only when both hold:

        * batch ``seq`` is committed, by a snapshot still in the table's history whose
          summary names another directory (``sparkonce.<pipeline>.staged``) or none (a
          batch added by the Arrow route). A seq with no such snapshot is never swept: it
          is not committed yet, or its snapshot expired and which directory holds its
          files is no longer known;
        * it was last modified more than ``grace_seconds`` ago.

        Why a running pipeline's in-flight attempt is never deleted: the owner stages the
        batch ``seq = last + 1``, ``last`` being the newest entry it read after taking its
        epoch; while it owns the pipeline nobody else can commit (every commit requires
        the committer's epoch), so no snapshot of that ``seq`` exists until the owner's own
        commit adds its directory. A directory of a seq already committed by another
        directory belongs to an attempt that can never commit (its commit requires the
        stored entry ``seq - 1``, and ``seq`` is there): a failed, aborted or crashed
        attempt, or a zombie's. The grace period only spares a zombie's Spark job the
        noise of files vanishing under it.
        """
        table = table if table is not None else self.store.load()
        root = staging_root(table, pipeline, self.store.describe())
        if not root.is_dir():
            return []
        winners = committed_dirs(table, pipeline)
        grace = self.grace_seconds if grace_seconds is None else grace_seconds
        now = time.time()
        gone: list[Path] = []
        # One directory per batch ever staged stays (an append's files live there), so the
        # listing grows with the batches; only names of a seq that a kept snapshot names
        # are candidates, so the names are checked before any file is looked at.
        for name in os.listdir(root):
            m = _STAGED_NAME.match(name)
            if m is None:
                continue
            won = winners.get(int(m.group(2)), name)
            if won == name:
                continue  # not committed (or expired), or the batch's own directory
            d = root / name
            if not d.is_dir() or now - d.stat().st_mtime < grace:
                continue
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
        if gone:
            log.info("pipeline %r: swept %d orphan staging dirs", pipeline, len(gone))
        return gone


def _rebuild_iceberg(
    cls: type[IcebergSink],
    catalog: tuple[Any, str, dict[str, str]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> IcebergSink:
    catalog_cls, name, properties = catalog
    return cls(catalog_cls(name, **properties), *args, **kwargs)


def committed_dirs(table: Any, pipeline: str) -> dict[int, str | None]:
    """seq -> the staging directory its snapshot added (None: the Arrow route), for the
    committed batches whose snapshots are still in the table's history."""
    from sparkonce.ledger.iceberg import history, key

    entry, staged = key(pipeline, "entry"), key(pipeline, "staged")
    found: dict[int, str | None] = {}
    for snap in history(table):
        summary = snap.summary
        text = summary[entry] if summary is not None else None
        if summary is not None and text:
            found.setdefault(int(json.loads(text)["seq"]), summary[staged])
    return found


class IcebergSink(TransactionalSink):
    """Effectively-once sink into an Apache Iceberg table (see the module docstring)."""

    guarantee: ClassVar[Guarantee] = "effectively-once"
    store: IcebergLedgerStore
    stager: IcebergStager

    def __init__(
        self,
        catalog: Any,
        table: str,
        *,
        mode: WriteMode = "append",
        keys: tuple[str, ...] | list[str] = (),
        latest_by: str | tuple[str, ...] | list[str] | None = None,
        orphan_grace_seconds: float = ORPHAN_GRACE_SECONDS,
        keep_snapshots: int | None = KEEP_SNAPSHOTS,
    ) -> None:
        self.mode: WriteMode
        self.mode, self.keys = check_write_mode(mode, keys)
        if latest_by is None:
            latest_by = ()
        elif isinstance(latest_by, str):
            latest_by = (latest_by,)  # one column, as the latest_by="col"
        self.latest_by = _check_latest_by(latest_by, self.mode, self.keys)
        if not table or "." not in table:
            raise ConfigError(f"IcebergSink needs the table as 'namespace.name', got {table!r}.")
        if orphan_grace_seconds < 0:
            raise ConfigError(
                f"IcebergSink orphan_grace_seconds must be >= 0, got {orphan_grace_seconds}."
            )
        if keep_snapshots is not None and not is_count(keep_snapshots):
            raise ConfigError(
                f"IcebergSink keep_snapshots must be a whole number >= 1 (the newest snapshots "
                f"each batch commit keeps) or None (keep every snapshot), got {keep_snapshots!r}."
            )
        self.catalog = catalog
        self.table = table
        self.store = IcebergLedgerStore(catalog, table, keep_snapshots=keep_snapshots)
        self.stager = IcebergStager(self.store, orphan_grace_seconds, self.keys, self.latest_by)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles as the call that built it (as every sink does), with the catalog as the
        call that builds *it*: its class, name and properties. A catalog object holds
        connections (a SQL catalog's engine) that do not pickle; a Spark Connect batch
        function carries the sink to the server's Python worker, which opens its own."""
        args, kwargs = self._built_with
        kwargs = dict(kwargs)
        # The catalog came first, or by name.
        rest = args if kwargs.pop("catalog", None) is not None else args[1:]
        cat = self.catalog
        ref = (type(cat), cat.name, dict(getattr(cat, "properties", {})))
        return (_rebuild_iceberg, (type(self), ref, rest, kwargs))

    def validate(self, schema: StructType, output_mode: OutputMode = "append") -> None:
        """Before the epoch: check (or, for a new table, take) the output schema, and that
        Spark's tasks can write the table's data files (a local, unpartitioned table)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        if output_mode == "complete":
            raise ConfigError(
                f"IcebergSink {self.mode}s: Spark's 'complete' output mode (every batch "
                "replaces the table) is not supported. Use output_mode='append' or 'update'."
            )
        self._check_upsert_columns(schema)
        import pyarrow as pa

        # Spark writes every column of a Parquet file as optional (nullable), whatever the
        # DataFrame says, and Iceberg adds no optional data to a required column: a new
        # table gets optional columns, an existing one must have them.
        # Spark's TimestampType is an instant: Iceberg's timestamptz, read back as UTC.
        arrow = to_arrow_schema(schema, timezone="UTC")
        self.validate_arrow(pa.schema([f.with_nullable(True) for f in arrow]))
        target = self.store.load()
        local_location(target, self.describe())
        required = [f.name for f in target.schema().fields if f.required]
        if required:
            raise ConfigError(
                f"{self.describe()} has required (NOT NULL) columns {required}: Spark writes "
                "every column of its Parquet files as optional, and Iceberg cannot add those "
                "files to a required column. Make the columns optional (PyIceberg: "
                "table.update_schema().make_column_optional(name)), or use a new table."
            )
        if not target.spec().is_unpartitioned():
            raise ConfigError(
                f"{self.describe()} is partitioned ({target.spec()}): Spark's tasks write "
                "unpartitioned files, and IcebergSink adds them as they are. Use an "
                "unpartitioned table."
            )

    def _check_upsert_columns(self, schema: StructType) -> None:
        """Keys and ``latest_by`` columns: in the output, of a type Spark can group, join
        and order (the table's columns are the output's: :func:`check_schema`)."""
        from pyspark.sql import types as T

        names = [f.name for f in schema.fields]
        for what, cols in (("upsert keys", self.keys), ("latest_by columns", self.latest_by)):
            missing = [c for c in cols if c not in names]
            if missing:
                raise ConfigError(
                    f"{what} {missing} are not columns of the pipeline's output "
                    f"(columns: {names}); fix {'keys' if what == 'upsert keys' else 'latest_by'}"
                    "=[...] or the transform"
                )
        types = {f.name: f.dataType for f in schema.fields}
        unordered = (T.ArrayType, T.MapType, T.StructType, T.VariantType)
        for c in self.latest_by:
            if isinstance(types[c], unordered):
                raise ConfigError(
                    f"latest_by column {c!r} is {types[c].simpleString()}, which has no order "
                    "to pick the latest row by; use a number, string, date or timestamp column "
                    "(for a change stream, the source's 'partition' and 'offset')"
                )
        for k in self.keys:
            if isinstance(types[k], (*unordered, T.FloatType, T.DoubleType)):
                raise ConfigError(
                    f"upsert key {k!r} is {types[k].simpleString()}: keys are matched by "
                    "equality, which such values do not support reliably; use an integer, "
                    "string, decimal, date, timestamp or binary key column"
                )

    def sweep_orphans(self, pipeline: str, grace_seconds: float | None = None) -> list[Path]:
        """Delete ``pipeline``'s staging directories no snapshot references (see
        :meth:`IcebergStager.sweep`, which runs after a commit, at most once a minute); return
        them."""
        return self.stager.sweep(pipeline, grace_seconds=grace_seconds)

    def validate_arrow(self, schema: pa.Schema) -> None:
        """:meth:`validate` for an Arrow schema: a ConfigError names the column."""
        if self.store.schema is None:
            self.store.schema = schema
        target = self.store.load()
        check_schema(schema, target.schema().as_arrow(), self.describe())

    def describe(self) -> str:
        mode = f" mode=upsert keys={list(self.keys)}" if self.keys else ""
        latest = f" latest_by={list(self.latest_by)}" if self.latest_by else ""
        # Where the catalog is (its database, password masked): two test catalogs of a
        # verify campaign share a catalog name and a table name.
        uri = getattr(self.catalog, "properties", {}).get("uri")
        at = f" at {mask_url(uri)}" if isinstance(uri, str) else ""
        return (
            f"IcebergSink({self.store.describe()} in catalog {self.catalog.name!r}{at}"
            f"{mode}{latest})"
        )
