"""A pipeline with three outputs in two stores, for the multi-output tests.

``write_log`` writes JSON records (every seventh one malformed) into an embedded log;
``pipeline_text`` is a pipeline file that parses them and writes:

* ``totals``: per-user sum and count (stateful, upsert) into store A;
* ``dead_letters``: the malformed records into store A (same transaction as ``totals``);
* ``accepted``: each good record's ``record_id`` and a ``uuid()`` ``event_id`` into store A;
* ``audit``: the same DataFrame as ``accepted`` into store B.

``accepted`` and ``audit`` must hold the same ``event_id`` for every record after any crash:
that is what stable output promises across stores.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

RECORDS = 420
PARTITIONS = 3
LIMIT = 35  # per partition and batch: 5 batches (the partitions differ in size)
USERS = 5
TOPIC = "events"

PIPELINE = '''"""Multi-output test pipeline, written by tests/outputs/multi_pipeline.py."""
from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink
from sparkonce.outputs import parse_json


def transform(df):
    parsed = parse_json(df, "user STRING, amount BIGINT", required=("user", "amount"))
    good = parsed.good.withColumn("event_id", F.expr("uuid()"))
    totals = good.groupBy(F.col("data.user").alias("user")).agg(
        F.sum("data.amount").alias("total"), F.count("*").alias("records")
    )
    accepted = good.select("record_id", "event_id")
    return {{"totals": totals, "dead_letters": parsed.bad, "accepted": accepted, "audit": accepted}}


pipeline = Pipeline(
    name={name!r},
    source=EmbeddedLogSource({log_dir!r}, {topic!r}, max_records_per_partition={limit}),
    transform=transform,
    outputs={{
        "totals": SQLiteSink({store_a!r}, "totals", mode="upsert", keys=["user"]),
        "dead_letters": SQLiteSink({store_a!r}, "dead_letters"),
        "accepted": SQLiteSink({store_a!r}, "accepted"),
        "audit": SQLiteSink({store_b!r}, "audit"),
    }},
    checkpoint={checkpoint!r},
    stable_output={stable!r},
)
'''


def write_log(root: Path) -> Path:
    """The input: ``RECORDS`` values, every seventh one not JSON; returns the log dir."""
    from sparkonce.log import IdempotentProducer, Topic

    log_dir = root / "log"
    topic = Topic.create(log_dir, TOPIC, PARTITIONS, exist_ok=True)
    with topic, IdempotentProducer(topic, "multi-producer") as producer:
        for i in range(RECORDS):
            value = (
                b"{not json"
                if i % 7 == 0
                else json.dumps({"user": f"u{i % USERS}", "amount": i}).encode()
            )
            producer.send(value, f"k{i}".encode())
    return log_dir


def expected() -> dict[str, Any]:
    """What a failure-free run must write, computed from the input's definition alone."""
    totals: dict[str, tuple[int, int]] = {}
    bad = 0
    for i in range(RECORDS):
        if i % 7 == 0:
            bad += 1
            continue
        user = f"u{i % USERS}"
        total, n = totals.get(user, (0, 0))
        totals[user] = (total + i, n + 1)
    return {"totals": totals, "bad": bad, "good": RECORDS - bad}


def pipeline_text(
    *,
    name: str,
    log_dir: Path,
    store_a: str,
    store_b: str,
    checkpoint: Path,
    stable: bool | None = None,
) -> str:
    return PIPELINE.format(
        name=name,
        log_dir=str(log_dir),
        topic=TOPIC,
        limit=LIMIT,
        store_a=store_a,
        store_b=store_b,
        checkpoint=str(checkpoint),
        stable=stable,
    )


def load(text: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(text, "<multi-output pipeline>", "exec"), namespace)
    return namespace["pipeline"]


def _rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def check_outputs(store_a: str, store_b: str, name: str) -> dict[str, Any]:
    """Assert the outputs equal :func:`expected` and agree across stores; return details."""
    want = expected()
    totals = {u: (t, n) for u, t, n in _rows(store_a, "SELECT user, total, records FROM totals")}
    assert totals == want["totals"]
    dead = _rows(
        store_a,
        "SELECT record_id, value, error_class, pipeline, batch_seq FROM dead_letters",
    )
    assert len(dead) == want["bad"]
    assert Counter(r[0] for r in dead).most_common(1)[0][1] == 1, "a dead letter twice"
    assert {r[1] for r in dead} == {b"{not json"}
    assert {r[2] for r in dead} == {"MALFORMED_JSON"}
    assert {r[3] for r in dead} == {name}
    seqs = {
        s for (s,) in _rows(store_a, f"SELECT seq FROM sparkonce_ledger WHERE pipeline='{name}'")
    }
    assert {r[4] for r in dead} <= seqs, "a dead letter names a batch that is not in the ledger"
    accepted = _rows(store_a, "SELECT record_id, event_id FROM accepted")
    audit = _rows(store_b, "SELECT record_id, event_id FROM audit")
    for rows, where in ((accepted, "accepted"), (audit, "audit")):
        ids = Counter(r[0] for r in rows)
        assert len(ids) == want["good"], f"{where}: {len(ids)} records, want {want['good']}"
        assert max(ids.values()) == 1, f"{where}: a record written twice"
    assert dict(accepted) == dict(audit), "the two stores hold different event ids"
    return {"dead": dead, "accepted": dict(accepted)}


def ledger_ends(url: str, name: str) -> list[tuple[Any, ...]]:
    return _rows(
        url, f"SELECT seq, ranges FROM sparkonce_ledger WHERE pipeline='{name}' ORDER BY seq"
    )
