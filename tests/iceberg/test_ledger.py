"""The Iceberg ledger store on real SQL-catalog tables (SQLite and PostgreSQL), no Spark.

The oracle is the table itself, read back through PyIceberg's scan (and, in one test,
through DuckDB's ``iceberg_scan``, which shares no code with sparkonce or PyIceberg).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from sparkonce.errors import FencedError, LedgerError
from sparkonce.ledger.base import BatchContext, LedgerEntry
from sparkonce.ledger.iceberg import IcebergLedgerStore, IcebergTxn, key
from sparkonce.offsets import BatchRanges, OffsetRange

PIPE = "p1"
SCHEMA = pa.schema([("v", pa.int64())])


def sqlite_catalog(tmp_path: Path) -> SqlCatalog:
    return SqlCatalog("c", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")


@pytest.fixture(params=["sqlite", "postgres"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], SqlCatalog]:
    """A factory of catalog handles on one store (each store its own handle, as runs)."""
    if request.param == "sqlite":
        return lambda: sqlite_catalog(tmp_path)
    url = request.getfixturevalue("pg_url").replace("postgresql://", "postgresql+psycopg://", 1)
    return lambda: SqlCatalog("c", uri=url, warehouse=f"file://{tmp_path}/wh")


def store(make: Callable[[], SqlCatalog]) -> IcebergLedgerStore:
    return IcebergLedgerStore(make(), "ns.t", schema=SCHEMA)


def ranges(start: int, end: int) -> BatchRanges:
    return BatchRanges((OffsetRange("topic", 0, start, end),))


def entry(seq: int, epoch: int, start: int, end: int) -> LedgerEntry:
    return LedgerEntry(PIPE, seq, ranges(start, end), epoch, end - start, datetime.now(UTC), seq)


def rows(start: int, end: int) -> pa.Table:
    return pa.table({"v": pa.array(range(start, end), pa.int64())})


def commit(s: IcebergLedgerStore, e: LedgerEntry) -> IcebergTxn:
    """Steps 1-5 as the committer runs them, the batch's rows being the offsets."""
    with s.transaction() as txn:
        s.check_owner(txn, PIPE, e.epoch)
        s.record(txn, e)
        start, end = e.ranges.ranges[0].start, e.ranges.ranges[0].end
        txn.data = rows(start, end)
    return txn


def table_values(s: IcebergLedgerStore) -> list[int]:
    return sorted(s.load().scan().to_arrow().column("v").to_pylist())


def test_acquire_takes_increasing_epochs_that_two_racing_stores_never_share(
    catalog: Callable[[], SqlCatalog],
) -> None:
    store(catalog).load()  # the table exists before the race (its creation is not the test)
    taken: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        s = store(catalog)
        try:
            for _ in range(5):
                taken.append(s.acquire(PIPE).epoch)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(taken) == list(range(1, 11))
    owner = store(catalog).owner(PIPE)
    assert owner is not None and owner.epoch == 10
    assert store(catalog).pipelines() == [PIPE]


def test_record_find_last_round_trip(catalog: Callable[[], SqlCatalog]) -> None:
    s = store(catalog)
    epoch = s.acquire(PIPE, source="embedded:x").epoch
    assert s.last(PIPE) is None
    commit(s, entry(0, epoch, 0, 10))
    commit(s, entry(1, epoch, 10, 25))
    last = s.last(PIPE)
    assert last is not None and (last.seq, last.epoch, last.row_count) == (1, epoch, 15)
    assert last.end_offsets == ranges(10, 25).ends()
    assert [(e.seq, e.ranges) for e in s.entries(PIPE)] == [(0, ranges(0, 10)), (1, ranges(10, 25))]
    ctx = BatchContext(PIPE, epoch, ranges(0, 10), 0)
    found = s.find(None, PIPE, ctx)
    assert found is not None and found.seq == 0
    assert s.find(None, PIPE, BatchContext(PIPE, epoch, ranges(25, 30), 2)) is None
    assert table_values(s) == list(range(25))
    snap = s.load().current_snapshot()
    assert snap is not None and snap.summary is not None
    assert '"seq": 1' in str(snap.summary[key(PIPE, "entry")])


