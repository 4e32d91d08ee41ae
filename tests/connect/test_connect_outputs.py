"""Several outputs, stable output, dead letters and dedupe on a real Spark Connect session.

The batch function carries the pipeline's outputs to the server's Python worker, which
opens every store there and commits the stores one after the other, each with the epoch
its own store gave the run. The stores are read with the sqlite3 module and psycopg, never
with sparkonce's readers."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, Pipeline, PostgresSink, SQLiteSink
from sparkonce.faults import FaultPlan
from sparkonce.log import IdempotentProducer, Topic
from sparkonce.outputs import parse_json

# In the CI rotation, as the other Connect tests (one more JVM than make test can pay for).
pytestmark = pytest.mark.campaign_lane

NAME = "outs"
USERS = 5
LIMIT = 30  # records per log partition and batch


def write_records(root: Path, first: int, last: int) -> Path:
    """Records ``first..last`` into topic 'events' (3 partitions): a JSON object each, but
    every seventh is not JSON (a dead letter). Returns the log directory."""
    topic = Topic.create(root, "events", 3, exist_ok=True)
    with topic, IdempotentProducer(topic, "outputs-producer") as producer:
        for i in range(first, last + 1):
            value = b"{oops" if i % 7 == 0 else json.dumps({"user": f"u{i % USERS}", "n": i})
            producer.send(value if isinstance(value, bytes) else value.encode(), f"k{i}".encode())
    return root


def transform(df: DataFrame) -> dict[str, DataFrame]:
    """Per-user totals (stateful), the malformed records, and each good record with a
    ``uuid()`` into both stores: stable output must give both the same uuid."""
    parsed = parse_json(df, "user STRING, n BIGINT", required=("user", "n"))
    good = parsed.good.withColumn("event_id", F.expr("uuid()"))
    totals = good.groupBy(F.col("data.user").alias("user")).agg(
        F.sum("data.n").alias("total"), F.count("*").alias("records")
    )
    accepted = good.select("record_id", F.col("data.n").alias("n"), "event_id")
    return {"totals": totals, "dead_letters": parsed.bad, "accepted": accepted, "audit": accepted}


def outputs_pipeline(tmp_path: Path, log_dir: Path, pg_url: str) -> Pipeline:
    """Three outputs in SQLite (one transaction) and one in PostgreSQL; stable output is on
    by default across two stores."""
    db = f"sqlite:///{tmp_path / 'a.db'}"
    return Pipeline(
        name=NAME,
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=LIMIT),
        transform=transform,
        outputs={
            "totals": SQLiteSink(db, "totals", mode="upsert", keys=["user"]),
            "dead_letters": SQLiteSink(db, "dead_letters"),
            "accepted": SQLiteSink(db, "accepted"),
            "audit": PostgresSink(pg_url, "audit"),
        },
        checkpoint=tmp_path / "chk",
    )


def sqlite_rows(tmp_path: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(tmp_path / "a.db") as conn:
        return conn.execute(sql).fetchall()


def pg_rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url) as conn:
        return list(conn.execute(sql).fetchall())


def ledger(rows: list[tuple[Any, ...]]) -> list[tuple[int, int, str]]:
    return [(int(seq), int(epoch), str(ranges)) for seq, epoch, ranges, _ in rows]


def rows_of_epoch(rows: list[tuple[Any, ...]], epoch: int) -> int:
    """The rows a store's ledger says the run of ``epoch`` committed there."""
    return sum(int(n) for _, e, _, n in rows if e == epoch)


LEDGER_SQL = (
    "SELECT seq, epoch, ranges, row_count FROM sparkonce_ledger "
    f"WHERE pipeline='{NAME}' ORDER BY seq"
)


