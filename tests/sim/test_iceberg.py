"""The Iceberg ledger through the committer's simulation (real PyIceberg commits on a
SQLite SQL catalog, Arrow batches, no Spark), and a planted bug it catches.

The planted bug needs two halves, because the Iceberg store checks the epoch twice: the
committer's step 1 (``SkipsEpochCheck``, the committer's seam) and the store's own check
on the metadata the catalog commits on (:class:`SkipsCommitEpochCheck`, the store's
``_already`` and ``_requirement``). Either half alone is still fenced.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sparkonce.errors import FencedError
from sparkonce.ledger.base import LedgerEntry
from sparkonce.ledger.iceberg import PipelineAt
from sparkonce.verify.sim import generate, run_schedule, run_schedules
from sparkonce.verify.sim.iceberg import IcebergTarget, ObservedIcebergStore
from tests.sim.conftest import PLANTED, env_int
from tests.sim.planted import SkipsEpochCheck
from tests.sim.test_planted_bugs import assert_caught

BUDGET = 100


class SkipsCommitEpochCheck(ObservedIcebergStore):
    """The store's half of the bug: its commit does not check the epoch."""

    ran = 0

    def _already(self, entry: LedgerEntry, table: Any) -> bool:
        try:
            return super()._already(entry, table)
        except FencedError:
            SkipsCommitEpochCheck.ran += 1
            return False

    def _requirement(self, entry: LedgerEntry, expect: int | None) -> PipelineAt:
        return PipelineAt(
            pipeline=entry.pipeline, epoch=entry.epoch, last_seq=expect, check_epoch=False
        )


class UncheckedIcebergTarget(IcebergTarget):
    store_class = SkipsCommitEpochCheck


@pytest.fixture
def iceberg_target() -> Iterator[IcebergTarget]:
    target = IcebergTarget()
    try:
        yield target
    finally:
        target.close()


@pytest.mark.crash_lane
def test_iceberg_schedules(iceberg_target: IcebergTarget) -> None:
    n = env_int("SPARKONCE_SIM_ICEBERG_SCHEDULES", 200)
    summary = run_schedules(iceberg_target, range(n))
    assert summary.schedules == n
    assert not summary.failed, summary.failed[:3]


def test_planted_iceberg_bug_is_caught() -> None:
    target = UncheckedIcebergTarget()
    try:
        SkipsCommitEpochCheck.ran = 0
        summary = run_schedules(target, range(BUDGET), SkipsEpochCheck(), stop_at_first=True)
        assert summary.failed, f"survived {summary.schedules} schedules"
        seed = summary.failed[0][0]
        SkipsCommitEpochCheck.ran = 0
        kinds = assert_caught(SkipsEpochCheck, generate(seed), target)
        assert SkipsCommitEpochCheck.ran > 0
        # The real store alone (the committer's bug still planted) is not fooled.
        fine = IcebergTarget()
        try:
            failures, _ = run_schedule(generate(seed), fine, SkipsEpochCheck())
            assert not {f.kind for f in failures} & SkipsEpochCheck.caught_as, failures
        finally:
            fine.close()
        PLANTED.append(f"SkipsEpochCheck + SkipsCommitEpochCheck (Iceberg): seed {seed} {kinds}")
    finally:
        target.close()