def test_check_owner_fences_an_older_epoch_and_its_commit(
    catalog: Callable[[], SqlCatalog],
) -> None:
    old, new = store(catalog), store(catalog)
    e1 = old.acquire(PIPE).epoch
    commit(old, entry(0, e1, 0, 10))
    with old.transaction() as zombie:  # the zombie loaded the table before the takeover
        old.check_owner(zombie, PIPE, e1)
        e2 = new.acquire(PIPE).epoch
        with pytest.raises(FencedError) as info:
            old.check_owner(None, PIPE, e1)
        assert info.value.owner_epoch == e2
        old.record(zombie, entry(1, e1, 10, 20))
        zombie.data = rows(10, 20)
        with pytest.raises(FencedError):
            old._commit(zombie)
        zombie.entry = None  # already failed: the block's exit has nothing more to do
    assert table_values(new) == list(range(10))
    last = new.last(PIPE)
    assert last is not None and last.seq == 0


def test_a_zombie_commit_racing_the_takeover_on_stale_metadata_is_fenced(
    catalog: Callable[[], SqlCatalog],
) -> None:
    """The zombie's own check passed on metadata loaded before the new epoch; only the
    requirement checked on the metadata the catalog swaps can stop it."""
    old, new = store(catalog), store(catalog)
    e1 = old.acquire(PIPE).epoch
    txn = IcebergTxn(old.load(), PIPE)
    new.acquire(PIPE)
    txn.entry = entry(0, e1, 0, 10)
    txn.data = rows(0, 10)
    stale = txn.table
    # The zombie's view of the table is the stale one: its pre-check passes on it.
    old._already(txn.entry, stale)
    with pytest.raises(FencedError):
        old._commit(txn)
    assert table_values(new) == []


def test_a_lost_acknowledgement_retry_finds_its_own_snapshot(
    catalog: Callable[[], SqlCatalog],
) -> None:
    s = store(catalog)
    epoch = s.acquire(PIPE).epoch
    e = entry(0, epoch, 0, 10)
    commit(s, e)
    snapshots = len(s.load().snapshots())
    again = commit(store(catalog), e)  # the same commit again, as after a lost answer
    assert again.replayed
    assert len(s.load().snapshots()) == snapshots
    assert table_values(s) == list(range(10))


def test_a_concurrent_plain_append_does_not_break_a_commit(
    catalog: Callable[[], SqlCatalog],
) -> None:
    s = store(catalog)
    epoch = s.acquire(PIPE).epoch
    commit(s, entry(0, epoch, 0, 10))
    with s.transaction() as txn:
        s.check_owner(txn, PIPE, epoch)
        s.record(txn, entry(1, epoch, 10, 20))
        txn.data = rows(10, 20)
        # Someone else appends between this commit's load and its catalog swap.
        catalog().load_table("ns.t").append(rows(1000, 1003))
    assert table_values(s) == [*range(20), 1000, 1001, 1002]
    last = s.last(PIPE)
    assert last is not None and last.seq == 1
    assert [e.seq for e in s.entries(PIPE)] == [0, 1]


def test_a_batch_out_of_sequence_is_a_ledger_error(catalog: Callable[[], SqlCatalog]) -> None:
    s = store(catalog)
    epoch = s.acquire(PIPE).epoch
    with pytest.raises(LedgerError, match="expected 1"):
        commit(s, entry(2, epoch, 10, 20))
    assert table_values(s) == []


def test_duckdb_reads_each_committed_row_once(tmp_path: Path) -> None:
    """The independent reader: DuckDB's iceberg_scan of the table's metadata file."""
    import duckdb  # the dev extras' reader: a missing one is an error, never a skip
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    s = store(lambda: sqlite_catalog(tmp_path))
    epoch = s.acquire(PIPE).epoch
    for seq in range(3):
        commit(s, entry(seq, epoch, seq * 10, seq * 10 + 10))
    commit(s, entry(2, epoch, 20, 30))  # a retry of the last commit: no second copy
    location = s.load().metadata_location
    c = duckdb.connect()
    for mod in (duckdb_extension_avro, duckdb_extension_iceberg):
        path = next(Path(mod.__file__).parent.glob("**/*.duckdb_extension"))
        c.sql(f"LOAD '{path}'")
    got = [r[0] for r in c.sql(f"SELECT v FROM iceberg_scan('{location}') ORDER BY v").fetchall()]
    assert got == list(range(30))


