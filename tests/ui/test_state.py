"""The data of ``sparkonce ui`` (sparkonce.ui.state) against real stores, no browser.

Ledgers are written by real commits through the sink API (``acquire`` and
``commit_rows``, the committer's own path); the expected values are computed here from
what the test committed and from the embedded log's end offsets.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import types as T

from sparkonce.errors import ConfigError, SinkUnavailableError
from sparkonce.ledger.base import BatchContext
from sparkonce.log import Topic
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.pipeline.status import open_status_sink
from sparkonce.sinks import SQLiteSink
from sparkonce.sinks.sql import SqlSink
from sparkonce.ui.state import (
    StoreWatch,
    UiState,
    load_verify_report,
    pipeline_view,
    timeline,
    verify_view,
)
from tests.ui.conftest import CAMPAIGN_REPORT, SECRET

SCHEMA = T.StructType([T.StructField("id", T.LongType())])


def _commit(
    sink: SqlSink, pipeline: str, epoch: int, ends: dict[int, tuple[int, int]], batch_id: int = 0
) -> int:
    """Commit one batch of the partitions' ``(start, end)`` ranges of topic ``events``; one
    row per record. Returns the rows committed."""
    ranges = BatchRanges(tuple(OffsetRange("events", p, s, e) for p, (s, e) in ends.items()))
    rows = [(i,) for i in range(ranges.count)]
    ctx = BatchContext(pipeline, epoch, ranges, batch_id, "cp")
    sink.commit_rows(ctx, SCHEMA, ["id"], rows)
    return len(rows)


@pytest.fixture
def committed(
    tmp_path: Path, make_log: Callable[..., Path]
) -> tuple[str, dict[int, int], list[int]]:
    """A SQLite store where pipeline ``p`` committed two batches in epoch 1 and one in
    epoch 2, reading 29 of the log's 60 records; (URL, log end offsets, rows per batch)."""
    log = make_log(60, partitions=3)
    with Topic(log, "events") as topic:
        latest = dict(topic.end_offsets())
    url = f"sqlite:///{tmp_path / 'sink.db'}"
    source = f"sparkonce-log://{log}?topic=events"
    sink = SQLiteSink(url, "out")
    sink.acquire("p", source)
    rows = [
        _commit(sink, "p", 1, {0: (0, 2), 1: (0, 3), 2: (0, 1)}),
        _commit(sink, "p", 1, {0: (2, 5), 1: (3, 3), 2: (1, 4)}, 1),
    ]
    sink.acquire("p", source)
    rows.append(_commit(sink, "p", 2, {0: (5, 10), 1: (3, 12), 2: (4, 7)}, 3))
    sink.close()
    return url, latest, rows


def test_pipeline_view_matches_what_was_committed(
    committed: tuple[str, dict[int, int], list[int]],
) -> None:
    url, latest, rows = committed
    sink, _ = open_status_sink(url)
    try:
        entries = sink.ledger("p")
        view = pipeline_view(sink, "p")
    finally:
        sink.close()
    assert view["name"] == "p"
    assert view["owner"]["epoch"] == 2
    assert view["owner"]["source"].startswith("sparkonce-log://")
    assert view["batches"] == 3
    assert view["rows_committed"] == sum(rows) == 29
    assert view["last_batch"] == {
        "seq": 2,
        "epoch": 2,
        "spark_batch_id": 3,
        "committed_at": entries[-1].committed_at.isoformat(),
        "rows": rows[-1],
    }
    committed_ends = {0: 10, 1: 12, 2: 7}
    got = [(p["partition"], p["committed"], p["latest"], p["lag"]) for p in view["partitions"]]
    assert got == [
        (p, committed_ends[p], latest[p], latest[p] - committed_ends[p]) for p in range(3)
    ]
    assert view["total_lag"] == sum(latest.values()) - 29 == 60 - 29
    assert view["ledger_problems"] == []
    # The timeline: every entry, oldest first; the epoch change is marked.
    assert [e["seq"] for e in view["timeline"]] == [0, 1, 2]
    assert [e["epoch_changed"] for e in view["timeline"]] == [False, False, True]
    assert [e["rows"] for e in view["timeline"]] == rows
    assert view["timeline"][0]["interval_s"] is None
    recorded = [e.commit_seconds for e in entries]
    assert [e["commit_s"] for e in view["timeline"]] == recorded and None not in recorded
    for before, e, entry in zip(view["timeline"], view["timeline"][1:], entries[1:], strict=False):
        gap = (entry.committed_at - entries[entry.seq - 1].committed_at).total_seconds()
        assert e["interval_s"] == pytest.approx(gap)
        assert e["rows_per_s"] == (pytest.approx(e["rows"] / gap) if gap > 0 else None)
        records = entry.ranges.count
        assert e["records_per_s"] == (pytest.approx(records / gap) if gap > 0 else None)
        assert before["seq"] == e["seq"] - 1
    json.dumps(view)  # plain data, as /api/state serves it


