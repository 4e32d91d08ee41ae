"""Stable batch output: a micro-batch's rows are written once, and every sink reads that copy.

This is Dataflow's checkpointed output (Beam's ``@RequiresStableInput``) on Spark
micro-batches. A pipeline that writes one batch to sinks in *different* stores commits
each sink on its own, with its own ledger. If the driver dies between two of those
commits, Spark replays the batch and recomputes its DataFrame; a transform that calls
``rand()``, ``uuid()``, ``current_timestamp()`` or an outside service would then hand the
sink that has not committed yet other rows than the one that has. So, before any sink
commits, :meth:`StableOutput.put` writes the batch's rows to local storage once, keyed by
the batch's identity (:class:`BatchKey`); every sink commits from the returned copy, a
replay gets the same copy back instead of recomputing, and :meth:`StableOutput.collect`
drops a copy once every sink's ledger covers its batch.

Layout under ``root`` (all on one local filesystem)::

    <root>/000000000007-1f2e3d4c5b6a7988/      a committed copy (BatchKey.dirname)
        manifest.json                           key, rows, schema, writer, tables, files, ...
        data/part-*.parquet                     Spark's Parquet files (put), or
        data/table-0000.arrow ...               one Arrow IPC file per output (put_tables)
    <root>/.tmp-<dirname>-<uuid>/               a copy being written (never read)
    <root>/.trash-<dirname>-<uuid>/             a copy being deleted (never read)

Publication is atomic: Spark writes into a temp directory beside the final one, the
files are flushed to disk, the manifest is written last, and one ``os.rename`` gives the
directory its final name. A final directory without ``manifest.json`` (which only a
crash or a hand edit can leave) is never read: :meth:`StableOutput.get` returns None for
it and :meth:`StableOutput.put` removes it and writes again.

Two writers: :meth:`StableOutput.put` has Spark's tasks write Parquet files and returns a
DataFrame reading them; :meth:`StableOutput.put_tables`, for sinks that collect their rows
on the driver anyway, writes the rows they collected (one Arrow table per output) to Arrow
IPC files and returns the tables, with no Spark write or read-back. The manifest's
``writer`` says which (``"spark"`` or ``"arrow"``), and ``tables`` names the IPC file of
each output.

Everything here runs on the **driver**, except the Spark tasks that :meth:`~StableOutput.put`
starts.
Only local filesystem paths are supported in this version (checkpoints are local
directories): a ``root`` URI with a scheme other than ``file://`` is a
:class:`~sparkonce.errors.ConfigError`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from sparkonce.errors import CheckpointError, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
DATA = "data"
FORMAT = 1
# The column a partitioned copy is partitioned by: the partition column's value as a
# string. The real column stays in the data files, so its values and type round-trip
# exactly (Spark would read an empty-string partition value back as null, and re-type
# partition values from their directory names); this one only groups the files.
PARTITION_COLUMN = "sparkonce_partition"
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
# Spark expands these in a path it reads (Hadoop glob syntax), so a root holding them
# would read other directories than the copy's.
_GLOB_CHARS = frozenset("*?[]{}\\")


@dataclass(frozen=True)
class BatchKey:
    """The identity of one micro-batch's output: which checkpoint, which batch, which input.

    ``ranges_json`` is the batch's offset ranges as canonical JSON
    (:meth:`sparkonce.offsets.BatchRanges.to_json`, say). A replay of a batch has the
    same key, so it finds the copy its first attempt wrote.
    """

    checkpoint_id: str
    spark_batch_id: int
    ranges_json: str

    def __post_init__(self) -> None:
        if self.spark_batch_id < 0:
            raise ConfigError(
                f"BatchKey: spark_batch_id must be >= 0, got {self.spark_batch_id}; "
                "pass the batch id Spark gave foreachBatch"
            )

    @property
    def dirname(self) -> str:
        """The copy's directory name: the zero-padded batch id, then a hash of the rest.

        Names sort in batch order. The manifest keeps the whole key, so :meth:`StableOutput.get`
        can tell a hash collision from the copy it looks for.
        """
        digest = hashlib.sha256((self.checkpoint_id + self.ranges_json).encode()).hexdigest()
        return f"{self.spark_batch_id:012d}-{digest[:16]}"

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "spark_batch_id": self.spark_batch_id,
            "ranges_json": self.ranges_json,
        }


class StableOutput:
    """Write-once copies of micro-batch outputs under ``root`` (driver side).

    ``root`` is a local directory, typically ``<checkpoint>/sparkonce/stable``, given as a
    path or a ``file://`` URI. Any other scheme (``hdfs://``, ``s3a://``...) raises
    :class:`~sparkonce.errors.ConfigError`: only local filesystem paths are supported in
    this version, because atomic publication relies on ``os.rename`` within one local
    filesystem. The directory is created on first write.

    The copy keeps the batch's column names, order, types and field metadata, and its rows
    exactly. One difference: Spark reads Parquet files back with every column nullable, so
    a column declared non-nullable in the batch is nullable in the copy (its values are the
    same).

    One ``StableOutput`` per checkpoint and one driver writing at a time is the expected
    use; two drivers putting the same key concurrently still leave one copy (the second
    rename fails and that writer reads the winner's copy).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = _local_root(root)

    # -- reading ------------------------------------------------------------------------------

    def get(self, spark: SparkSession, key: BatchKey) -> DataFrame | None:
        """The committed copy of ``key``'s batch as a DataFrame, or None if there is none.

        None also for a directory without a manifest (a write that crashed before its
        rename, or a hand-made directory): it is not a copy. A copy whose manifest cannot
        be read, names another key, lacks its schema, or whose data files are missing or
        have changed size raises :class:`~sparkonce.errors.CheckpointError` naming the path:
        the batch must not be silently recomputed, since a sink may already hold its rows.
        """
        final = self.root / key.dirname
        manifest = self._committed_manifest(final, key)
        if manifest is None:
            return None
        if manifest.get("writer") == "arrow":
            raise CheckpointError(
                f"stable output {final} holds per-output Arrow tables (written on the driver, "
                "as sinks that collect their rows there get them); read it with get_tables"
            )
        return _read_copy(spark, final, manifest)

    def _committed_manifest(self, final: Path, key: BatchKey) -> dict[str, Any] | None:
        if not final.is_dir():
            return None
        if not (final / MANIFEST).exists():
            log.warning("stable output %s has no manifest (an interrupted write): ignored", final)
            return None
        manifest = _read_manifest(final)
        if manifest["key"] != key.to_json_obj():
            raise CheckpointError(
                f"stable output {final} belongs to batch {manifest['key']}, not to {key}. "
                "Two keys share a directory name; move the directory away and rerun."
            )
        _check_files(final, manifest)
        return manifest

    def keys(self) -> list[BatchKey]:
        """The keys of every committed copy under ``root``, in batch order.

        Directories without a manifest are skipped; a copy whose manifest cannot be read
        raises :class:`~sparkonce.errors.CheckpointError` naming its path.
        """
        found: list[BatchKey] = []
        for final in self._copy_dirs():
            if not (final / MANIFEST).exists():
                continue
            found.append(_key_of(_read_manifest(final)))
        return sorted(found, key=lambda k: (k.spark_batch_id, k.dirname))

    # -- writing ------------------------------------------------------------------------------

    def put(self, df: DataFrame, key: BatchKey, *, partition_by: str | None = None) -> DataFrame:
        """Write ``df`` as ``key``'s copy unless a committed copy exists; return the copy.

        If :meth:`get` finds a committed copy (a replay), ``df`` is not executed at all and
        that copy is returned. Otherwise leftovers of an interrupted write of the same key
        are removed, ``df`` is written once to Parquet (a single Spark action: the write;
        the manifest's row count comes from the written files' footers, not from a second
        pass over ``df``), published atomically, and read back.

        **Use the returned DataFrame, never ``df``, afterwards**: every further action on
        ``df`` recomputes it, with new values for any non-deterministic expression. The
        returned DataFrame reads the copy's files, so it stays valid until
        :meth:`collect` deletes the copy.

        ``partition_by`` names a column of ``df`` whose values group the files (one
        directory per value, under :data:`PARTITION_COLUMN`); reading back gives the same
        columns in the same order and the same rows. Only atomic columns can be used
        (not array, map, struct or binary). An empty ``df`` still gets a copy: zero rows,
        ``df``'s schema.
        """
        spark = df.sparkSession
        existing = self.get(spark, key)
        if existing is not None:
            log.info("stable output %s exists (a replay): read back, not recomputed", key.dirname)
            return existing
        if partition_by is not None:
            _check_partition_column(df, partition_by)

        def write(data: Path) -> int:
            writer = df
            if partition_by is not None:
                from pyspark.sql import functions as F

                writer = df.withColumn(
                    PARTITION_COLUMN, F.col(_quoted(partition_by)).cast("string")
                )
            w = writer.write.mode("errorifexists")
            if partition_by is not None:
                w = w.partitionBy(PARTITION_COLUMN)
            w.parquet(str(data))
            return _footer_rows(data, _data_files(data))

        manifest = self._publish(key, df.schema, write, partition_by=partition_by, writer="spark")
        if manifest is None:  # another writer published the same key first: its copy wins
            winner = self.get(spark, key)
            assert winner is not None
            return winner
        return _read_copy(spark, self.root / key.dirname, manifest)

    def put_tables(
        self, key: BatchKey, schema: StructType, collect: Callable[[], Mapping[str, pa.Table]]
    ) -> dict[str, pa.Table]:
        """Like :meth:`put`, for rows collected on the driver: ``collect()`` returns the
        batch's rows as named Arrow tables (one per output), each written to an Arrow IPC
        file; returns the tables.

        A replay (a committed copy exists) reads the copy back instead, without calling
        ``collect``. The tables the first attempt returns and those a replay reads hold
        the same names, columns, types and values. ``schema`` is recorded in the manifest
        (the batch's DataFrame schema). :meth:`get_tables` reads the copy back.
        """
        existing = self.get_tables(key)
        if existing is not None:
            log.info("stable output %s exists (a replay): read back, not recomputed", key.dirname)
            return existing
        tables = dict(collect())

        def write(data: Path) -> int:
            import pyarrow as pa

            data.mkdir()
            for i, table in enumerate(tables.values()):
                path = str(data / _table_file(i))
                with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
                    w.write_table(table)
            return sum(t.num_rows for t in tables.values())

        names = {name: _table_file(i) for i, name in enumerate(tables)}
        manifest = self._publish(
            key, schema, write, partition_by=None, writer="arrow", tables=names
        )
        if manifest is None:  # another writer published the same key first: its copy wins
            winner = self.get_tables(key)
            assert winner is not None
            return winner
        return tables

    def get_tables(self, key: BatchKey) -> dict[str, pa.Table] | None:
        """The committed copy of ``key``'s batch written by :meth:`put_tables`, or None.

        The same checks as :meth:`get`. A copy written by :meth:`put` (Spark's writer) is
        not read here: :meth:`is_spark_copy` tells it apart, and :meth:`get` reads it.
        """
        import pyarrow as pa

        final = self.root / key.dirname
        manifest = self._committed_manifest(final, key)
        if manifest is None or manifest.get("writer") != "arrow":
            return None
        tables: dict[str, pa.Table] = {}
        for name, file in manifest["tables"].items():
            with pa.memory_map(str(final / DATA / file)) as source:
                tables[name] = pa.ipc.open_file(source).read_all()
        return tables

    def copy_writer(self, key: BatchKey) -> str | None:
        """Which writer made ``key``'s committed copy ("spark" or "arrow"), or None."""
        final = self.root / key.dirname
        manifest = self._committed_manifest(final, key)
        return None if manifest is None else str(manifest.get("writer", "spark"))

    def _publish(
        self,
        key: BatchKey,
        schema: StructType,
        write: Callable[[Path], int],
        *,
        partition_by: str | None,
        writer: str,
        tables: Mapping[str, str] | None = None,
    ) -> dict[str, Any] | None:
        """Write a copy into a temp directory with ``write(data_dir) -> rows``, then publish
        it atomically. Returns its manifest, or None if another writer published first."""
        final = self.root / key.dirname
        self._remove_leftovers(key)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"{_TMP_PREFIX}{key.dirname}-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        start = time.monotonic()
        try:
            rows = write(tmp / DATA)
            manifest = {
                "format": FORMAT,
                "key": key.to_json_obj(),
                "dirname": key.dirname,
                "rows": rows,
                "schema": json.loads(schema.json()),
                "partition_by": partition_by,
                "writer": writer,
                "tables": dict(tables or {}),
                "files": _data_files(tmp / DATA),
                "created_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            }
            _fsync_tree(tmp / DATA)
            _write_json_durably(tmp / MANIFEST, manifest)
            _fsync_dir(tmp)
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / MANIFEST).exists():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
                log.warning("stable output %s was published by another writer first", final)
                return None
            _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info(
            "stable output %s written: %d rows in %.2f s",
            final,
            manifest["rows"],
            time.monotonic() - start,
        )
        return manifest

    # -- collecting ---------------------------------------------------------------------------

    def collect(self, covered: Callable[[BatchKey], bool]) -> int:
        """Delete every copy whose batch ``covered`` says all sinks have committed.

        ``covered(key)`` must return True only when every sink's ledger covers the batch.
        A copy is first renamed to a ``.trash-`` name (so a crash mid-delete never leaves a
        half-deleted copy that still has a manifest), then removed; trash left by an earlier
        crash is removed too. Returns how many copies were deleted. DataFrames read from a
        deleted copy fail on their next action.
        """
        start = time.monotonic()
        for trash in self._hidden_dirs(_TRASH_PREFIX):
            shutil.rmtree(trash, ignore_errors=True)
        deleted = 0
        for key in self.keys():
            if not covered(key):
                continue
            t0 = time.monotonic()
            final = self.root / key.dirname
            rows = _read_manifest(final)["rows"]
            trash = self.root / f"{_TRASH_PREFIX}{key.dirname}-{uuid.uuid4().hex[:12]}"
            os.rename(final, trash)
            shutil.rmtree(trash)
            deleted += 1
            log.debug(
                "stable output %s collected: %d rows in %.2f s",
                final,
                rows,
                time.monotonic() - t0,
            )
        log.debug(
            "stable output collection under %s: %d copies deleted in %.2f s",
            self.root,
            deleted,
            time.monotonic() - start,
        )
        return deleted

    # -- internals ----------------------------------------------------------------------------

    def _copy_dirs(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def _hidden_dirs(self, prefix: str) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in self.root.iterdir() if p.is_dir() and p.name.startswith(prefix)]

    def _remove_leftovers(self, key: BatchKey) -> None:
        """Remove a manifest-less final directory and temp directories of ``key``."""
        final = self.root / key.dirname
        leftovers = [final] if final.exists() else []
        leftovers += self._hidden_dirs(f"{_TMP_PREFIX}{key.dirname}-")
        for path in leftovers:
            log.warning("stable output: removing %s left by an interrupted write", path)
            shutil.rmtree(path)


def _local_root(root: str | Path) -> Path:
    if isinstance(root, str):
        parsed = urlparse(root)
        if parsed.scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise ConfigError(
                    f"stable output root {root!r} names host {parsed.netloc!r}; "
                    "use file:///absolute/path or a plain local path"
                )
            root = unquote(parsed.path)
        elif len(parsed.scheme) > 1:  # one letter would be a Windows drive
            raise ConfigError(
                f"stable output root {root!r} has scheme {parsed.scheme!r}, but only local "
                "filesystem paths (or file:// URIs) are supported in this version; "
                "put the stable outputs under the local checkpoint directory"
            )
    path = Path(root).absolute()
    bad = sorted(_GLOB_CHARS & set(str(path)))
    if bad:
        raise ConfigError(
            f"stable output root {str(path)!r} contains {''.join(bad)!r}, which Spark reads as "
            "glob patterns; choose a directory without these characters"
        )
    return path


def _table_file(index: int) -> str:
    return f"table-{index:04d}.arrow"


def _quoted(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


def _check_partition_column(df: DataFrame, column: str) -> None:
    from pyspark.sql.types import ArrayType, BinaryType, MapType, StructType

    fields = {f.name: f for f in df.schema.fields}
    if column not in fields:
        raise ConfigError(
            f"partition_by={column!r} is not a column of the batch; its columns are {list(fields)}"
        )
    if PARTITION_COLUMN in fields:
        raise ConfigError(
            f"the batch has a column named {PARTITION_COLUMN!r}, which stable output uses to "
            "partition its files; rename that column or leave partition_by unset"
        )
    if isinstance(fields[column].dataType, ArrayType | MapType | StructType | BinaryType):
        raise ConfigError(
            f"partition_by={column!r} has type {fields[column].dataType.simpleString()}; "
            "partition by an atomic column (a string or number tag)"
        )


def _data_files(data: Path) -> dict[str, int]:
    """The Parquet files under ``data`` (relative path -> size), hidden files excluded."""
    return {
        path.relative_to(data).as_posix(): path.stat().st_size
        for path in sorted(data.rglob("*"))
        if path.is_file() and not path.name.startswith(("_", "."))
    }


def _footer_rows(data: Path, files: dict[str, int]) -> int:
    """Sum the row counts in the files' Parquet footers (no Spark job, no row read)."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(data / rel).num_rows for rel in files)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_durably(path: Path, obj: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())


def _read_manifest(final: Path) -> dict[str, Any]:
    """The manifest of a committed copy, checked for shape; CheckpointError if unusable."""
    path = final / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')!r}, expected {FORMAT}")
        _key_of(manifest)
        _schema_of(manifest)
        if not isinstance(manifest.get("rows"), int) or not isinstance(manifest.get("files"), dict):
            raise ValueError("rows or files missing")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(
            f"stable output manifest {path} is corrupt ({exc}). The batch's copy cannot be "
            "trusted and is not recomputed, since a sink may already hold its rows: check "
            "which sinks cover this batch before removing the directory by hand."
        ) from exc
    return manifest


def _key_of(manifest: dict[str, Any]) -> BatchKey:
    key = manifest["key"]
    if not (
        isinstance(key, dict)
        and isinstance(key.get("checkpoint_id"), str)
        and isinstance(key.get("spark_batch_id"), int)
        and isinstance(key.get("ranges_json"), str)
    ):
        raise ValueError(f"bad key {key!r}")
    return BatchKey(key["checkpoint_id"], key["spark_batch_id"], key["ranges_json"])


def _schema_of(manifest: dict[str, Any]) -> StructType:
    from pyspark.sql.types import StructType

    schema = manifest.get("schema")
    if not isinstance(schema, dict):
        raise ValueError("schema missing")
    return StructType.fromJson(schema)


def _check_files(final: Path, manifest: dict[str, Any]) -> None:
    data = final / DATA
    if not data.is_dir():
        raise CheckpointError(
            f"stable output {final} has a manifest but no {DATA}/ directory. The copy is "
            "damaged and is not recomputed, since a sink may already hold its rows: check "
            "which sinks cover this batch before removing it by hand."
        )
    for rel, size in manifest["files"].items():
        path = data / rel
        actual = path.stat().st_size if path.is_file() else None
        if actual != size:
            raise CheckpointError(
                f"stable output {final}: data file {rel} is "
                + ("missing" if actual is None else f"{actual} bytes, expected {size}")
                + ". The copy is damaged and is not recomputed, since a sink may already "
                "hold its rows: check which sinks cover this batch before removing it by hand."
            )


def _read_copy(spark: SparkSession, final: Path, manifest: dict[str, Any]) -> DataFrame:
    """Read the copy's Parquet files with its recorded schema and column order."""
    from pyspark.sql.types import StringType, StructField, StructType

    schema = _schema_of(manifest)
    read_schema = schema
    if manifest.get("partition_by") is not None:
        # The grouping column is read too (Spark needs it to list the partition
        # directories), then dropped by the select below.
        read_schema = StructType([*schema.fields, StructField(PARTITION_COLUMN, StringType())])
    copy = (
        spark.read.schema(read_schema)
        .option("ignoreCorruptFiles", "false")
        .option("ignoreMissingFiles", "false")
        .parquet(str(final / DATA))
    )
    return copy.select(*[_quoted(name) for name in schema.fieldNames()])
