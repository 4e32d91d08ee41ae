"""10,000 generated records, most of them malformed, through a real pipeline that crashes.

The records come from :mod:`tests.outputs.badinput` (hypothesis strategies, with an oracle
written without sparkonce). A pipeline file parses them with ``parse_json`` and writes the
good rows to one SQLite store and the dead letters to another (so stable output is on).
A real driver (``sparkonce run``) is SIGKILLed twice at protocol steps, once inside the
second store's transaction of a batch whose first store has committed, once after a
store's commit before Spark's commit log, and then run to the end. Afterwards:

* every good record is in the good output exactly once, with the oracle's values;
* the dead letters hold exactly the bad records, each once, with the oracle's error class
  and the record's own key and value bytes;
* nothing else is in either output, and both stores' ledgers end at the log's end.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkonce.protocol import CrashPoint
from sparkonce.verify.driver import Driver
from tests.outputs.badinput import REQUIRED, SCHEMA, Bad, Good, Record, generate, write_to_log

pytestmark = pytest.mark.spark

COUNT = 10_000
SEED = 23
NAME = "bad-input"

PIPELINE = '''"""Bad input at volume, written by tests/outputs/test_bad_input_pipeline.py."""
from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink
from sparkonce.outputs import parse_json


def transform(df):
    parsed = parse_json(df, {schema!r}, required={required!r})
    good = parsed.good.select(
        "record_id",
        F.col("data.user").alias("user"),
        F.col("data.amount").alias("amount"),
        F.col("data.price").alias("price"),
        F.to_json("data.tags").alias("tags"),
        F.col("data.meta").isNotNull().alias("has_meta"),
        F.col("data.meta.src").alias("meta_src"),
        F.col("data.meta.n").alias("meta_n"),
    )
    return {{"good": good, "dead_letters": parsed.bad}}


pipeline = Pipeline(
    name={name!r},
    source=EmbeddedLogSource({log!r}, "events", max_records_per_partition=2500),
    transform=transform,
    outputs={{
        "good": SQLiteSink({good!r}, "good"),
        "dead_letters": SQLiteSink({bad!r}, "dead_letters"),
    }},
    checkpoint={checkpoint!r},
)
'''


def _good_row(values: dict[str, Any]) -> tuple[Any, ...]:
    meta = values.get("meta")
    tags = values.get("tags")
    return (
        values.get("user"),
        values.get("amount"),
        values.get("price"),
        None if tags is None else tags,
        meta is not None,
        None if meta is None else meta.get("src"),
        None if meta is None else meta.get("n"),
    )


def _same_value(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, (float, int)):
        return float(got) == want or (math.isnan(want) and math.isnan(float(got)))
    return bool(got == want)


# In the rotation, not make test (45 s there): make test keeps the fast bad-input tests, and
# this file's driver kills are the crash lane's kind of test.
@pytest.mark.crash_lane
def test_bad_input_at_volume_survives_crashes(tmp_path: Path) -> None:
    records: list[Record] = generate(COUNT, SEED)
    by_id = write_to_log(tmp_path / "log", records, partitions=2)
    bad_ids = {i for i, r in by_id.items() if isinstance(r.expected, Bad)}
    assert len(bad_ids) >= COUNT // 2

    good_db, bad_db = tmp_path / "good.db", tmp_path / "bad.db"
    path = tmp_path / "pipeline.py"
    path.write_text(
        PIPELINE.format(
            schema=SCHEMA,
            required=REQUIRED,
            name=NAME,
            log=str(tmp_path / "log"),
            good=f"sqlite:///{good_db}",
            bad=f"sqlite:///{bad_db}",
            checkpoint=str(tmp_path / "ckpt"),
        )
    )
    # Two batches of 5,000. Hit 2 of after-rows: inside the dead-letter store's transaction
    # of batch 0, after the good store committed it. Then, in the restarted run, hit 3 of
    # after-ledger-commit: batch 0 replayed into the dead-letter store (1), batch 1 into the
    # good store (2) and the dead-letter store (3), before Spark's commit log.
    for n, (point, hit) in enumerate(
        [(CrashPoint.AFTER_ROWS, 2), (CrashPoint.AFTER_LEDGER_COMMIT, 3)]
    ):
        crashed = Driver(path, tmp_path / f"crash{n}.log", crash_at=point, crash_hit=hit)
        assert crashed.start().wait(timeout=400) == -9, crashed.log_tail(30)
    final = Driver(path, tmp_path / "final.log")
    assert final.start().wait(timeout=400) == 0, final.log_tail(30)

    with sqlite3.connect(good_db) as conn:
        good = conn.execute(
            "SELECT record_id, user, amount, price, tags, has_meta, meta_src, meta_n FROM good"
        ).fetchall()
        good_ends = conn.execute("SELECT ranges FROM sparkonce_ledger ORDER BY seq").fetchall()
    with sqlite3.connect(bad_db) as conn:
        bad = conn.execute(
            "SELECT record_id, key, value, error_class, error, pipeline FROM dead_letters"
        ).fetchall()
        bad_ends = conn.execute("SELECT ranges FROM sparkonce_ledger ORDER BY seq").fetchall()

    # Nothing lost, nothing twice, nothing in the wrong output.
    good_count = Counter(r[0] for r in good)
    bad_count = Counter(r[0] for r in bad)
    assert max(good_count.values()) == 1 and max(bad_count.values()) == 1
    assert set(bad_count) == bad_ids
    assert set(good_count) == set(by_id) - bad_ids
    # The good values are the oracle's.
    wrong = []
    for record_id, *got in good:
        want = by_id[record_id].expected
        assert isinstance(want, Good)
        row = list(got)
        row[3] = None if row[3] is None else json.loads(row[3])
        row[4] = bool(row[4])
        if not all(_same_value(g, w) for g, w in zip(row, _good_row(want.values), strict=True)):
            wrong.append((record_id, row, want.values))
    assert not wrong, f"{len(wrong)} good rows differ from the oracle, e.g. {wrong[:2]}"
    # The dead letters are the oracle's, with the record's own bytes and a message.
    for record_id, key, value, error_class, error, pipeline in bad:
        record = by_id[record_id]
        assert isinstance(record.expected, Bad)
        assert error_class == record.expected.error_class, (record_id, error_class, record.kind)
        assert (key, value) == (record.key, record.value)
        assert error and pipeline == NAME
    # Both stores ended at the same batch.
    assert good_ends == bad_ends and good_ends