def test_timeline_keeps_the_newest_and_measures_from_the_entry_before(
    committed: tuple[str, dict[int, int], list[int]],
) -> None:
    url, _, _ = committed
    sink, _ = open_status_sink(url)
    try:
        entries = sink.ledger("p")
    finally:
        sink.close()
    shown = timeline(entries, recent=2)
    assert [e["seq"] for e in shown] == [1, 2]
    gap = (entries[1].committed_at - entries[0].committed_at).total_seconds()
    assert shown[0]["interval_s"] == pytest.approx(gap)


def test_store_watch_reads_a_store_with_pipelines(
    committed: tuple[str, dict[int, int], list[int]],
) -> None:
    url, _, _ = committed
    watch = StoreWatch(url, open_status_sink)
    try:
        view = watch.read()
    finally:
        watch.close()
    assert view["status"] == "ok", view
    assert view["error"] is None
    assert [p["name"] for p in view["pipelines"]] == ["p"]
    assert view["label"] == url


def test_an_empty_store_is_empty_not_an_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    SQLiteSink(url, "out").open()  # the ledger tables, no pipeline
    watch = StoreWatch(url, open_status_sink)
    view = watch.read()
    watch.close()
    assert (view["status"], view["pipelines"], view["error"]) == ("empty", [], None)


def test_an_unreachable_store_is_an_error_without_its_password(unreachable_pg: str) -> None:
    """The CLI's start check (probe) fails; the first reading shows that failure at once
    instead of trying the store again."""
    watch = StoreWatch(unreachable_pg, open_status_sink)
    assert SECRET not in repr(watch)
    with pytest.raises(SinkUnavailableError) as failed:
        watch.probe()
    assert SECRET not in str(failed.value)
    started = time.monotonic()
    view = watch.read()
    assert time.monotonic() - started < 1.0
    assert view["status"] == "error"
    assert view["error_type"] == "SinkUnavailableError"
    assert "cannot connect to PostgreSQL at 127.0.0.1:" in view["error"]
    assert SECRET not in json.dumps(view)
    assert view["label"] == unreachable_pg.replace(SECRET, "***")


def test_a_sqlite_file_not_created_yet_is_waited_for(tmp_path: Path) -> None:
    """Before a run creates the SQLite file, the store waits for it (not an error), and
    reading does not create it; once it exists, its pipelines are read."""
    path = tmp_path / "later.db"
    watch = StoreWatch(f"sqlite:///{path}", open_status_sink)
    watch.probe()  # the CLI's start check: nothing to open yet, nothing raised
    view = watch.read()
    assert (view["status"], view["waiting_for"], view["error"]) == ("waiting", str(path), None)
    assert not path.exists()
    sink = SQLiteSink(f"sqlite:///{path}", "out")
    sink.acquire("later")
    sink.close()
    view = watch.read()
    watch.close()
    assert view["status"] == "ok", view
    assert [p["name"] for p in view["pipelines"]] == ["later"]


def test_a_bad_url_is_an_error_of_its_store() -> None:
    view = StoreWatch("mysql://db.example/x", open_status_sink).read()
    assert (view["status"], view["error_type"]) == ("error", "ConfigError")
    assert "'mysql' is not supported" in view["error"]


