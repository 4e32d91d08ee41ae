"""Protocol bugs the simulation found in the real committer, now fixed: regression tests.

Found 2026-11-22 with ``python -m sparkonce.verify.simulation --schedules 8000 --restore``
(8 of 8,000 schedules fail; none fail without ``--restore``). Replay one with
``python -m sparkonce.verify.sim --replay SEED`` (restores are on by default now).

A run whose checkpoint is **older than the ledger by more than one batch** (restored
from a backup, DESIGN.md section 2: a process's local disk may be lost with it) makes
the real protocol lose or duplicate:

* seed 606, duplicates: the restored run plans a batch with a new range in one partition
  and an *empty* range, behind the ledger's end, in another. ``offsets.classify`` skips
  empty ranges behind the committed end, so the batch is NEW; its ledger entry records
  that partition's end *backwards*, the ledger's resume point (the newest entry's ends)
  regresses, and the next run commits those offsets again (``check_chain`` reports the
  overlap).
* seed 2124, loss: the restored run's no-data batch has the same (checkpoint id, Spark
  batch id) as a *data* batch the older lineage committed. ``find_no_data_batch``
  matches on that identity alone, so the no-data batch is "already committed" and its
  rows (a timer, a closed window) are never written.

Both are fixed (``classify`` counts an empty range behind the ledger as old;
``find_no_data_batch`` matches only entries with empty ranges), and restored checkpoints
are now part of every schedule by default (``generate(seed)``; ``--no-restore`` and
``generate(seed, with_restore=False)`` leave them out).

Both schedules are stored as data (``regressions/restore-seed606-duplicate.json`` and
``regressions/restore-seed2124-loss.json``) and replayed by ``test_regressions.py``, so
they no longer depend on ``generate`` never changing.
"""

from __future__ import annotations

from tests.sim.planted import REGRESSIONS

STORED = ("restore-seed606-duplicate", "restore-seed2124-loss")


def test_the_restored_checkpoint_schedules_are_stored() -> None:
    for name in STORED:
        assert (REGRESSIONS / f"{name}.json").is_file(), name
