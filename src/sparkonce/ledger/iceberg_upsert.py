"""Upsert by keys into an Iceberg table, as one copy-on-write snapshot (PyIceberg 0.12).

**Why copy-on-write.** PyIceberg 0.12 writes no delete files: ``Transaction.delete`` and
``overwrite`` warn "Merge on read is not yet supported, falling back to copy-on-write"
when a table asks for merge-on-read, and rewrite every data file that holds a matching row.
Its own ``Table.upsert`` does the same, and commits up to three snapshots in one
transaction (a delete, an overwrite of the rewritten files, an append of new rows). The
sink instead builds **one** ``OVERWRITE`` snapshot with PyIceberg's snapshot producer
(:func:`add_upsert`): it removes each data file that holds a key of the batch, adds that
file's surviving rows as a new file, and adds the batch's files; the ledger entry is in
that one snapshot's summary, so the resume point and the orphan sweep read it exactly as
for an append, and there is no intermediate snapshot for a reader or a crash to see.

**The cost, on the driver, inside the commit** (the merge must read the table as the
commit finds it, so it cannot move before the epoch check):

* the batch's key columns are read from its staged files (``keys`` columns only; the rows
  were reduced to one per key by Spark's tasks already);
* the table's file list is planned from its manifests (grows with the number of live data
  files, not rows), and files are pruned by their per-column lower and upper bounds: a
  file none of whose key ranges holds a batch key is not opened;
* each remaining file's key columns are read and joined with the batch's keys; only files
  with a match are read whole, filtered, and written again (their surviving rows);
* so the work per batch is the size of the files that hold a batch key, plus the key
  columns of files whose bounds overlap the batch's keys. With random keys spread over
  the table that approaches the whole table per batch; with keys that cluster (time
  ordered ids, a table sorted by key) it is a few files. PyIceberg's own ``upsert`` reads
  the same files (its match filter is an ``IN`` list, which its metrics evaluator gives up
  on past 200 values).

The survivors' files are written into the batch's staging directory, so the orphan sweep
handles them as it handles the batch's own files (a lost attempt's directory goes whole).
"""

from __future__ import annotations

import bisect
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

#: Key types whose Iceberg bounds decode to values comparable with the batch's own
#: (Python ints and strings); files are pruned by bounds only for these.
_BOUNDED = ("int", "long", "string")


def local_path(uri: str) -> Path:
    return Path(unquote(urlparse(uri).path))


def batch_keys(paths: tuple[str, ...], keys: tuple[str, ...]) -> pa.Table:
    """The key columns of the batch's staged files (one row per key: Spark reduced them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = [pq.read_table(local_path(p), columns=list(keys)) for p in paths]
    if not parts:
        return pa.table({k: pa.array([], pa.null()) for k in keys})
    return pa.concat_tables(parts, promote_options="permissive")


def _might_hold(
    task: Any, schema: Any, keys: tuple[str, ...], sorted_keys: dict[str, list]
) -> bool:
    """Whether ``task``'s file may hold one of the batch's keys, by its column bounds."""
    from pyiceberg.conversions import from_bytes

    for k in keys:
        values = sorted_keys.get(k)
        if values is None:
            continue  # a type without comparable bounds: no pruning by this column
        field = schema.find_field(k)
        lower = (task.file.lower_bounds or {}).get(field.field_id)
        upper = (task.file.upper_bounds or {}).get(field.field_id)
        if lower is None or upper is None:
            continue
        lo, hi = from_bytes(field.field_type, lower), from_bytes(field.field_type, upper)
        i = bisect.bisect_left(values, lo)
        if i == len(values) or values[i] > hi:
            return False  # no batch key in [lo, hi]: the file holds none of them
    return True


def add_upsert(
    txn: Any,
    paths: tuple[str, ...],
    keys: tuple[str, ...],
    summary: dict[str, str],
    workdir: Path,
) -> tuple[list[Path], int]:
    """Add the batch's files to PyIceberg transaction ``txn`` as one snapshot that replaces
    every existing row whose key is in the batch (see the module docstring).

    Returns the survivors' files written into ``workdir`` (the caller deletes them if the
    commit fails) and how many existing rows the batch replaced."""
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import ArrowScan, parquet_file_to_data_file
    from pyiceberg.table import DataScan, TableProperties

    meta = txn.table_metadata
    io = txn._table.io
    schema = meta.schema()
    if meta.name_mapping() is None:
        # As add_files does: Spark's files carry no Iceberg field ids, readers map by name.
        txn.set_properties(
            **{TableProperties.DEFAULT_NAME_MAPPING: schema.name_mapping.model_dump_json()}
        )
        meta = txn.table_metadata
    incoming = batch_keys(paths, keys)
    sorted_keys: dict[str, list] = {}
    for k in keys:
        if str(schema.find_field(k).field_type) in _BOUNDED:
            sorted_keys[k] = sorted(v for v in incoming.column(k).to_pylist() if v is not None)
    written: list[Path] = []
    replaced = 0
    with txn.update_snapshot(snapshot_properties=summary).overwrite() as snapshot:
        if incoming.num_rows and meta.current_snapshot() is not None:
            key_schema = schema.select(*keys)
            for task in DataScan(table_metadata=meta, io=io).plan_files():
                if not _might_hold(task, schema, keys, sorted_keys):
                    continue
                scan = ArrowScan(meta, io, key_schema, row_filter=_always_true())
                existing_keys = scan.to_table(tasks=[task])
                mine = incoming.cast(existing_keys.schema)
                hits = existing_keys.join(mine, list(keys), join_type="left semi").num_rows
                if hits == 0:
                    continue
                whole = ArrowScan(meta, io, schema, row_filter=_always_true()).to_table(
                    tasks=[task]
                )
                survivors = whole.join(mine, list(keys), join_type="left anti")
                replaced += whole.num_rows - survivors.num_rows
                snapshot.delete_data_file(task.file)
                if survivors.num_rows:
                    out = workdir / f"survivors-{uuid.uuid4().hex}.parquet"
                    pq.write_table(survivors.select(whole.column_names), out)
                    written.append(out)
                    snapshot.append_data_file(parquet_file_to_data_file(io, meta, out.as_uri()))
        for p in paths:
            snapshot.append_data_file(parquet_file_to_data_file(io, meta, p))
    return written, replaced


def _always_true() -> Any:
    from pyiceberg.expressions import AlwaysTrue

    return AlwaysTrue()
