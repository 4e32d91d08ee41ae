"""The codec of a ledger entry: what every ledger stores per committed batch.

One :class:`~sparkonce.ledger.base.LedgerEntry` is stored three ways, each read and
written only here:

* **Kafka ledger topic** (:data:`KAFKA_ENTRY`): a JSON batch record, with the row count
  under ``rows`` and the commit time under ``at``;
* **Delta entry file** (:data:`DELTA_ENTRY`): a JSON file, with the commit time under
  ``committed_at`` and no row count (it is read from the ``.rows`` file beside it);
* **Iceberg table property and snapshot summary** (:data:`ICEBERG_ENTRY`): JSON text,
  with the row count under ``rows`` and the commit time under ``committed_at``;
* **SQL ledger row** (:func:`entry_from_row`, :data:`SQL_COLUMNS`): one row of
  ``sparkonce_ledger``, the ranges as JSON text.

Each carries :data:`ENTRY_VERSION` under ``version`` (the SQL row in a ``version``
column). Entries written before that (no version) are version 1: the same fields. An
entry of a newer version raises :class:`~sparkonce.errors.RecordVersionError` (see
:mod:`sparkonce.records`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sparkonce.ledger.base import LedgerEntry
from sparkonce.offsets import BatchRanges
from sparkonce.records import VERSION_KEY, check_version, record_version

ENTRY_VERSION = 1
NEWER_ENTRY = (
    "run this pipeline with a sparkonce at least as new as the one that wrote the entry "
    "(a run that cannot read its ledger must not commit to it)"
)


@dataclass(frozen=True)
class EntryCodec:
    """A ledger entry as one JSON object: the keys one store uses (see the module
    docstring). ``store`` names the store in error messages."""

    store: str
    time_key: str  # the commit time (ISO 8601)
    rows_key: str | None  # the row count, None when the store keeps it elsewhere

    def encode(self, entry: LedgerEntry) -> dict[str, Any]:
        doc: dict[str, Any] = {
            VERSION_KEY: ENTRY_VERSION,
            "pipeline": entry.pipeline,
            "seq": entry.seq,
            "ranges": entry.ranges.to_json_obj(),
            "epoch": entry.epoch,
        }
        if self.rows_key is not None:
            doc[self.rows_key] = entry.row_count
        doc.update(
            {
                "spark_batch_id": entry.spark_batch_id,
                "checkpoint_id": entry.checkpoint_id,
                "stateful": entry.stateful,
                "commit_seconds": entry.commit_seconds,
                self.time_key: entry.committed_at.isoformat(),
            }
        )
        return doc

    def decode(
        self, pipeline: str, data: dict[str, Any], *, where: str = "", rows: int | None = None
    ) -> LedgerEntry:
        """The entry ``data`` holds, of ``pipeline``. ``rows``: the row count, for a store
        that keeps it outside the record; ``where`` names the record (file, offset)."""
        what = f"ledger entry of pipeline {pipeline!r} in {self.store}" + (
            f" ({where})" if where else ""
        )
        record_version(data, ENTRY_VERSION, what, NEWER_ENTRY)
        if rows is None:
            assert self.rows_key is not None, f"{self.store} keeps the row count elsewhere"
            rows = int(data[self.rows_key])
        return LedgerEntry(
            pipeline,
            int(data["seq"]),
            BatchRanges.from_json_obj(data["ranges"]),
            int(data["epoch"]),
            rows,
            datetime.fromisoformat(data[self.time_key]),
            data.get("spark_batch_id"),
            data.get("checkpoint_id"),
            data.get("stateful"),
            data.get("commit_seconds"),
        )


KAFKA_ENTRY = EntryCodec("the Kafka ledger topic", time_key="at", rows_key="rows")
DELTA_ENTRY = EntryCodec("the Delta table's ledger", time_key="committed_at", rows_key=None)
ICEBERG_ENTRY = EntryCodec("the Iceberg table's ledger", time_key="committed_at", rows_key="rows")

# A SQL ledger row's columns, in the order entry_from_row reads them.
SQL_COLUMNS = (
    "seq, ranges, epoch, row_count, committed_at, spark_batch_id, checkpoint_id, stateful, "
    "commit_seconds, version"
)


def entry_from_row(pipeline: str, row: Any, table: str) -> LedgerEntry:
    """The entry of a SQL ledger row (its :data:`SQL_COLUMNS`, ``committed_at`` a datetime
    or ISO text) read from ``table``."""
    check_version(
        row[9],
        ENTRY_VERSION,
        f"ledger entry {int(row[0])} of pipeline {pipeline!r} in table {table}",
        NEWER_ENTRY,
    )
    at = row[4]
    return LedgerEntry(
        pipeline=pipeline,
        seq=int(row[0]),
        ranges=BatchRanges.from_json(row[1]),
        epoch=int(row[2]),
        row_count=int(row[3]),
        committed_at=at if isinstance(at, datetime) else datetime.fromisoformat(str(at)),
        spark_batch_id=None if row[5] is None else int(row[5]),
        checkpoint_id=row[6],
        stateful=None if row[7] is None else bool(row[7]),
        commit_seconds=None if row[8] is None else float(row[8]),
    )
