"""The fault model of a verify campaign: the fault kinds, one trial's :class:`Fault` (planned
from the trial's seed by :func:`plan_fault`), what a trial found (:class:`TrialOutcome`),
and the failure-free run it is compared with (:class:`Oracle`). See
:mod:`sparkonce.verify.campaign` for what each kind does."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkonce.errors import ConfigError
from sparkonce.outputs.output_set import SINGLE_OUTPUT
from sparkonce.protocol import CrashPoint
from sparkonce.verify.compare import diff_rows

FAULT_KINDS = ("kill", "crash-point", "task-failure", "db-drop", "zombie")  # the default set
OPT_IN_KINDS = ("resend", "broker-kill")  # only when --faults names them
KNOWN_KINDS = FAULT_KINDS + OPT_IN_KINDS
RESEND_PROGRESS_EVERY = (3, 40)  # M: the producer persists its progress every M records


@dataclass(frozen=True)
class Fault:
    """One injected fault, fully determined by the trial's seed."""

    kind: str
    point: str | None = None  # crash point name (crash-point, db-drop, zombie)
    hit: int = 1  # which time the point is reached (1 = first batch)
    delay_s: float | None = None  # kill: seconds after the start, or after entry N (below)
    after_entries: int | None = None  # kill: wait for this many new ledger entries first
    kill_after: int | None = None  # resend: k, records acknowledged before the kill
    progress_every: int | None = None  # resend: M, records between progress writes
    node: str | None = None  # broker-kill: the broker node killed (one of --broker-nodes)

    def describe(self) -> str:
        if self.kind == "broker-kill":
            when = f"after ledger entry {self.after_entries}" if self.after_entries else "in"
            return f"broker-kill of node {self.node} {self.delay_s:.1f} s {when}"
        if self.kind == "kill" and self.after_entries:
            return f"kill {self.delay_s:.1f} s after ledger entry {self.after_entries}"
        if self.kind == "kill":
            return f"kill after {self.delay_s:.1f} s"
        if self.kind == "resend":
            return (
                f"resend: producer killed after {self.kill_after} records, progress "
                f"every {self.progress_every}"
            )
        if self.point:
            return f"{self.kind} at {self.point}@{self.hit}"
        return self.kind


@dataclass
class TrialOutcome:
    """What one trial did and found."""

    trial: int
    seed: str
    fault: Fault
    passed: bool = False
    fault_fired: bool = False
    lost_rows: int = 0
    duplicated_rows: int = 0
    value_mismatches: int = 0
    zombie_fenced: bool | None = None
    ledger_problems: list[str] = field(default_factory=list)
    recovery_s: float | None = None
    # The recovering run's time split (see recovery_split): start_s, plan_s, first_batch_s.
    recovery_phases: dict[str, float] | None = None
    driver_runs: int = 0
    seconds: float = 0.0
    error: str | None = None
    quick_start: bool | None = None  # drivers ran with --quick-start (None: not recorded)
    worker: int = 0  # which test store (``--sink``, in order) the trial ran on
    # Several outputs, or declared non-deterministic columns (see the module docstring):
    inconsistent: int = 0  # joined values whose declared column differs between outputs
    inconsistencies: list[str] = field(default_factory=list)  # a line per pair, examples
    # Per output (pipelines with named outputs only): lost_rows, duplicated_rows,
    # value_mismatches (null_values included), null_values.
    outputs: dict[str, dict[str, int]] = field(default_factory=dict)
    # The live readers' findings during the trial, one dict per store (see
    # sparkonce.verify.live): observations, anomalies by kind, examples, read errors.
    live: list[dict[str, Any]] = field(default_factory=list)
    live_anomalies: int = 0  # every anomaly of every store; any fails the trial
    # resend trials only: the trial source (``source``, its URI), ``records`` copied,
    # ``killed_after`` (acknowledged when killed), ``resumed_from`` (the progress the
    # restart read) and ``resent`` (the window sent twice); see sparkonce.verify.resend.
    resend: dict[str, Any] | None = None
    # What the outputs' other readers (Inspector.other_readers: DuckDB for an Iceberg
    # table) found, per reader ("OUTPUT:READER" with several outputs): lost_rows,
    # duplicated_rows, value_mismatches, null_values, rows. Any difference fails the trial,
    # and the trial's own counts are the worst of all readers'.
    readers: dict[str, dict[str, int]] = field(default_factory=dict)
    # What failed attempts left in the stores after the trial, by kind (Inspector.leftovers:
    # an Iceberg table's orphan staging directories and files); None: nothing to count.
    leftovers: dict[str, int] | None = None