def check_exact(tmp_path: Path, pg_url: str, last: int) -> None:
    """Every output equals a failure-free run's over records 1..last, and both stores hold
    the same uuid of each good record."""
    good = [i for i in range(1, last + 1) if i % 7]
    totals = {
        u: (t, n) for u, t, n in sqlite_rows(tmp_path, "SELECT user, total, records FROM totals")
    }
    want: dict[str, tuple[int, int]] = {}
    for i in good:
        t, n = want.get(f"u{i % USERS}", (0, 0))
        want[f"u{i % USERS}"] = (t + i, n + 1)
    assert totals == want
    dead = sqlite_rows(tmp_path, "SELECT value, error_class, pipeline, batch_seq FROM dead_letters")
    assert len(dead) == last // 7, f"{len(dead)} dead letters, want {last // 7}"
    assert {(v, e, p) for v, e, p, _ in dead} == {(b"{oops", "MALFORMED_JSON", NAME)}
    seqs = {s for s, _, _ in ledger(sqlite_rows(tmp_path, LEDGER_SQL))}
    assert {s for *_, s in dead} <= seqs, "a dead letter names a batch its store has not"
    accepted = sqlite_rows(tmp_path, "SELECT n, event_id FROM accepted")
    audit = pg_rows(pg_url, "SELECT n, event_id FROM audit")
    for rows, where in ((accepted, "accepted"), (audit, "audit")):
        counts = Counter(n for n, _ in rows)
        assert sorted(counts) == good, f"{where}: records missing or extra"
        assert set(counts.values()) == {1}, f"{where}: a record written twice"
    assert dict(accepted) == dict(audit), "the two stores hold different uuids"


