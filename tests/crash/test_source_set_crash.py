"""SIGKILL the driver of a two-topic join (several sources) at every crash point, then recover.

The pipeline is tests/kafka/orders_payments.py's LEFT OUTER join of orders with payments
(two KafkaSource topics) into PostgreSQL (read back with psycopg) or into a Delta table
(read back with pyarrow from the files its log names), append mode, run as a real driver process
(``sparkonce run FILE``). The join reads three data batches, then a no-data batch (the
watermark passed the unmatched orders; it emits 87 of them). Run 1 dies at ``before-commit``
in batch 1, run 2 (same checkpoint) at ``after-rows`` in batch 2, run 3 at
``before-ledger-commit`` in the no-data batch, run 4 at ``after-ledger-commit`` of the no-data
batch (committed, but not in Spark's commit log); run 5 replays the no-data batch, skips it
as committed, and finishes. After every kill no row is seen twice and
none that the oracle lacks; at the end the table equals the oracle computed in plain Python
from the two inputs, each row once, and the ledger is a gap-free chain over both topics.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparkonce.offsets import check_chain
from sparkonce.protocol import CrashPoint
from sparkonce.sinks import sink_from_url
from sparkonce.verify.driver import Driver
from tests.crash.conftest import kill_chain
from tests.kafka import orders_payments as op
from tests.kafka.test_source_set import delta_pairs

pytestmark = pytest.mark.crash_lane  # make test runs the join in-process (tests/kafka)

PARTITIONS = 2

_FILE = '''"""The two-topic join crash-test pipeline (tests/crash/test_source_set_crash.py)."""

from sparkonce import KafkaSource, Pipeline, sink_from_url
from tests.kafka.orders_payments import join

pipeline = Pipeline(
    name="join-crash",
    sources={{
        "orders": KafkaSource({bootstrap!r}, {orders!r}, value_format="utf8",
                              max_records_per_partition=40),
        "payments": KafkaSource({bootstrap!r}, {payments!r}, value_format="utf8",
                                max_records_per_partition=40),
    }},
    transform=join,
    sink=sink_from_url({url!r}, "joined"),
    checkpoint={checkpoint!r},
    output_mode="append",
)
'''


@pytest.mark.parametrize("family", ["postgres", "delta"])
def test_kill_a_join_at_every_crash_point_then_recover(
    request: pytest.FixtureRequest,
    family: str,
    tmp_path: Path,
    kafka_broker: Any,
    kafka_topic: Callable[..., str],
    drivers: list[Driver],
) -> None:
    if family == "postgres":
        url: str = request.getfixturevalue("pg_url")

        def pairs() -> Counter[tuple[int, int | None]]:
            return op.read_pairs(url, "joined")
    else:
        request.getfixturevalue("spark")  # the ledger of a Delta table is read through Spark
        url = f"delta://{tmp_path / 'tables'}"

        def pairs() -> Counter[tuple[int, int | None]]:
            return delta_pairs(tmp_path / "tables" / "joined")

    orders, payments = kafka_topic("orders", PARTITIONS), kafka_topic("pays", PARTITIONS)
    op.produce(kafka_broker.bootstrap, orders, payments, PARTITIONS)
    pipeline_file = tmp_path / "pipeline.py"
    pipeline_file.write_text(
        _FILE.format(
            bootstrap=kafka_broker.bootstrap,
            orders=orders,
            payments=payments,
            url=url,
            checkpoint=str(tmp_path / "chk"),
        )
    )
    root = Path(__file__).resolve().parents[2]
    # This checkout's sparkonce, and tests.kafka importable by the pipeline file.
    env = {"PYTHONPATH": os.pathsep.join((str(root / "src"), str(root)))}
    want = op.expected()

    committed = [0]

    def check(_run: int, point: CrashPoint) -> None:
        seen = pairs()
        assert not +(seen - want), f"after the kill at {point}: {seen - want} beyond the oracle"
        ledger = _ledger(url)
        assert len(ledger) >= committed[0], f"the ledger shrank after the kill at {point}"
        committed[0] = len(ledger)

    last = kill_chain(
        pipeline_file,
        tmp_path,
        drivers,
        CrashPoint,
        # Runs 1-3 commit one batch each and die in the next; run 4 dies right after the
        # no-data batch's commit, before Spark's commit log has it.
        hit=lambda _run, point: 1 if point is CrashPoint.AFTER_LEDGER_COMMIT else 2,
        check=check,
        env=env,
    )
    assert "no-data batch already committed" in last.log_path.read_text(errors="replace"), (
        last.log_tail()
    )
    got = pairs()
    assert got == want, f"missing {want - got}, extra {got - want}\n{last.log_tail()}"
    ledger = _ledger(url)
    assert check_chain(e.ranges for e in ledger) == []
    assert [e.seq for e in ledger] == list(range(len(ledger)))
    assert all({r.topic for r in e.ranges.ranges} == {orders, payments} for e in ledger)
    assert ledger[-1].ranges.empty and ledger[-1].row_count > 0  # the no-data batch's rows
    assert sum(e.row_count for e in ledger) == sum(want.values())


def _ledger(url: str) -> list[Any]:
    sink = sink_from_url(url, "joined")
    try:
        return sink.ledger("join-crash")
    finally:
        sink.close()
