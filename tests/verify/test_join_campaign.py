"""``sparkonce verify`` on a pipeline with several sources: the watermarked stream-stream
join of two Kafka topics (tests/kafka/orders_payments.py) into SQLite, append mode.

The reference run gives the transform each source's plain stream by name, as the runner
does; the trials compare with the failure-free run. The store is read once more at the end
with sqlite3 and compared with the join's plain-Python oracle (``expected``), which shares
no code with Spark or sparkonce: every (order, payment) pair, and every unmatched order
(the no-data batch's rows), exactly once.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkonce.cli import main
from tests.kafka import orders_payments as op

pytestmark = pytest.mark.crash

_PIPELINE = """
from sparkonce import KafkaSource, Pipeline, SQLiteSink
from tests.kafka.orders_payments import join

pipeline = Pipeline(
    name="verify-join",
    sources={{
        "orders": KafkaSource({boot!r}, {orders!r}, value_format="utf8",
                              max_records_per_partition=40),
        "payments": KafkaSource({boot!r}, {payments!r}, value_format="utf8",
                                max_records_per_partition=40),
    }},
    transform=join,
    sink=SQLiteSink("sqlite:///{root}/joined.db", "joined"),
    checkpoint="{root}/checkpoint",
    output_mode="append",
)
"""


@pytest.mark.campaign_lane
def test_a_two_topic_join_passes_verify_and_equals_the_plain_python_join(
    tmp_path: Path,
    kafka_broker: Any,
    kafka_topic: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    orders, payments = kafka_topic("orders", 2), kafka_topic("pays", 2)
    op.produce(kafka_broker.bootstrap, orders, payments, 2)
    pipeline = tmp_path / "pipeline.py"
    pipeline.write_text(
        _PIPELINE.format(
            boot=kafka_broker.bootstrap, orders=orders, payments=payments, root=tmp_path
        )
    )
    # The trial drivers import tests.kafka from this checkout.
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    store = tmp_path / "store.db"
    out = tmp_path / "out"
    code = main(
        [
            "verify",
            str(pipeline),
            "--trials",
            "2",
            "--faults",
            "crash-point,zombie",
            "--sink",
            f"sqlite:///{store}",
            "--out",
            str(out),
        ]
    )
    report = json.loads((out / "verify.json").read_text())
    assert code == 0, report["summary"]
    assert report["reference"]["matched"] is True, report["reference"]
    assert [t["passed"] for t in report["trials"]] == [True, True]
    assert all(t["fault_fired"] for t in report["trials"]), report["trials"]
    assert [t["fault"]["kind"] for t in report["trials"]] == ["crash-point", "zombie"]
    # The last trial's table, read with sqlite3, against the join computed in Python.
    with sqlite3.connect(store) as conn:
        rows = conn.execute("SELECT order_id, pay_id FROM joined").fetchall()
    got = Counter((int(o), None if p is None else int(p)) for o, p in rows)
    want = op.expected()
    assert got == want, f"missing {want - got}, extra {got - want}"
    assert sum(1 for (_, p) in want.elements() if p is None) > 0  # unmatched orders, too