def forget_last_commit(checkpoint: Path) -> int:
    last = max(int(n.name) for n in (checkpoint / "commits").iterdir() if n.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    return last


def take_an_epoch_in_postgres(pg_url: str) -> None:
    """Make PostgreSQL's epochs run ahead of SQLite's: each store must fence with its own."""
    sink = PostgresSink(pg_url, "audit")
    sink.open()
    try:
        sink.acquire(NAME)
    finally:
        sink.close()


def test_several_outputs_in_two_stores_on_connect_are_exact_across_a_replay(
    connect_spark: SparkSession, tmp_path: Path, pg_url: str
) -> None:
    """SQLite (totals, dead letters, accepted: one transaction) and PostgreSQL (audit), with
    stable output, committed in the server's worker, each store with its own epoch. After
    Spark forgets its last batch, the replay is skipped in both stores; every output is
    exact and both stores hold the same uuids."""
    log_dir = write_records(tmp_path / "log", 1, 210)
    take_an_epoch_in_postgres(pg_url)
    p = outputs_pipeline(tmp_path, log_dir, pg_url)
    first = p.run(connect_spark)
    check_exact(tmp_path, pg_url, 210)
    a, b = ledger(sqlite_rows(tmp_path, LEDGER_SQL)), ledger(pg_rows(pg_url, LEDGER_SQL))
    assert len(a) == first.batches_committed >= 3, first
    assert [(s, r) for s, _, r in a] == [(s, r) for s, _, r in b]
    assert {e for _, e, _ in a} == {1} and {e for _, e, _ in b} == {2}
    # The client's report, from both ledgers: every store's rows, as a classic run counts.
    rows = rows_of_epoch(sqlite_rows(tmp_path, LEDGER_SQL), 1)
    assert first.rows_committed == rows + rows_of_epoch(pg_rows(pg_url, LEDGER_SQL), 2)
    stable = tmp_path / "chk" / "sparkonce" / "stable"
    assert not [d for d in stable.iterdir() if not d.name.startswith(".")], "copies not collected"

    forget_last_commit(tmp_path / "chk")
    write_records(tmp_path / "log", 211, 280)
    again = p.run(connect_spark)
    assert again.batches_skipped == 1, again
    check_exact(tmp_path, pg_url, 280)
    a, b = ledger(sqlite_rows(tmp_path, LEDGER_SQL)), ledger(pg_rows(pg_url, LEDGER_SQL))
    assert [(s, r) for s, _, r in a] == [(s, r) for s, _, r in b]
    assert {e for _, e, _ in a} == {1, 2} and {e for _, e, _ in b} == {2, 3}


def test_a_crash_between_two_stores_commits_on_connect_then_the_rerun_is_exact(
    connect_spark: SparkSession, tmp_path: Path, pg_url: str
) -> None:
    """SIGKILL of the server's Python worker right after SQLite committed the second batch
    and before PostgreSQL did (the third after-ledger-commit: two per batch). The run fails;
    the batch's stable copy stays. The rerun skips it in SQLite, commits it in PostgreSQL
    from that copy (the same uuids), and every output is exact."""
    log_dir = write_records(tmp_path / "log", 1, 210)
    p = outputs_pipeline(tmp_path, log_dir, pg_url)
    events = tmp_path / "events.jsonl"
    plan = FaultPlan.from_env(
        {"SPARKONCE_CRASH_AT": "after-ledger-commit@3", "SPARKONCE_FAULT_EVENTS": str(events)}
    )
    with pytest.raises(Exception) as died:  # the worker's death, in Spark's words
        p.run(connect_spark, faults=plan)
    fired = [json.loads(line) for line in events.read_text().splitlines()]
    crash = [(e["point"], e["hit"]) for e in fired if e["event"] == "crash"]
    assert crash == [("after-ledger-commit", 3)], (fired, str(died.value)[-3000:])
    a, b = ledger(sqlite_rows(tmp_path, LEDGER_SQL)), ledger(pg_rows(pg_url, LEDGER_SQL))
    assert (len(a), len(b)) == (2, 1), (a, b)
    stable = tmp_path / "chk" / "sparkonce" / "stable"
    kept = [d for d in stable.iterdir() if not d.name.startswith(".")]
    assert len(kept) == 1, "the second batch's copy is kept until PostgreSQL has it"

    again = p.run(connect_spark)
    assert again.epoch == 2, again
    # The batch PostgreSQL missed counts as committed (its rows alone), not as skipped.
    assert (again.batches_skipped, again.batches_committed) == (0, len(again.batches)), again
    pg_again = rows_of_epoch(pg_rows(pg_url, LEDGER_SQL), 2)
    assert again.rows_committed == rows_of_epoch(sqlite_rows(tmp_path, LEDGER_SQL), 2) + pg_again
    check_exact(tmp_path, pg_url, 210)
    a, b = ledger(sqlite_rows(tmp_path, LEDGER_SQL)), ledger(pg_rows(pg_url, LEDGER_SQL))
    assert [(s, r) for s, _, r in a] == [(s, r) for s, _, r in b]
    assert not [d for d in stable.iterdir() if not d.name.startswith(".")]


def test_dedupe_on_connect_removes_what_the_rule_says_and_counts_it_from_the_progress(
    connect_spark: SparkSession, tmp_path: Path
) -> None:
    """tests/outputs/test_dedup.py's named cases (copies in one batch and across batches,
    a copy past the bound, late copies, NULL ids, no event time) through dedupe and a late
    output, committed in the server's worker: the kept and late records are the plain
    Python oracle's, batch by batch the counts the client reads from Spark's progress are
    the oracle's, and a replay after Spark forgot its last batch changes nothing."""
    from sparkonce.outputs import DedupCounts
    from tests.outputs.test_dedup import named_cases_pipeline

    p, _batches, expected = named_cases_pipeline(tmp_path, tmp_path / "chk")
    report = p.run(connect_spark)

    def outputs() -> tuple[list[int], list[int]]:
        with sqlite3.connect(tmp_path / "out.db") as conn:
            kept = sorted(n for (n,) in conn.execute("SELECT n FROM events"))
            late = sorted(n for (n,) in conn.execute("SELECT n FROM late"))
        return kept, late

    want = (
        sorted(n for e in expected for n in e.kept),
        sorted(n for e in expected for n in e.late),
    )
    assert outputs() == want
    for b, exp in enumerate(expected):
        counts = DedupCounts(b, exp.nulls, exp.duplicates, len(exp.late), exp.state)
        assert report.dedup.get(b) == counts, f"batch {b}"

    forget_last_commit(tmp_path / "chk")
    again = p.run(connect_spark)
    assert again.batches_skipped == 1, again
    assert outputs() == want