def test_a_store_that_fails_is_read_again_and_recovers(
    tmp_path: Path, committed: tuple[str, dict[int, int], list[int]]
) -> None:
    """The SQLite file is gone (error), then back: the next read opens it again."""
    url, _, _ = committed
    path = Path(url.removeprefix("sqlite:///"))
    moved = tmp_path / "moved.db"
    watch = StoreWatch(url, open_status_sink)
    assert watch.read()["status"] == "ok"
    watch.close()  # as after a failure: the next read opens the file again
    path.rename(moved)
    first = watch.read()
    assert (first["status"], first["error_type"]) == ("error", "ConfigError")
    assert "does not exist" in first["error"]
    moved.rename(path)
    second = watch.read()
    watch.close()
    assert second["status"] == "ok"
    assert second["pipelines"][0]["batches"] == 3


def test_a_postgres_store(pg_url: str) -> None:
    from sparkonce.sinks import PostgresSink

    pg = PostgresSink(pg_url, "out")
    pg.acquire("pg-pipeline")
    _commit(pg, "pg-pipeline", 1, {0: (0, 4)})
    pg.close()
    watch = StoreWatch(pg_url, open_status_sink)
    view = watch.read()
    watch.close()
    assert view["status"] == "ok", view
    (p,) = view["pipelines"]
    assert (p["name"], p["owner"]["epoch"], p["batches"], p["rows_committed"]) == (
        "pg-pipeline",
        1,
        1,
        4,
    )
    assert p["partitions"][0]["latest"] is None  # no source recorded: lag unknown


def test_a_kafka_store_lists_its_pipelines(kafka_broker: Any, kafka_topic: Any) -> None:
    """KafkaSink.pipelines(): every pipeline that took an epoch in its ledger topic."""
    from sparkonce.sinks import KafkaSink

    topic = kafka_topic("ui")
    sink = KafkaSink(kafka_broker.bootstrap, topic)
    assert sink.pipelines() == []
    sink.acquire("first")
    sink.acquire("second")
    sink.acquire("first")
    assert sink.pipelines() == ["first", "second"]
    sink.close()
    watch = StoreWatch(f"kafka://{kafka_broker.bootstrap}/{topic}", open_status_sink)
    view = watch.read()
    watch.close()
    assert view["status"] == "ok", view
    assert {p["name"]: p["owner"]["epoch"] for p in view["pipelines"]} == {"first": 2, "second": 1}


# -- the verify report ---------------------------------------------------------------------------


def test_the_verify_report_summary_is_the_campaigns() -> None:
    doc = json.loads(CAMPAIGN_REPORT.read_text())
    report = load_verify_report(CAMPAIGN_REPORT)
    assert report["error"] is None
    assert report["trials"] == len(doc["trials"])
    assert report["failed"] == sum(not t["passed"] for t in doc["trials"])
    assert [s["kind"] for s in report["summary"]] == [s["kind"] for s in doc["summary"]]
    for got, want in zip(report["summary"], doc["summary"], strict=True):
        for key in ("trials", "passed", "lost_rows", "duplicated_rows"):
            assert got[key] == want[key]
        assert got["recovery_mean_s"] == want["recovery_mean_s"]
        assert got["recovery_p95_s"] == want["recovery_p95_s"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "does not exist"),
        ("{not json", "is not JSON"),
        ('{"trials": []}', "is not a report of `sparkonce verify`"),
        ('[{"kind": "kill"}]', "is not a report of `sparkonce verify`"),
    ],
)
def test_a_missing_or_corrupt_verify_report(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "verify.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=problem):
        load_verify_report(path)
    view = verify_view(path)
    assert view is not None
    assert problem in view["error"]
    assert view["summary"] == []


# -- the whole document ------------------------------------------------------------------------


def test_snapshot_holds_every_store_in_order_and_the_report(
    tmp_path: Path, committed: tuple[str, dict[int, int], list[int]]
) -> None:
    url, _, _ = committed
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    SQLiteSink(empty, "out").open()
    state = UiState(
        [StoreWatch(url, open_status_sink), StoreWatch(empty, open_status_sink)],
        CAMPAIGN_REPORT,
        refresh_s=1.0,
    )
    before = state.snapshot()
    assert [s["status"] for s in before["stores"]] == ["loading", "loading"]
    state.read_now()
    doc = state.snapshot()
    for watch in state.watches:
        watch.close()
    assert [s["status"] for s in doc["stores"]] == ["ok", "empty"]
    assert doc["refresh_s"] == 1.0
    assert doc["verify"]["summary"][0]["kind"] == "kill"
    json.dumps(doc)
