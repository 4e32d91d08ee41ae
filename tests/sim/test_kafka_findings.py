"""What the simulation found in the Kafka sink (both fixed 2026-11-23): regression tests.

**A partly committed no-data batch is not refused** (found 2026-11-22, seed 1225 of
``python -m sparkonce.verify.sim --store kafka --seed 1000 --schedules 400``; 1 of 400).
Shrunk to three events: a run commits a data batch, then a no-data batch (one timer
row, the output of a window closed by the watermark) whose tasks commit their records
and markers; the driver crashes before its ledger commit. The next run's checkpoint is
lost; it plans a data batch from the ledger's end. ``KafkaSink._check_pending`` skips
markers whose ranges end at the ledger's end, which every no-data batch's markers do,
so it does not refuse the batch as the sink's documentation promises ("Lost checkpoint
mid-batch: ... stops with a LedgerError naming the batch"). The timer row stays visible
to ``read_committed`` readers with no ledger entry covering it (a SQL sink leaves
nothing visible after the same crash).

How far it reaches: a no-data batch only happens in a stateful query, and the runner
refuses an empty checkpoint of a pipeline whose ledger says it is stateful
(``CheckpointLostError``); the record escapes when the pipeline is declared
``stateful=False``, or the operator resumes anyway. The fix belongs in
``_check_pending`` (a no-data batch's markers carry its Spark identity: a batch with
another identity must be refused, or the markers' batch finished first).

**A zombie's no-data batch, written after a newer run moved on, blocks every later
batch** (found 2026-11-22, seed 117 of the default Kafka campaign, 1 of 150). Shrunk to
eleven events: run 0 commits a batch, plans a no-data batch and freezes before its
tasks start (a zombie: its driver passed its early fence check). Run 1 (checkpoint
lost) commits the next data batch. The final run thaws the zombie: its tasks do not
check the epoch, and ``_marker_is_for`` only recognises a no-data batch by identical
ranges, so they write the timer row and their markers (ranges behind the ledger's
end) before the zombie's driver is fenced. From then on every task of every run reads
that stale marker as its latest and refuses its batch: ``classify`` against the
marker's ends says records "would be skipped" (LedgerError, naming the marker's end as
the ledger's). The pipeline cannot make progress (no operator action in the message
helps), and the zombie's timer row is visible with no ledger entry. A data batch's
zombie does not do this: its tasks find the newer markers past their ranges and skip.

**The fixes** (``sinks/kafka.py``): the driver's ``_check_pending`` looks at every
marker written after the last batch entry (``LedgerState.pending``) and refuses a
no-data batch's markers unless they name the same Spark batch; markers behind the
ledger's end (a fenced attempt's, too late) are passed over. A task reads the ledger
after ``init_transactions`` and writes nothing when a newer owner record is there (the
driver then raises ``FencedError``); it looks for its own marker among all pending
ones, so a stale marker neither blocks it nor hides its own.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from sparkonce.verify.sim import (
    Failure,
    Schedule,
    Stats,
    TargetSpec,
    close_target,
    generate,
    run_schedule,
)

pytestmark = pytest.mark.kafka

SEED = 1225
EVENTS = (
    '[{"type":"start","keep_checkpoint":true,"max_per_partition":null,"max_total":null,'
    '"restore":0},{"type":"step","nodata":false,"crash":null,"drop":false,"lost_ack":false,'
    '"fail":false,"freeze":false,"quiet":false},{"type":"step","nodata":true,'
    '"crash":["before-ledger-commit",1],"drop":false,"lost_ack":false,"fail":false,'
    '"freeze":false,"quiet":false}]'
)


STALE_MARKER_SEED = 117
STALE_MARKER_EVENTS = (
    '[{"type":"start","keep_checkpoint":true,"max_per_partition":8,"max_total":null,'
    '"restore":0},{"type":"step","nodata":true,"crash":null,"drop":false,"lost_ack":false,'
    '"fail":false,"freeze":false,"quiet":false},{"type":"step","nodata":false,'
    '"crash":["before-ledger-commit",1],"drop":false,"lost_ack":false,"fail":false,'
    '"freeze":false,"quiet":false},{"type":"step","nodata":true,"crash":null,"drop":false,'
    '"lost_ack":false,"fail":false,"freeze":true,"quiet":false},{"type":"step",'
    '"nodata":false,"crash":null,"drop":false,"lost_ack":false,"fail":false,"freeze":false,'
    '"quiet":false},{"type":"start","keep_checkpoint":false,"max_per_partition":2,'
    '"max_total":7,"restore":0},{"type":"step","nodata":false,"crash":null,"drop":false,'
    '"lost_ack":false,"fail":false,"freeze":false,"quiet":false},{"type":"repeat"},'
    '{"type":"grow","partition":1,"count":1},{"type":"grow","partition":1,"count":1},'
    '{"type":"step","nodata":false,"crash":null,"drop":false,"lost_ack":false,"fail":false,'
    '"freeze":false,"quiet":false}]'
)


def _run(bootstrap: str, seed: int, events: str) -> tuple[list[Failure], Stats]:
    schedule = replace(generate(seed), events=Schedule.parse_events(events))
    target = TargetSpec("kafka", bootstrap, namespace=uuid.uuid4().hex[:6]).build()
    try:
        return run_schedule(schedule, target)
    finally:
        close_target(target)


def test_partly_committed_no_data_batch_then_lost_checkpoint(kafka_broker) -> None:
    failures, stats = _run(kafka_broker.bootstrap, SEED, EVENTS)
    assert not failures, "\n".join(map(str, failures))
    # The run with the lost checkpoint was refused (LedgerError); the operator restored
    # the checkpoint, and the no-data batch completed.
    assert stats.refused >= 1 and stats.nodata >= 1


def test_zombie_no_data_batch_after_a_newer_run_moved_on(kafka_broker) -> None:
    failures, stats = _run(kafka_broker.bootstrap, STALE_MARKER_SEED, STALE_MARKER_EVENTS)
    assert not failures, "\n".join(map(str, failures))
    assert stats.fenced >= 1  # the thawed zombie
