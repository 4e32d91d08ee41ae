"""The Iceberg store URL (``iceberg+sqlite:///...``, ``iceberg+postgresql://...``): what
``sparkonce status``, ``ui``, ``reset`` and ``verify --sink`` take to reach a table in a
PyIceberg SQL catalog. No Spark: batches are committed through the ledger store's Arrow
route, and the status CLI reads them back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from sparkonce import sink_from_url
from sparkonce.errors import ConfigError, StoreUnavailableError
from sparkonce.pipeline.status import open_status_sink, pipeline_status
from sparkonce.sinks.iceberg import IcebergSink
from sparkonce.sinks.iceberg_url import parse_iceberg_url
from sparkonce.sinks.inspect import inspector_for
from sparkonce.sinks.registry import check_url, store_kind
from tests.iceberg.readers import pyiceberg_rows
from tests.iceberg.test_inspect import PIPE, SCHEMA, batch, committed_sink

SECRET = "s3cret-pw"


def committed(tmp_path: Path, name: str = "events") -> IcebergSink:
    """Two batches (12 rows) of ``PIPE`` in ``lake.events`` of catalog ``name``."""
    uri, warehouse = f"sqlite:///{tmp_path}/cat.db", f"file://{tmp_path}/wh"
    return committed_sink(tmp_path, SqlCatalog(name, uri=uri, warehouse=warehouse))


def test_status_reads_the_table_s_ledger_through_its_catalog(tmp_path: Path) -> None:
    committed(tmp_path)
    url = f"iceberg+sqlite:///{tmp_path}/cat.db?table=lake.events&catalog=events"
    assert store_kind(url).name == "iceberg"
    ledger, label = open_status_sink(url)
    try:
        assert ledger.pipelines() == [PIPE]
        st = pipeline_status(ledger, PIPE)
    finally:
        ledger.close()
    assert label == url
    assert (st.batches, st.rows_committed, st.owner and st.owner.epoch) == (2, 12, 1)
    # What the ui's page reads of the store, through the same opener.
    from sparkonce.ui.state import StoreWatch

    page = StoreWatch(url, open_status_sink).read()
    assert page["status"] == "ok", page
    assert [(p["name"], p["rows_committed"]) for p in page["pipelines"]] == [(PIPE, 12)], page
    # The same through the CLI, in a process of its own.
    out = subprocess.run(
        [sys.executable, "-m", "sparkonce", "status", "--sink", url, "--pipeline", PIPE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "12" in out.stdout and "epoch" in out.stdout.lower(), out.stdout


def test_a_postgresql_catalog_serves_status_and_a_down_one_is_named(
    pg_url: str, tmp_path: Path
) -> None:
    """The same ledger through a SQL catalog on the test PostgreSQL server (psycopg 3)."""
    db = pg_url.partition("://")[2]
    url = f"iceberg+postgresql://{db}?table=lake.events&catalog=pg"
    with pytest.raises(ConfigError, match="needs warehouse=/ABS/DIR"):
        sink_from_url(url)
    sink = sink_from_url(f"{url}&warehouse={tmp_path}/wh")
    assert isinstance(sink, IcebergSink)
    sink.store.schema = SCHEMA
    sink.store.acquire(PIPE)
    batch(sink, 0, 0, 5)
    assert "at postgresql+psycopg://" in sink.describe()
    ledger, _ = open_status_sink(url)  # reading needs no warehouse
    try:
        st = pipeline_status(ledger, PIPE)
    finally:
        ledger.close()
    assert (st.batches, st.rows_committed) == (1, 5)
    assert pyiceberg_rows(sink.catalog, "lake.events", ["id"]) == [(i,) for i in range(5)]
    down = f"iceberg+postgresql://alice:{SECRET}@127.0.0.1:1/x?table=a.b"
    with pytest.raises(StoreUnavailableError, match="did not answer") as err:
        open_status_sink(down)
    assert SECRET not in str(err.value)


def test_a_wrong_catalog_name_or_table_is_named_in_one_line(tmp_path: Path) -> None:
    committed(tmp_path)
    base = f"iceberg+sqlite:///{tmp_path}/cat.db"
    with pytest.raises(ConfigError, match=r"catalog 'default'.*catalog=NAME"):
        open_status_sink(f"{base}?table=lake.events")  # the catalog is named "events"
    with pytest.raises(ConfigError, match=r"no Iceberg table lake\.nope in catalog 'events'"):
        open_status_sink(f"{base}?table=lake.nope&catalog=events")
    with pytest.raises(ConfigError, match="name the table to read"):
        open_status_sink(f"{base}?catalog=events")
    with pytest.raises(ConfigError, match="does not exist"):
        open_status_sink(f"iceberg+sqlite:///{tmp_path}/nothing.db?table=a.b")
    assert not (tmp_path / "nothing.db").exists()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("iceberg://x/cat.db?table=a.b", "starts with iceberg\\+sqlite:// or iceberg\\+postgresql"),
        ("iceberg+sqlite:///c.db?table=ab", "table= is 'namespace.name'"),
        ("iceberg+sqlite:///c.db?table=a.b&tabel=c", "unknown parameter\\(s\\) tabel"),
        ("iceberg+sqlite:///c.db?table=a.b&table=c.d", "give table= once"),
        ("iceberg+sqlite:///c.db?warehouse=rel/dir", "warehouse= is an absolute local"),
        ("iceberg+sqlite://host/c.db", "a SQLite catalog is"),
        ("iceberg+postgresql:///db", "a PostgreSQL catalog is"),
    ],
)
def test_a_malformed_url_says_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_url(url)


def test_a_password_stays_out_of_messages_and_reprs() -> None:
    url = f"iceberg+postgresql://alice:{SECRET}@db.example:5432/cat?table=a.b"
    parsed = parse_iceberg_url(url)
    assert parsed.uri == f"postgresql+psycopg://alice:{SECRET}@db.example:5432/cat"
    assert SECRET not in repr(parsed) and SECRET not in parsed.label
    # A sink's description names where its catalog is, password masked (a stand-in
    # catalog: a SqlCatalog connects when built).
    catalog = SimpleNamespace(name="lake", properties={"uri": parsed.uri})
    described = IcebergSink(catalog, "a.b").describe()
    assert "at postgresql+psycopg://alice:***@db.example:5432/cat" in described
    assert SECRET not in described
    with pytest.raises(ConfigError) as err:
        check_url(url + "&bad=1")
    assert SECRET not in str(err.value)


def test_a_sink_moves_to_another_catalog_and_keeps_its_mode(tmp_path: Path) -> None:
    """``verify --sink``: the same sink (table, upsert keys) in the catalog the URL names,
    whose table is created in the URL's warehouse (default: beside the catalog file)."""
    upsert = IcebergSink(
        SqlCatalog("c", uri=f"sqlite:///{tmp_path}/a.db", warehouse=f"file://{tmp_path}/wa"),
        "lake.events",
        mode="upsert",
        keys=["id"],
        latest_by="key",
    )
    moved = inspector_for(upsert).relocated(f"iceberg+sqlite:///{tmp_path}/b/cat.db")
    assert isinstance(moved, IcebergSink)
    assert f"at sqlite:///{tmp_path}/b/cat.db" in moved.describe()  # not the original's
    assert (moved.table, moved.mode, moved.keys, moved.latest_by) == (
        "lake.events",
        "upsert",
        ("id",),
        ("key",),
    )
    moved.store.schema = SCHEMA
    moved.store.acquire(PIPE)
    batch(moved, 0, 0, 3)
    assert pyiceberg_rows(moved.catalog, "lake.events", ["id"]) == [(0,), (1,), (2,)]
    location = moved.store.load().location()
    assert location.startswith(f"file://{tmp_path}/b/warehouse/"), location
    assert not upsert.catalog.table_exists("lake.events")  # the original has no table

    renamed = sink_from_url(f"iceberg+sqlite:///{tmp_path}/b/cat.db?table=lake.other")
    assert isinstance(renamed, IcebergSink) and renamed.table == "lake.other"
    with pytest.raises(ConfigError, match="name the Iceberg table"):
        sink_from_url(f"iceberg+sqlite:///{tmp_path}/b/cat.db")


def test_reset_through_the_url_drops_the_table_only_with_its_rows(tmp_path: Path) -> None:
    from sparkonce.pipeline.reset import reset_pipeline

    # Committed by a process that has ended: reset refuses while the epoch's holder lives.
    code = (
        "from pathlib import Path; from tests.iceberg.test_url import committed; "
        f"committed(Path({str(tmp_path)!r}))"
    )
    root = Path(__file__).parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=root)
    sink = IcebergSink(SqlCatalog("events", uri=f"sqlite:///{tmp_path}/cat.db"), "lake.events")
    location = Path(sink.store.load().location().removeprefix("file://"))
    url = f"iceberg+sqlite:///{tmp_path}/cat.db?table=lake.events&catalog=events"
    with pytest.raises(ConfigError, match=r"Nothing was deleted.*--output-rows"):
        reset_pipeline(PIPE, url)
    assert len(pyiceberg_rows(sink.catalog, "lake.events", ["id"])) == 12
    plan = reset_pipeline(PIPE, url, output_rows=True)
    assert plan.done and plan.batches == 2
    assert not sink.catalog.table_exists("lake.events") and not location.exists()