@dataclass
class Oracle:
    """The failure-free run: ``rows`` of every output (of the sink), and, for a pipeline
    with named outputs, each output's rows in ``outputs``."""

    rows: list[dict[str, Any]]
    seconds: float
    batches: int  # ledger entries (of each store)
    outputs: dict[str, list[dict[str, Any]]] | None = None
    records: int = 0  # input offsets its batches covered (the first store's ledger)
    # What kills are planned on (None in reports of older versions: the whole run time):
    first_commit_s: float | None = None  # from the driver's start to its first entry
    batch_interval_s: float | None = None  # the median time between two entries
    # The latest oracle run's own split of its time to the first entry, like a recovery's
    # (start_s, plan_s, first_batch_s), so the two can be compared phase by phase.
    phases: dict[str, float] | None = None

    def output_rows(self) -> dict[str, list[dict[str, Any]]]:
        """Each output's rows (a single sink's under ``"output"``)."""
        return self.outputs if self.outputs is not None else {SINGLE_OUTPUT: self.rows}


def compare_rows(
    oracle: Sequence[dict[str, Any]], actual: Sequence[dict[str, Any]], keys: Sequence[str] = ()
) -> tuple[int, int, int]:
    """(lost, duplicated, value mismatches) of ``actual`` against ``oracle``.

    With ``keys`` (an upsert sink, or ``key_columns``), a key present on both sides
    with other values counts as one value mismatch instead of one lost plus one
    extra row. See :func:`sparkonce.verify.compare.diff_rows` for the rules.
    """
    diff = diff_rows(oracle, actual, keys)
    return diff.missing, diff.extra, diff.mismatched


def plan_fault(
    kind: str,
    rng: random.Random,
    oracle: Oracle,
    stores: int = 1,
    nodes: Sequence[str] = (),
) -> Fault:
    """The fault of one trial, from the trial's own random generator.

    ``kind`` may pin the crash point: ``crash-point:after-rows``. With ``stores`` stores
    each batch reaches a commit's points once per store, so hits range over
    ``batches x stores``. ``nodes``: the broker nodes a ``broker-kill`` picks from.
    """
    batches = max(1, oracle.batches) * max(1, stores)
    kind, _, pinned = kind.partition(":")
    if kind == "broker-kill":
        if not nodes:
            raise ConfigError("--faults broker-kill needs --broker-nodes (see --help)")
        node = rng.choice(list(nodes))
        timed = plan_fault("kill", rng, oracle, stores)
        return Fault(kind, delay_s=timed.delay_s, after_entries=timed.after_entries, node=node)
    if kind == "kill":
        if oracle.first_commit_s is None or oracle.batch_interval_s is None:
            # A report of an older version: a moment inside the failure-free run time,
            # after Spark is up, as its trials were planned.
            return Fault(kind, delay_s=round(rng.uniform(0.3, 0.95) * oracle.seconds, 2))
        # After the Nth batch (every store's entry of it), plus a part of a batch's time;
        # N = 0: a moment before the first entry, after Spark is up.
        n = rng.randint(0, max(0, oracle.batches - 1))
        if n == 0:
            return Fault(kind, delay_s=round(rng.uniform(0.3, 1.0) * oracle.first_commit_s, 2))
        return Fault(
            kind,
            after_entries=n * max(1, stores),
            delay_s=round(rng.uniform(0.0, 1.0) * oracle.batch_interval_s, 2),
        )
    if kind == "crash-point":
        point = CrashPoint(pinned) if pinned else rng.choice(list(CrashPoint))
        return Fault(kind, point=point.value, hit=rng.randint(1, batches))
    if kind == "db-drop":
        return Fault(kind, point=CrashPoint.AFTER_ROWS.value, hit=rng.randint(1, batches))
    if kind == "zombie":
        return Fault(kind, point=CrashPoint.BEFORE_COMMIT.value, hit=rng.randint(1, batches))
    if kind == "task-failure":
        return Fault(kind)
    if kind == "resend":
        # k inside the input; M gives windows of a few to a few dozen records.
        records = max(1, oracle.records)
        return Fault(
            kind,
            kill_after=rng.randint(max(1, records // 10), max(1, records * 9 // 10)),
            progress_every=rng.randint(*RESEND_PROGRESS_EVERY),
        )
    raise ConfigError(f"unknown fault kind {kind!r}; choose from {', '.join(KNOWN_KINDS)}")


def parse_fault_kinds(text: str | None) -> tuple[str, ...]:
    """The kinds ``--faults`` names; none: the default set, :data:`FAULT_KINDS` (the
    opt-in kinds, :data:`OPT_IN_KINDS`, run only when named)."""
    if not text:
        return FAULT_KINDS
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    points = {p.value for p in CrashPoint}
    bad = [
        k
        for k in kinds
        if k.partition(":")[0] not in KNOWN_KINDS
        or (":" in k and (not k.startswith("crash-point:") or k.partition(":")[2] not in points))
    ]
    if bad or not kinds:
        raise ConfigError(
            f"--faults {text!r}: unknown kind(s) {bad}; choose from {', '.join(KNOWN_KINDS)} "
            f"(crash-point may name its point: crash-point:{'|'.join(sorted(points))})"
        )
    return kinds
