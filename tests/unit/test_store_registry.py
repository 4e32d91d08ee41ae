"""One registry from a store URL to its store (issue 42 item 4): sink_from_url, status, the
ui and the CLI's URL checks all look a URL's kind up in sparkonce.sinks.registry."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sparkonce import sink_from_url
from sparkonce.cli.common import SINK_URL_EXPECTED
from sparkonce.config import StoreURL
from sparkonce.db import SQLiteDialect, connect
from sparkonce.errors import ConfigError
from sparkonce.ledger.sql import SqlLedger
from sparkonce.offsets import BatchRanges
from sparkonce.pipeline.status import open_status_sink, pipeline_status
from sparkonce.sinks.registry import STORE_FORMS, check_url, store_kind

SECRET = "s3cret-pw"


def _ledger_with_one_batch(path: Path) -> str:
    url = f"sqlite:///{path}"
    conn = connect(StoreURL.parse(url))
    ledger = SqlLedger(SQLiteDialect())
    ledger.ensure_schema(conn)
    ledger.acquire(conn, "p")
    ledger.record(
        conn,
        pipeline="p",
        seq=0,
        ranges=BatchRanges.from_json_obj({"events": {"0": [0, 4]}}),
        epoch=1,
        row_count=4,
        spark_batch_id=0,
        checkpoint_id="c",
    )
    conn.close()
    return url


def test_status_reads_the_ledger_store_itself_with_no_output_table(tmp_path: Path) -> None:
    url = _ledger_with_one_batch(tmp_path / "sink.db")
    ledger, label = open_status_sink(url)
    try:
        st = pipeline_status(ledger, "p")
        assert ledger.pipelines() == ["p"]
    finally:
        ledger.close()
    assert label == url and repr(ledger) == f"StoreLedger({url})"
    # The ledger store describes itself: no sink, so no made-up output table in it.
    assert st.sink == url and "table=" not in st.sink
    assert (st.batches, st.rows_committed, st.owner and st.owner.epoch) == (1, 4, 1)
    assert st.last_commit_at is not None and st.last_commit_at <= datetime.now(UTC)
    with sqlite3.connect(tmp_path / "sink.db") as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"sparkonce_owner", "sparkonce_ledger"}


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("sqlite:///a.db", "sql"),
        ("postgresql://u@h:5432/db", "sql"),
        ("postgres://u@h/db", "sql"),
        ("kafka://h:9092/t", "kafka"),
        ("delta:///tmp/t", "delta"),
        ("delta:s3a://bucket/t", "delta"),
    ],
)
def test_each_url_has_one_kind(url: str, kind: str) -> None:
    assert store_kind(url).name == kind
    check_url(url)


def test_a_url_of_no_kind_names_every_form_and_no_secret() -> None:
    url = f"mysql://alice:{SECRET}@db.example/x"
    for call in (
        lambda: store_kind(url),
        lambda: check_url(url),
        lambda: sink_from_url(url, "out"),
        lambda: open_status_sink(url),
    ):
        with pytest.raises(ConfigError) as err:
            call()
        message = str(err.value)
        assert "sink URL scheme 'mysql' is not supported" in message
        assert STORE_FORMS in message and SECRET not in message
    assert f"a sink URL: {STORE_FORMS}" == SINK_URL_EXPECTED


def test_a_sql_url_without_a_table_names_no_password() -> None:
    with pytest.raises(ConfigError, match="needs the output table's name") as err:
        sink_from_url(f"postgresql://alice:{SECRET}@db.example/x")
    assert SECRET not in str(err.value)