def test_a_commit_works_out_the_transaction_metadata_once_per_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyIceberg's transaction deep-copies the whole metadata (every snapshot of the
    history) on each read of ``table_metadata``, about 18 per append; a commit that paid
    that on every read grew with the table's snapshot count (benchmarks/iceberg.py
    --mode snapshots). The store's transaction works it out once per update."""
    import pyiceberg.table

    import sparkonce.ledger.iceberg as ledger

    s = store(lambda: sqlite_catalog(tmp_path))
    epoch = s.acquire(PIPE).epoch
    commit(s, entry(0, epoch, 0, 10))
    calls: list[int] = []
    real = pyiceberg.table.update_table_metadata

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pyiceberg.table, "update_table_metadata", counted)
    monkeypatch.setattr(ledger, "update_table_metadata", counted)
    commit(s, entry(1, epoch, 10, 25))
    assert table_values(s) == list(range(25))
    # The updates: the entry's property, then the snapshot and its ref (and the catalog's
    # own apply, outside the transaction): one computation each, not one per read.
    assert 1 <= len(calls) <= 4, len(calls)


def test_history_walks_find_each_parent_without_scanning_the_snapshot_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyIceberg's ancestors_of looks each parent up with ``snapshot_by_id``, a scan of
    the whole list: the entries and the orphan sweep's walk were quadratic in the history
    (7.2 s at 10,000 snapshots, after every commit). They look parents up in a dict."""
    from pyiceberg.table.metadata import TableMetadataCommonFields
    from pyiceberg.table.snapshots import ancestors_of

    from sparkonce.sinks.iceberg import committed_dirs

    s = store(lambda: sqlite_catalog(tmp_path))
    epoch = s.acquire(PIPE).epoch
    for seq in range(3):
        commit(s, entry(seq, epoch, seq * 10, seq * 10 + 10))
    s.load().append(rows(100, 101))  # another writer's snapshot, in the middle of nothing
    commit(s, entry(3, epoch, 30, 40))
    table = s.load()
    walked = [snap.snapshot_id for snap in ancestors_of(table.current_snapshot(), table.metadata)]
    scans: list[int] = []
    real = TableMetadataCommonFields.snapshot_by_id

    def counted(self: TableMetadataCommonFields, snapshot_id: int) -> object:
        scans.append(snapshot_id)
        return real(self, snapshot_id)

    monkeypatch.setattr(TableMetadataCommonFields, "snapshot_by_id", counted)
    assert [snap.snapshot_id for snap in ledger_history(table)] == walked
    assert [e.seq for e in s.entries(PIPE)] == [0, 1, 2, 3]
    assert sorted(committed_dirs(table, PIPE)) == [0, 1, 2, 3]
    # Only the current snapshot is looked up that way (table.current_snapshot()), never a parent.
    assert set(scans) == {table.metadata.current_snapshot_id}


def ledger_history(table: object) -> list:
    from sparkonce.ledger.iceberg import history

    return list(history(table))  # type: ignore[arg-type]


def test_retention_expires_old_snapshots_in_each_batch_commit_and_loses_nothing(
    catalog: Callable[[], SqlCatalog],
) -> None:
    """keep_snapshots=3: after 8 batches the main branch holds the newest 3 snapshots (a
    tagged one stays too), every row is still read by PyIceberg's scan, the resume point
    and the kept entries are intact, and the batch after is taken as the next one."""
    from sparkonce.ledger import iceberg as ledger

    s = IcebergLedgerStore(catalog(), "ns.t", schema=SCHEMA, keep_snapshots=3)
    epoch = s.acquire(PIPE).epoch
    commit(s, entry(0, epoch, 0, 5))
    tagged = s.load().current_snapshot()
    assert tagged is not None
    s.load().manage_snapshots().create_tag(tagged.snapshot_id, "first").commit()
    for seq in range(1, 8):
        txn = commit(s, entry(seq, epoch, seq * 5, seq * 5 + 5))
    assert txn.notes["expired"] == 1  # one per commit once the history is full
    table = s.load()
    kept = [snap.snapshot_id for snap in ledger.history(table)]
    assert len(kept) == 3
    assert {snap.snapshot_id for snap in table.snapshots()} == {*kept, tagged.snapshot_id}
    assert table_values(s) == list(range(40))
    assert [e.seq for e in s.entries(PIPE)] == [5, 6, 7]
    last = s.last(PIPE)
    assert last is not None and last.end_offsets == ranges(35, 40).ends()
    commit(s, entry(8, epoch, 40, 45))
    assert table_values(s) == list(range(45))


def test_retention_sheds_a_long_history_a_bounded_number_per_commit(tmp_path: Path) -> None:
    """A table with more history than kept: each commit expires at most EXPIRE_PER_COMMIT
    of it, oldest first, until the main branch is down to keep_snapshots."""
    from sparkonce.ledger import iceberg as ledger

    make = lambda: sqlite_catalog(tmp_path)  # noqa: E731
    s = store(make)
    epoch = s.acquire(PIPE).epoch
    for seq in range(7):
        commit(s, entry(seq, epoch, seq, seq + 1))
    first_ids = [snap.snapshot_id for snap in s.load().snapshots()]
    keeping = IcebergLedgerStore(make(), "ns.t", schema=SCHEMA, keep_snapshots=2)
    saved = ledger.EXPIRE_PER_COMMIT
    ledger.EXPIRE_PER_COMMIT = 2
    try:
        commit(keeping, entry(7, epoch, 7, 8))  # 8 snapshots, 2 expired: the oldest two
        left = {snap.snapshot_id for snap in keeping.load().snapshots()}
        assert left == set(first_ids[2:]) | {keeping.load().current_snapshot().snapshot_id}  # type: ignore[union-attr]
        counts = []
        for seq in range(8, 12):  # 7, 6, 5, 4 snapshots before each: 2 expired each time
            commit(keeping, entry(seq, epoch, seq, seq + 1))
            counts.append(len(keeping.load().snapshots()))
    finally:
        ledger.EXPIRE_PER_COMMIT = saved
    assert counts == [5, 4, 3, 2]
    assert table_values(keeping) == list(range(12))


def test_a_commit_whose_expiry_lost_a_race_to_another_expiry_commits_again(
    tmp_path: Path,
) -> None:
    """Another writer expires a snapshot this batch's commit also expires, between the
    commit's read and its swap: the commit is applied again on the newer metadata."""
    from pyiceberg.table.update import RemoveSnapshotsUpdate

    from sparkonce.ledger import iceberg as ledger

    make = lambda: sqlite_catalog(tmp_path)  # noqa: E731
    s = IcebergLedgerStore(make(), "ns.t", schema=SCHEMA, keep_snapshots=2)
    epoch = s.acquire(PIPE).epoch
    for seq in range(2):
        commit(s, entry(seq, epoch, seq * 3, seq * 3 + 3))
    oldest = min(s.load().snapshots(), key=lambda snap: snap.sequence_number or 0)
    real = ledger.expired_by
    raced: list[int] = []

    def racing(meta: object, keep: int) -> list[int]:
        ids = real(meta, keep)  # type: ignore[arg-type]
        if ids and not raced:  # the other writer expires the same snapshot first
            other = make().load_table("ns.t")
            txn = other.transaction()
            txn._apply((RemoveSnapshotsUpdate.model_validate({"snapshot-ids": ids}),), ())
            txn.commit_transaction()
            raced.extend(ids)
        return ids

    ledger.expired_by = racing
    try:
        commit(s, entry(2, epoch, 6, 9))
    finally:
        ledger.expired_by = real
    assert raced == [oldest.snapshot_id]
    table = s.load()
    assert len(table.snapshots()) == 2 and oldest.snapshot_id not in {
        snap.snapshot_id for snap in table.snapshots()
    }
    assert table_values(s) == list(range(9))
    last = s.last(PIPE)
    assert last is not None and last.seq == 2


def test_a_table_the_store_creates_merges_its_manifests(tmp_path: Path) -> None:
    """Each batch adds a manifest; on a table the sink created, PyIceberg merges them once
    there are 100, so the manifest list a commit writes does not grow with every batch."""
    s = IcebergLedgerStore(sqlite_catalog(tmp_path), "ns.t", schema=SCHEMA, keep_snapshots=5)
    epoch = s.acquire(PIPE).epoch
    for seq in range(120):
        commit(s, entry(seq, epoch, seq, seq + 1))
    table = s.load()
    snap = table.current_snapshot()
    assert snap is not None
    assert len(snap.manifests(table.io)) <= 21  # 120 without merging
    assert table_values(s) == list(range(120))
    assert len(table.snapshots()) == 5
