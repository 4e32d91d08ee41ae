"""The Iceberg inspector (what ``sparkonce verify`` reads, resets and counts), and a verify
trial's final check of an Iceberg table by its second reader, DuckDB. No Spark: the table
is written with PyIceberg through the ledger store's Arrow route."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from sparkonce.errors import ConfigError
from sparkonce.ledger.base import LedgerEntry
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks.iceberg import IcebergSink, staging_root
from sparkonce.sinks.inspect import IcebergInspector, inspector_for
from sparkonce.verify.model import Fault, Oracle, TrialOutcome
from tests.iceberg.readers import duckdb_rows, pyiceberg_rows

PIPE = "inspected"
SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])


def catalog(tmp_path: Path) -> SqlCatalog:
    return SqlCatalog("c", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")


def batch(
    sink: IcebergSink, seq: int, start: int, end: int, ids: range | None = None, epoch: int = 1
) -> None:
    """Batch ``seq`` (offsets start..end) committed as a run would: one row per offset, or
    the rows of ``ids``."""
    ids = range(start, end) if ids is None else ids
    store = sink.store
    ranges = BatchRanges((OffsetRange("events", 0, start, end),))
    e = LedgerEntry(PIPE, seq, ranges, epoch, end - start, datetime.now(UTC), seq)
    with store.transaction() as txn:
        store.check_owner(txn, PIPE, epoch)
        store.record(txn, e)
        txn.data = pa.table(
            {"id": list(ids), "key": [f"k{i % 3}" for i in ids]},
            schema=SCHEMA,
        )


def committed_sink(tmp_path: Path, cat: SqlCatalog | None = None) -> IcebergSink:
    """Two batches (12 rows) of ``PIPE`` in ``lake.events``, in ``cat`` (default: the
    catalog ``c`` under ``tmp_path``)."""
    sink = IcebergSink(catalog(tmp_path) if cat is None else cat, "lake.events")
    sink.store.schema = SCHEMA
    sink.store.acquire(PIPE)
    batch(sink, 0, 0, 5)
    batch(sink, 1, 5, 12)
    return sink


def test_the_inspector_reads_counts_orphans_and_resets_the_table(tmp_path: Path) -> None:
    sink = committed_sink(tmp_path)
    inspector = inspector_for(sink, fresh=True)
    assert isinstance(inspector, IcebergInspector)
    assert inspector.sink is not sink and inspector.sink.catalog is not sink.catalog
    with inspector:
        want = sorted((i, f"k{i % 3}") for i in range(12))
        # Both of its readers against the tests' own (tests/iceberg/readers.py).
        assert sorted((r["id"], r["key"]) for r in inspector.rows()) == want
        assert sorted((r["id"], r["key"]) for r in inspector.duckdb_rows()) == want
        assert pyiceberg_rows(sink.catalog, "lake.events", ["id", "key"]) == want
        assert duckdb_rows(sink.catalog, "lake.events", ["id", "key"]) == want
        assert [e.seq for e in inspector.ledger(PIPE)] == [0, 1]
        owner = inspector.owner(PIPE)
        assert owner is not None and owner.epoch == 1

        # Staging directories no snapshot added: a crashed attempt of batch 1 and one of
        # a batch never committed; the Arrow route's batches add none of their own.
        table = sink.store.load()
        root = staging_root(table, PIPE, sink.describe())
        for name, files in (("1-1-" + "a" * 32, 2), ("1-2-" + "b" * 32, 1)):
            (root / name).mkdir(parents=True)
            for i in range(files):
                (root / name / f"part-{i}.parquet").write_bytes(b"x")
        assert inspector.leftovers(PIPE) == {"orphan_dirs": 2, "orphan_files": 3}

        location = Path(table.location().removeprefix("file://"))
        assert location.is_dir()
        with pytest.raises(ConfigError, match="output=True"):
            inspector.reset(PIPE, output=False)
        inspector.reset(PIPE)
        assert not location.exists()  # rows, metadata and staging directories
        assert inspector.rows() == [] and inspector.duckdb_rows() == []
        assert inspector.ledger(PIPE) == [] and inspector.owner(PIPE) is None
        assert inspector.leftovers(PIPE) == {"orphan_dirs": 0, "orphan_files": 0}
        inspector.reset(PIPE)  # no table: nothing to do
    with pytest.raises(ConfigError, match="moves only to another Iceberg catalog"):
        inspector.relocated("sqlite:///elsewhere.db")


_PIPELINE = """
from pyiceberg.catalog.sql import SqlCatalog
from sparkonce import EmbeddedLogSource, IcebergSink, Pipeline

catalog = SqlCatalog("c", uri="sqlite:///{root}/cat.db", warehouse="file://{root}/wh")
pipeline = Pipeline(
    name={pipe!r},
    source=EmbeddedLogSource("{root}/log", "events"),
    transform=lambda df: df,
    sink=IcebergSink(catalog, "lake.events"),
    checkpoint="{root}/checkpoint",
)
"""


def test_a_trial_fails_when_duckdb_sees_a_duplicate_that_the_inspector_hides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify's final check reads an Iceberg table twice: the inspector's PyIceberg scan
    (sparkonce code) and DuckDB's iceberg_scan (no sparkonce code). Here the table holds
    batch 1 twice; a PyIceberg read made to show the oracle's rows does not hide it."""
    from sparkonce.verify import Campaign

    file = tmp_path / "pipeline.py"
    file.write_text(_PIPELINE.format(root=tmp_path, pipe=PIPE))
    campaign = Campaign(file, workdir=tmp_path / "work", kinds=["zombie"], reference=False)
    try:
        sink = campaign.sinks["output"]
        assert isinstance(sink, IcebergSink)
        sink.store.schema = SCHEMA
        sink.store.acquire(PIPE)
        batch(sink, 0, 0, 5)
        batch(sink, 1, 5, 12)
        inspector = campaign._inspectors["output"]
        oracle_rows = inspector.rows()
        campaign.oracle = Oracle(oracle_rows, 10.0, 2)

        def trial() -> TrialOutcome:
            out = TrialOutcome(0, "0:0", Fault("zombie"))
            campaign._check(out)
            return out

        clean = trial()
        assert clean.passed, clean
        assert clean.readers == {
            "duckdb": {
                "lost_rows": 0,
                "duplicated_rows": 0,
                "value_mismatches": 0,
                "null_values": 0,
                "rows": 12,
            }
        }
        assert clean.leftovers == {"orphan_dirs": 0, "orphan_files": 0}

        # Batch 1's rows once more, in an entry that continues the ledger (offsets 12..19):
        # the ledger checks pass, only the rows are wrong.
        batch(sink, 2, 12, 19, ids=range(5, 12))
        both = trial()
        assert not both.passed and both.duplicated_rows == 7
        assert both.readers["duckdb"]["duplicated_rows"] == 7

        # The inspector's own read hides it: DuckDB alone fails the trial.
        monkeypatch.setattr(type(inspector), "rows", lambda self: list(oracle_rows))
        duckdb_only = trial()
        assert not duckdb_only.passed and duckdb_only.ledger_problems == [], duckdb_only
        assert duckdb_only.duplicated_rows == 7
        assert duckdb_only.readers["duckdb"]["rows"] == 19
    finally:
        campaign.close()
