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

Both shrunk schedules are stored as data
(``regressions/kafka-seed1225-partly-committed-no-data-batch.json``, which must reach a
refused run and a no-data batch, and ``regressions/kafka-seed117-zombie-no-data-batch.json``,
which must reach a fenced zombie) and replayed on a broker by ``test_regressions.py``.
"""

from __future__ import annotations

from tests.sim.planted import REGRESSIONS

STORED = ("kafka-seed1225-partly-committed-no-data-batch", "kafka-seed117-zombie-no-data-batch")


def test_the_kafka_findings_are_stored() -> None:
    for name in STORED:
        assert (REGRESSIONS / f"{name}.json").is_file(), name
