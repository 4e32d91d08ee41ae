"""The codecs of stored records (issue 42): ledger entries, fault events and verify.json.

Each codec writes a ``version``; records written before it (none) still read, and a
record of a newer version is refused with a RecordVersionError naming it and what to do.
Every old record below is literal, as the code before the codecs wrote it: the SQL row,
Kafka record, Delta file and events were written by that code (sparkonce 0.1.0 of
2026-11-28), the reports are real campaigns' (benchmarks/results, cut to one trial).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from pathlib import Path

import pytest

from sparkonce.config import StoreURL
from sparkonce.db import SQLiteDialect, connect
from sparkonce.errors import ConfigError, RecordVersionError
from sparkonce.faults import FaultPlan, read_events
from sparkonce.ledger.base import LedgerEntry
from sparkonce.ledger.kafka_topic import LedgerState, LedgerTopic, _entry_record
from sparkonce.ledger.records import DELTA_ENTRY, KAFKA_ENTRY, NEWER_ENTRY
from sparkonce.ledger.sql import LEDGER_TABLE, SqlLedger
from sparkonce.offsets import BatchRanges
from sparkonce.ui.state import load_verify_report
from sparkonce.verify.live import DeltaLogReader
from sparkonce.verify.report import VerifyReport, load_report

AT = "2026-11-28T09:49:54.773683+00:00"
RANGES = {"events": {"0": [0, 5], "1": [0, 3]}}
# The entry every old ledger record below holds.
ENTRY = LedgerEntry(
    "orders",
    0,
    BatchRanges.from_json_obj(RANGES),
    1,
    8,
    datetime.fromisoformat(AT),
    spark_batch_id=0,
    checkpoint_id="7d3c",
    stateful=False,
    commit_seconds=0.042,
)

# -- ledger entries: SQL ------------------------------------------------------------------------

OLD_SQL_TABLE = (
    "CREATE TABLE sparkonce_ledger ( pipeline TEXT NOT NULL, seq INTEGER NOT NULL CHECK "
    "(seq >= 0), ranges TEXT NOT NULL, epoch INTEGER NOT NULL, row_count INTEGER NOT NULL, "
    "committed_at TEXT NOT NULL, spark_batch_id INTEGER, checkpoint_id TEXT, stateful "
    "INTEGER, commit_seconds REAL, PRIMARY KEY (pipeline, seq))"
)
OLD_SQL_ROW = ("orders", 0, '{"events":{"0":[0,5],"1":[0,3]}}', 1, 8, AT, 0, "7d3c", 0, 0.042)


def test_a_sql_ledger_row_without_a_version_reads_and_new_rows_carry_one(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:
        old.execute(OLD_SQL_TABLE)
        old.execute(f"INSERT INTO {LEDGER_TABLE} VALUES (?,?,?,?,?,?,?,?,?,?)", OLD_SQL_ROW)
    conn = connect(StoreURL.parse(f"sqlite:///{path}"))
    ledger = SqlLedger(SQLiteDialect())
    ledger.ensure_schema(conn)  # adds the version column to the older table
    assert ledger.entries(conn, "orders") == [ENTRY]
    ledger.record(
        conn,
        pipeline="orders",
        seq=1,
        ranges=BatchRanges.from_json_obj({"events": {"0": [5, 9]}}),
        epoch=1,
        row_count=4,
        spark_batch_id=1,
        checkpoint_id="7d3c",
    )
    versions = conn.execute(f"SELECT seq, version FROM {LEDGER_TABLE} ORDER BY seq").fetchall()
    assert [tuple(v) for v in versions] == [(0, None), (1, 1)]
    assert [e.seq for e in ledger.entries(conn, "orders")] == [0, 1]
    conn.close()


def test_a_sql_ledger_row_of_a_newer_version_is_refused(tmp_path: Path) -> None:
    conn = connect(StoreURL.parse(f"sqlite:///{tmp_path / 'new.db'}"))
    ledger = SqlLedger(SQLiteDialect())
    ledger.ensure_schema(conn)
    conn.execute(
        f"INSERT INTO {LEDGER_TABLE} (pipeline, seq, ranges, epoch, row_count, committed_at,"
        " version) VALUES ('orders', 0, '{}', 1, 0, ?, 2)",
        (AT,),
    )
    with pytest.raises(RecordVersionError) as err:
        ledger.entries(conn, "orders")
    message = str(err.value)
    assert f"ledger entry 0 of pipeline 'orders' in table {LEDGER_TABLE}" in message
    assert "format version 2" in message and "a newer sparkonce wrote it" in message
    assert "at least as new as the one that wrote the entry" in message
    with pytest.raises(RecordVersionError):
        ledger.last(conn, "orders")
    conn.close()


# -- ledger entries: Kafka ledger topic and Delta entry files ---------------------------------

OLD_KAFKA_RECORD = (
    '{"tasks": 2, "tasks_skipped": 0, "type": "batch", "pipeline": "orders", "seq": 0, '
    '"ranges": {"events": {"0": [0, 5], "1": [0, 3]}}, "epoch": 1, "rows": 8, '
    '"spark_batch_id": 0, "checkpoint_id": "7d3c", "stateful": false, '
    '"commit_seconds": 0.042, "at": "2026-11-28T09:49:54.773683+00:00"}'
)
OLD_DELTA_FILE = (
    '{"pipeline": "orders", "seq": 0, "epoch": 1, "ranges": {"events": {"0": [0, 5], '
    '"1": [0, 3]}}, "committed_at": "2026-11-28T09:49:54.773683+00:00", '
    '"spark_batch_id": 0, "checkpoint_id": "7d3c", "stateful": false, '
    '"commit_seconds": 0.042}'
)


def test_a_kafka_batch_record_without_a_version_folds_and_new_ones_carry_one() -> None:
    record = {**json.loads(OLD_KAFKA_RECORD), "_offset": 41}
    state = LedgerTopic.fold(LedgerState(), "orders", [record])
    assert state.entries == [ENTRY] and state.after_last_entry == 42
    written = _entry_record(ENTRY)
    assert written["version"] == 1 and written["type"] == "batch"
    # The keys an older sparkonce reads are unchanged: the old record plus a version.
    assert {k: v for k, v in written.items() if k != "version"} == {
        k: v for k, v in json.loads(OLD_KAFKA_RECORD).items() if not k.startswith("tasks")
    }
    assert KAFKA_ENTRY.decode("orders", json.loads(json.dumps(written))) == ENTRY


def test_a_kafka_batch_record_of_a_newer_version_is_refused() -> None:
    record = {**json.loads(OLD_KAFKA_RECORD), "version": 2, "_offset": 41}
    with pytest.raises(RecordVersionError) as err:
        LedgerTopic.fold(LedgerState(), "orders", [record])
    message = str(err.value)
    assert "pipeline 'orders' in the Kafka ledger topic (batch record at offset 41)" in message
    assert "format version 2" in message


def test_a_newer_ledger_entry_is_named_by_its_pipeline_and_store_and_says_what_to_do() -> None:
    # Decoded without a place (``where``): the message names the pipeline and store only.
    with pytest.raises(RecordVersionError) as err:
        KAFKA_ENTRY.decode("orders", {**KAFKA_ENTRY.encode(ENTRY), "version": 2})
    message = str(err.value)
    assert message.startswith(
        "ledger entry of pipeline 'orders' in the Kafka ledger topic has format version 2,"
    )
    assert message.endswith(f"; {NEWER_ENTRY}")


def test_a_delta_entry_file_without_a_version_reads_and_new_ones_carry_one(
    tmp_path: Path,
) -> None:
    entries = tmp_path / "_sparkonce" / "orders" / "entries" / "0"
    entries.mkdir(parents=True)
    (entries / "1.json").write_text(OLD_DELTA_FILE)
    # The live reader reads the entry file by itself (no Spark): through the same codec.
    assert DeltaLogReader("out", str(tmp_path), "orders")._entry(0, 1, 8) == ENTRY
    written = DELTA_ENTRY.encode(ENTRY)
    assert written == {"version": 1, **json.loads(OLD_DELTA_FILE)}
    assert DELTA_ENTRY.decode("orders", written, rows=8) == ENTRY
    (entries / "1.json").write_text(json.dumps({**written, "version": 3}))
    with pytest.raises(RecordVersionError) as err:
        DeltaLogReader("out", str(tmp_path), "orders")._entry(0, 1, 8)
    assert str(entries / "1.json") in str(err.value) and "format version 3" in str(err.value)


# -- fault events -------------------------------------------------------------------------------

OLD_EVENTS = (
    '{"event": "crash", "point": "after-rows", "hit": 2, "pid": 30660, "at": 1795859394.7747815}\n'
    '{"event": "fenced", "pipeline": "orders", "epoch": 1, "owner_epoch": 2, "pid": 30660, '
    '"at": 1795859394.7802033}\n'
)


def test_fault_events_without_a_version_read_as_before_and_new_ones_carry_one(
    tmp_path: Path,
) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text(OLD_EVENTS)
    assert read_events(events) == [json.loads(line) for line in OLD_EVENTS.splitlines()]
    FaultPlan(events=events).record("crash", point="before-commit", hit=1)
    new = json.loads(events.read_text().splitlines()[-1])
    assert new["version"] == 1 and new["event"] == "crash"
    assert read_events(events)[-1] == {k: v for k, v in new.items() if k != "version"}


def test_a_fault_event_of_a_newer_version_is_refused(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text(OLD_EVENTS + '{"version": 2, "event": "crash", "point": "x"}\n')
    with pytest.raises(RecordVersionError) as err:
        read_events(events, "fenced")  # refused even when another kind is asked for
    assert f"fault event {events} line 3 has format version 2" in str(err.value)


# -- verify.json --------------------------------------------------------------------------------

# benchmarks/results/verify-live-sqlite.json (today's shape) and kafka-campaign.json (an
# older one: elapsed_s, no stores), each cut to its first trial and kind.
OLD_REPORT = (
    '{"pipeline_file":"/tmp/i39camp/append.py","pipeline":"live-append","sink":"SQLiteSin'
    'k(sqlite:////tmp/i39camp/sink.db table=events_out mode=append)","stores":["SQLiteSin'
    'k(sqlite:////tmp/i39camp/sink.db table=events_out mode=append)"],"seed":1,"faults":['
    '"kill","crash-point","task-failure","db-drop","zombie"],"oracle":{"rows":1200,"batch'
    'es":4,"seconds":24.291052730000047,"first_commit_s":21.17,"batch_interval_s":0.65,"p'
    'hases":{"start_s":5.53,"plan_s":5.363,"first_batch_s":10.277}},"reference":{"matched'
    '":true,"rows":1200,"sparkonce_rows":1200,"batches":4,"seconds":26.6,"semantics":"app'
    'end","key_columns":[],"missing":0,"extra":0,"mismatched":0,"missing_examples":[],"ex'
    'tra_examples":[],"mismatched_examples":[]},"this_run":{"trials":5,"elapsed_s":291.2}'
    ',"trial_seconds":166.6,"summary":[{"kind":"kill","trials":1,"passed":1,"fired":1,"lo'
    'st_rows":0,"duplicated_rows":0,"value_mismatches":0,"recovery_mean_s":26.54438461699'
    '965,"recovery_p95_s":26.54438461699965,"inconsistent":0,"recovery_phases_mean_s":{"s'
    'tart_s":6.58,"plan_s":7.34,"first_batch_s":12.62},"live_observations":209,"live_anom'
    'alies":0}],"recovery_goal":{"recoveries":3,"p95_s":26.54,"cold_start_and_one_batch_s'
    '":21.17,"limit_s":31.76,"ratio":1.25,"met":true,"trials_at_a_time":1,"fair":true},"l'
    'ive":{"interval_s":0.25,"stores":[{"store":"store sqlite:////tmp/i39camp/sink.db (ou'
    'tput)","reader":"sqlite snapshot","trials":5,"observations":671,"anomalies":{"aborte'
    'd-read":0,"duplicate":0,"torn-batch":0,"non-monotonic":0},"examples":{},"read_errors'
    '":0}]},"trials":[{"trial":0,"seed":"1:0","fault":{"kind":"kill","point":null,"hit":1'
    ',"delay_s":0.17,"after_entries":3},"passed":true,"fault_fired":true,"lost_rows":0,"d'
    'uplicated_rows":0,"value_mismatches":0,"zombie_fenced":null,"ledger_problems":[],"re'
    'covery_s":26.54438461699965,"recovery_phases":{"start_s":6.583,"plan_s":7.339,"first'
    '_batch_s":12.622},"driver_runs":2,"seconds":52.11604513300017,"error":null,"quick_st'
    'art":true,"worker":0,"inconsistent":0,"inconsistencies":[],"outputs":{},"live":[{"st'
    'ore":"store sqlite:////tmp/i39camp/sink.db (output)","reader":"sqlite snapshot","obs'
    'ervations":209,"anomalies":{"aborted-read":0,"duplicate":0,"torn-batch":0,"non-monot'
    'onic":0},"examples":{},"read_errors":0}],"live_anomalies":0}]}'
)
OLDER_REPORT = (
    '{"pipeline_file":"/work/main/.cache/kafka-campaign/pipeline.py","pipeline":"kafka-ca'
    'mpaign","sink":"KafkaSink(127.0.0.1:39179 topic=kc-out)","seed":7,"faults":["kill","'
    'crash-point","task-failure","zombie"],"oracle":{"rows":1800,"batches":6,"seconds":61'
    '.90430781000032},"elapsed_s":1422.3,"summary":[{"kind":"kill","trials":3,"passed":3,'
    '"fired":3,"lost_rows":0,"duplicated_rows":0,"value_mismatches":0,"recovery_mean_s":4'
    '2.40830689199962,"recovery_p95_s":50.26687977999973}],"trials":[{"trial":0,"seed":"7'
    ':0","fault":{"kind":"kill","point":null,"hit":1,"delay_s":46.79},"passed":true,"faul'
    't_fired":true,"lost_rows":0,"duplicated_rows":0,"value_mismatches":0,"zombie_fenced"'
    ':null,"ledger_problems":[],"recovery_s":34.71890765199714,"driver_runs":2,"seconds":'
    '111.43738254900018,"error":null}]}'
)


@pytest.mark.parametrize("text", [OLD_REPORT, OLDER_REPORT], ids=["today", "older"])
def test_a_verify_report_without_a_version_resumes_and_shows(tmp_path: Path, text: str) -> None:
    doc = json.loads(text)
    path = tmp_path / "verify.json"
    path.write_text(text)
    recorded = load_report(path, doc["seed"], doc["faults"])
    [trial] = recorded.outcomes
    assert (trial.trial, trial.fault.kind, trial.passed) == (0, "kill", True)
    assert trial.fault.delay_s == doc["trials"][0]["fault"]["delay_s"]
    assert recorded.oracle_seconds == doc["oracle"]["seconds"]
    shown = load_verify_report(path)
    assert (shown["pipeline"], shown["trials"], shown["failed"]) == (doc["pipeline"], 1, 0)
    # Written again by the codec: the same report, with a version (an older report's
    # trials get today's fields, at their defaults).
    report = VerifyReport.decode(doc, "x")
    again = report.encode()
    assert again.pop("version") == 1
    assert VerifyReport.decode(again, "x") == report
    if text == OLD_REPORT:
        assert again == doc


def test_a_verify_report_of_a_newer_version_is_refused(tmp_path: Path) -> None:
    doc = {**json.loads(OLD_REPORT), "version": 2}
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(RecordVersionError) as err:
        load_report(path, doc["seed"], doc["faults"])
    message = str(err.value)
    assert f"verify report {path} has format version 2" in message
    assert "move it away (or give another --out)" in message
    with pytest.raises(RecordVersionError):
        load_verify_report(path)
    assert isinstance(err.value, ConfigError)  # the ui shows it as a report it cannot read


@pytest.mark.parametrize(("batch_id", "checkpoint_id"), [(12, None), (None, "chk-1"), (3, "chk-2")])
def test_a_sql_ledger_rows_optional_columns_are_read_each_from_its_own(
    batch_id: int | None, checkpoint_id: str | None
) -> None:
    """Each optional column is read on its own (ledger.records entry_from_row mutant 48 read
    the Spark batch id only when the checkpoint id was set)."""
    from sparkonce.ledger.records import ENTRY_VERSION, entry_from_row

    ranges = BatchRanges.from_json('{"t": {"0": [0, 5]}}')
    row = (
        4,
        ranges.to_json(),
        2,
        5,
        "2026-11-28T10:00:00+00:00",
        batch_id,
        checkpoint_id,
        None,
        1.5,
        ENTRY_VERSION,
    )
    entry = entry_from_row("p", row, "sparkonce_ledger")
    assert (entry.spark_batch_id, entry.checkpoint_id) == (batch_id, checkpoint_id)
    assert (entry.seq, entry.epoch, entry.row_count, entry.commit_seconds) == (4, 2, 5, 1.5)


@pytest.mark.parametrize(("stateful", "seconds"), [(1, None), (None, 0.25), (0, 2.0)])
def test_a_sql_ledger_rows_stateful_flag_is_read_on_its_own(
    stateful: int | None, seconds: float | None
) -> None:
    """The stateful flag is read from its own column, whatever commit_seconds holds
    (ledger.records entry_from_row mutant 55 tested commit_seconds for NULL instead)."""
    from sparkonce.ledger.records import ENTRY_VERSION, entry_from_row

    ranges = BatchRanges.from_json('{"t": {"0": [0, 5]}}')
    row = (4, ranges.to_json(), 2, 5, "2026-11-28T10:00:00+00:00", 7, "c", stateful, seconds)
    entry = entry_from_row("p", (*row, ENTRY_VERSION), "sparkonce_ledger")
    expected = None if stateful is None else bool(stateful)
    assert (entry.stateful, entry.commit_seconds) == (expected, seconds)
