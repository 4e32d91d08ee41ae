"""``sparkonce verify``: a crash-test campaign against any user's pipeline.

A campaign first runs the pipeline once with no fault: that run's sink content
is the **oracle**. The oracle is then checked against a **reference** that
shares no sparkonce commit code: the same transform through Spark's own engine
and a plain ``foreachBatch`` into a JSON-lines file (:mod:`.reference`). Any
difference fails the campaign before the trials (:class:`ReferenceMismatchError`),
because a bug in sparkonce's own commit logic would lose the same rows in the
oracle and in every trial. ``reference=False`` skips it. Rows are matched on
``key_columns`` (default: the sink's upsert keys), or compared as multisets when
there are none.

Each trial then starts from a clean sink (``Inspector.reset``) and an empty
checkpoint, injects one fault, restarts the pipeline until its input is
consumed, and compares the sink with the oracle (proven equal to the reference,
and read back in the sink's own representation). Drivers start with
``sparkonce run --quick-start`` unless told otherwise: trials are short runs, and
the JIT mode changes timing only.

Fault kinds (``--faults``):

``kill``
    SIGKILL of the driver's process group at a random moment, planned on the driver's
    progress: after its Nth ledger entry (N drawn among the oracle's batches) plus a
    random part of the oracle's time between two entries, or, for N = 0, at a random
    part of the oracle's time to its first entry. A busy machine slows the trial and
    the kill alike, so it still lands inside the run. (Reports written before this
    planning hold kills planned on the oracle's whole run time; they resume with it.)
``crash-point``
    SIGKILL at a named crash point of the commit protocol
    (:class:`~sparkonce.protocol.CrashPoint`), on a random batch. With outputs in
    several stores each store's commit reaches the point once per batch, so the hit
    is drawn among ``batches x stores``: hit 1 is the first store's commit of the
    first batch, hit 2 the second store's (``after-ledger-commit`` at an odd hit of two
    stores falls between the two stores' commits of a batch).
``task-failure``
    Read tasks fail halfway on their first attempt; Spark retries them.
``db-drop``
    The sink loses its database connection inside the commit transaction (only when
    every output's sink has a connection to drop).
``zombie``
    The driver is frozen (SIGSTOP) just before a commit; a newer run starts and
    finishes; the old one is then thawed (SIGCONT) and must be fenced.
``resend`` (opt-in: not in the default set; needs an embedded-log or Kafka source)
    The *producer* crashes and re-sends. A real producer process
    (:mod:`.resend`) copies the pipeline's input into a fresh trial source of the same
    kind (a new log directory in the trial's directory, or a new Kafka topic, deleted
    after the trial), keeping each record's partition, key, value, timestamp and id, and
    persisting its progress only every M records. It is SIGKILLed once it has
    acknowledged k records and restarted with a new producer identity; it resumes from
    its last persisted progress, so it re-sends the window acknowledged since then under
    the same record ids, and finishes the copy. The pipeline then runs on the trial
    source (``sparkonce run --source``) until it is consumed. k (inside the input, as
    counted by the oracle's ledger) and M (3 to 40) come from the trial's seed. The trial
    records k, M, the window re-sent and the trial source (``resend`` of the trial in
    ``verify.json``); it fired when the producer was killed after at least one record and
    re-sent at least one. A pipeline that removes the copies by record id
    (:func:`sparkonce.outputs.dedupe`, copies within its bound: they keep their original
    timestamps) is effectively-once per record id and matches the oracle; one that does
    not is at-least-once per logical record and shows the window as duplicated rows, or
    as other aggregate values (the CLI then points at ``dedupe``: :func:`failure_hint`).
    The trial's output is compared with the oracle's, which ran on the original source in
    other micro-batches, so the pipeline's output must not depend on where batch
    boundaries fall (true of stateless pipelines, and of watermarked aggregations none of
    whose records is late).

What every trial checks:

* every output against the oracle's rows of that output: no row missing, none
  duplicated, the same values (aggregates), matched on the output's keys (its sink's
  upsert keys, or ``--key OUTPUT.COLUMN``) or as multisets;
* the zombie's commits refused;
* in every store that holds a ledger: gap-free and monotonic offsets, seq numbers
  ``0..n-1``, epochs that never go backwards and never pass the owner's; with several
  stores, the same batches (offset ranges) in every store's ledger.

**Several outputs** (``Pipeline(outputs={name: sink})``): the oracle, the reference
and each trial read every output through its own inspector
(:func:`sparkonce.sinks.inspect.inspector_for`); a trial wipes every output and the
pipeline's owner and ledger in every store. Counts are kept per output
(``TrialOutcome.outputs``) and in total. A dead-letter output is checked like any
other, its ``pipeline`` and ``batch_seq`` columns included (against the reference,
without them: see :mod:`.reference`). ``--sink URL`` moves every output to that one
store when they all share one; a pipeline whose outputs live in several stores is
verified in its own stores, one trial at a time.

**Non-deterministic columns** (``nondeterministic``, ``--nondeterministic``): a column
computed by ``uuid()``, ``rand()``, a clock or a lookup has other values in every
run, so it cannot be compared with the oracle's or the reference's. ``COLUMN``
declares it in every output that has it, ``OUTPUT.COLUMN`` in one output
(:mod:`.checks` has the exact rules). For such a column verify checks:

(a) every other column exactly: rows compared without the declared columns, so the
    number of rows per input record is checked too (a declared key column makes the
    output compare as a multiset);
(b) by count: a trial's rows hold a value (not NULL) in a declared column at least
    as often as the oracle's rows with the same other columns (a shortfall counts as
    value mismatches, ``null_values`` per output);
(c) the same values in every sink: for every pair of outputs that both have a
    declared column C and share another column neither declares, rows joined on the
    shared columns must have the same set of C values in both outputs. Every joined
    value that differs counts as ``inconsistent`` and fails the trial. A crash between
    two stores' commits without stable output shows up here. A pair whose outputs
    already disagree in the oracle (C computed separately per output) is left out and
    reported as not checked.

The reference comparison leaves declared columns out. An undeclared
non-deterministic column makes the failure-free run differ from the reference; the
message then names the columns that alone explain the difference and the
``--nondeterministic`` option that declares them, and no trial runs.

The campaign only uses the public API (a pipeline file, ``sparkonce run``, and
the sinks' inspectors, :func:`sparkonce.sinks.inspect.inspector_for`:
``reset``/``rows``/``ledger``/``owner``), so it checks any pipeline as a black
box. Each trial's fault schedule derives from ``(seed, trial)``. A kill's delay
is a fraction of the oracle's run time, so ``--resume`` plans on the oracle time
recorded in ``verify.json`` rather than a new measurement that a busy machine
would skew. A trial's driver usually runs faster than the oracle's, whose JVM and
caches started cold: when it finishes before its kill, the trial starts again from a
clean slate with the delay at the same fraction of the time that run took (at most
twice), and the report records the delay used. ``--replay TRIAL`` takes the fault
recorded for that trial (a kill lands at the same delay, though not necessarily at the
same instruction), and plans it from the seed only if the report does not hold the trial.

A fault that did not fire (a kill planned after the driver had already
finished, say) tested nothing: the report counts it under ``fired``, and
``--resume`` runs such trials again. A failed trial is always kept. Whether an
injected fault fired, and whether a zombie was fenced, is read from the fault
events each driver run writes (:meth:`Driver.events`, schema in
:mod:`sparkonce.faults`), never from log text; a kill is the campaign's own act.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import random
import shutil
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sparkonce.config import mask_url
from sparkonce.errors import ConfigError, VerificationError
from sparkonce.files import join, location
from sparkonce.ledger.base import LedgerEntry, Owner
from sparkonce.offsets import check_chain
from sparkonce.outputs.output_set import SINGLE_OUTPUT
from sparkonce.pipeline.loader import load_pipeline
from sparkonce.pipeline.pipeline import Pipeline
from sparkonce.protocol import (
    DROP_CONNECTION_ENV,
    FAIL_TASKS_ENV,
    PAUSE_ENV,
    CrashPoint,
)
from sparkonce.sinks.base import Sink
from sparkonce.sinks.inspect import Inspector, inspector_for
from sparkonce.sources.base import Source
from sparkonce.verify.checks import (
    ColumnSpec,
    Inconsistency,
    Pair,
    check_consistency,
    compare_output,
    consistency_pairs,
    parse_columns,
    resolve_columns,
    split_pairs,
)
from sparkonce.verify.compare import diff_rows
from sparkonce.verify.driver import SIGKILL_EXIT, Driver
from sparkonce.verify.live import (
    DEFAULT_INTERVAL_S,
    DeltaLogReader,
    KafkaLiveReader,
    LiveCheck,
    LiveReader,
    LiveStore,
    OutputSpec,
    SqlReader,
    StoreReader,
)
from sparkonce.verify.reference import ENTRY as REFERENCE_ENTRY
from sparkonce.verify.reference import (
    ReferenceCheck,
    ReferenceMismatchError,
    load_output_references,
    load_reference,
    output_semantics,
    read_output_schemas,
    sink_semantics,
)

FAULT_KINDS = ("kill", "crash-point", "task-failure", "db-drop", "zombie")  # the default set
OPT_IN_KINDS = ("resend",)  # only when --faults names them
KNOWN_KINDS = FAULT_KINDS + OPT_IN_KINDS
RESEND_PROGRESS_EVERY = (3, 40)  # M: the producer persists its progress every M records
RESEND_HINT = (
    "records the producer re-sent under the same record ids took effect again: remove them "
    'by record id with sparkonce.outputs.dedupe (docs/guides/dedupe.md: "Removing '
    'duplicates a producer re-sent")'
)
EXIT_FENCED = 3  # sparkonce.cli.EXIT_FENCED; the CLI is above this layer
RETRY_MASTER = "local[2,4]"  # local mode with up to 4 attempts per task
DRIVER_TIMEOUT_S = 600.0
MAX_RESTARTS = 4
# A kill planned after the driver had finished is planned again, on that run's own time, at
# most this many times in a trial.
KILL_RESCALES = 2


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

    def describe(self) -> str:
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


def plan_fault(kind: str, rng: random.Random, oracle: Oracle, stores: int = 1) -> Fault:
    """The fault of one trial, from the trial's own random generator.

    ``kind`` may pin the crash point: ``crash-point:after-rows``. With ``stores`` stores
    each batch reaches a commit's points once per store, so hits range over
    ``batches x stores``.
    """
    batches = max(1, oracle.batches) * max(1, stores)
    kind, _, pinned = kind.partition(":")
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


class Campaign:
    """Runs the oracle and the trials of one campaign (see the module docstring)."""

    def __init__(
        self,
        pipeline_file: str | Path,
        *,
        workdir: str | Path,
        seed: int = 0,
        kinds: Sequence[str] = FAULT_KINDS,
        sink_url: str | None = None,
        on_event: Callable[[str], None] | None = None,
        keep_logs: bool = False,
        quick_start: bool = True,
        key_columns: Sequence[str] = (),
        reference: bool = True,
        nondeterministic: Sequence[str] = (),
        master: str | None = None,
        checkpoint_root: str | None = None,
        live_interval_s: float | None = DEFAULT_INTERVAL_S,
    ) -> None:
        """``master``: the Spark master of every trial driver (default: ``sparkonce run``'s).
        ``checkpoint_root``: a directory or URL under which every run gets a fresh checkpoint
        of its own, left in place (default: ``workdir/checkpoint``, removed between runs).
        ``live_interval_s``: how often the live readers poll each store during a trial
        (:mod:`.live`); None: no live reader."""
        self.pipeline_file = Path(pipeline_file).resolve()
        self.workdir = Path(workdir).resolve()
        self.seed = seed
        self.kinds = tuple(kinds)
        self.sink_url = sink_url
        self.keep_logs = keep_logs
        self.quick_start = quick_start
        # Trials whose fault is taken as recorded (``--replay``), not planned.
        self.recorded_faults: dict[int, Fault] = {}
        self.on_event = on_event or (lambda _msg: None)
        base = load_pipeline(self.pipeline_file)
        if sink_url:
            _check_one_store(base)
        if "resend" in self.kinds:
            from sparkonce.verify.resend import check_source

            check_source(base.source, base.name)
        self.pipeline_name = base.name
        self.master = master
        self.live_interval_s = live_interval_s
        self._live: LiveReader | None = None  # the running trial's live reader
        self.checkpoint_root = (
            None if checkpoint_root is None else location(checkpoint_root, "checkpoint root")
        )
        self.checkpoint: str | Path = self.workdir / "checkpoint"
        if self.checkpoint_root is not None:
            self.checkpoint = self._fresh_checkpoint("oracle")
        self.pipeline: Pipeline = base.with_overrides(sink_url=sink_url, checkpoint=self.checkpoint)
        # The outputs, each with its sink (a single sink is the output "output"), and the
        # stores, each the outputs sharing one ledger, in commit order.
        outputs = self.pipeline.output_set
        self.multi = self.pipeline.outputs is not None
        self.sinks: dict[str, Sink] = (
            dict(outputs.outputs) if outputs is not None else {SINGLE_OUTPUT: self.pipeline.sink}
        )
        self.stores: list[tuple[str, ...]] = (
            [tuple(g.names) for g in outputs.groups] if outputs is not None else [(SINGLE_OUTPUT,)]
        )
        lacking = [n for n, s in self.sinks.items() if not s.supports_connection_drop]
        if "db-drop" in self.kinds and lacking:
            if tuple(kinds) != FAULT_KINDS:
                what = (
                    f"output {', '.join(lacking)} ("
                    + ", ".join(self.sinks[n].describe() for n in lacking)
                    + ") has"
                    if self.multi
                    else f"{self.pipeline.sink.describe()} has"
                )
                raise ConfigError(
                    f"--faults db-drop: {what} no database connection to drop; choose among "
                    "kill, crash-point, task-failure, zombie"
                )
            self.kinds = tuple(k for k in self.kinds if k != "db-drop")
        # Rows are matched on these per output (the sink's upsert keys unless --key names
        # others); none: compared as multisets.
        self.output_keys = self._keys(tuple(key_columns))
        self.keys: tuple[str, ...] = () if self.multi else self.output_keys[SINGLE_OUTPUT]
        # Declared non-deterministic columns, as given and (after the oracle) per output.
        self.declared: tuple[ColumnSpec, ...] = parse_columns(
            tuple(nondeterministic), self.sinks if self.multi else ()
        )
        self.nondeterministic: dict[str, tuple[str, ...]] = {}
        self.pairs: list[Pair] = []  # checked across outputs in every trial
        self.skipped_pairs: list[tuple[Pair, Inconsistency]] = []  # the oracle disagrees
        self.check_reference = reference
        self.oracle: Oracle | None = None
        self.reference: ReferenceCheck | None = None
        self._reference_columns: dict[str, list[str]] = {}
        self._columns: dict[str, set[str]] = {}  # each output's columns, once known
        self._drivers: list[Driver] = []  # started by this campaign, for abort()
        self._trial_source: Source | None = None  # a resend trial's (drivers' --source)
        self._aborted = threading.Event()
        # One long-lived connection per output (its own) for polling the ledgers while
        # drivers run, resetting the stores and reading the rows.
        self._inspectors: dict[str, Inspector] = {}
        try:
            for name, sink in self.sinks.items():
                self._inspectors[name] = inspector_for(sink, fresh=True)
        except BaseException:
            self.close()
            raise

    def _keys(self, key_columns: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        """The key columns of each output: ``--key`` (``OUTPUT.COLUMN`` with several
        outputs) or its sink's upsert keys."""
        bad = [k for k in key_columns if not isinstance(k, str) or not k.strip()]
        if bad or len(set(key_columns)) != len(key_columns):
            raise ConfigError(
                f"--key {list(key_columns)}: key columns must be distinct, non-empty column "
                "names of the pipeline's output"
            )
        given: dict[str, list[str]] = {}
        if self.multi:
            for k in key_columns:
                name, dot, column = k.partition(".")
                if not dot or name not in self.sinks or not column:
                    raise ConfigError(
                        f"--key {k!r}: pipeline {self.pipeline.name!r} has several outputs "
                        f"({', '.join(self.sinks)}); name a column of one of them as "
                        "OUTPUT.COLUMN (repeat for a composite key)"
                    )
                given.setdefault(name, []).append(column)
        elif key_columns:
            given[SINGLE_OUTPUT] = list(key_columns)
        return {
            name: tuple(given.get(name) or tuple(getattr(sink, "keys", ()) or ()))
            for name, sink in self.sinks.items()
        }

    def close(self) -> None:
        for inspector in self._inspectors.values():
            inspector.close()

    # -- pieces ------------------------------------------------------------------------
    def _driver_args(self, master: str | None = None) -> tuple[str, ...]:
        master = master or self.master
        args = ["--checkpoint", str(self.checkpoint)]
        if self.sink_url:
            args += ["--sink", self.sink_url]
        if self._trial_source is not None:
            args += ["--source", self._trial_source.uri()]
        if master:
            args += ["--master", master]
        if self.quick_start:
            args.append("--quick-start")
        return tuple(args)

    def _driver(
        self,
        log: Path,
        *,
        crash: Fault | None = None,
        env: dict[str, str] | None = None,
        master: str | None = None,
    ) -> Driver:
        if self._aborted.is_set():
            raise VerificationError("the campaign was stopped")
        point = CrashPoint(crash.point) if crash and crash.point else None
        driver = Driver(
            self.pipeline_file,
            log,
            crash_at=point,
            crash_hit=crash.hit if crash else 1,
            env=env,
            extra_args=self._driver_args(master),
        )
        self._drivers.append(driver)
        return driver

    def abort(self) -> None:
        """Kill this campaign's running drivers and start no new ones (from any thread)."""
        self._aborted.set()
        for d in list(self._drivers):
            if d.proc is not None and d.proc.poll() is None:
                d.kill()

    def clean(self, run: str = "run") -> None:
        """Empty outputs (for this pipeline), no owner or ledger in any store, and no
        checkpoint: the local one removed, or, under a checkpoint root, a fresh location
        for the next ``run`` (a label in its name). A live reader, if one runs, reads nothing
        meanwhile and starts its checks afresh."""
        live = self._live
        with live.paused() if live is not None else contextlib.nullcontext():
            for inspector in self._inspectors.values():
                inspector.open()
                inspector.reset(self.pipeline.name)
        if self.checkpoint_root is None:
            shutil.rmtree(self.checkpoint, ignore_errors=True)
        else:
            self.checkpoint = self._fresh_checkpoint(run)

    def _fresh_checkpoint(self, run: str) -> str:
        """A location under the checkpoint root no run used: ``ROOT/PIPELINE/RUN-RANDOM``.
        Nothing is deleted there (the campaign may not hold the filesystem's rights, and
        a remote store has its own tools); every run's checkpoint stays for a look."""
        assert self.checkpoint_root is not None
        return join(self.checkpoint_root, self.pipeline_name, f"{run}-{uuid.uuid4().hex[:12]}")

    def _retry_master(self) -> str:
        """The master of a run that must survive a failed task: ``local[2,4]`` (four attempts
        per task) for local runs, else the campaign's cluster, which retries tasks itself
        (``spark.task.maxFailures``, 4 by default)."""
        if self.master is None or self.master.startswith("local"):
            return RETRY_MASTER
        return self.master

    def _ledgers(self) -> list[list[LedgerEntry]]:
        """Each store's ledger of this pipeline, in commit order."""
        out = []
        for names in self.stores:
            inspector = self._inspectors[names[0]]
            inspector.open()
            out.append(inspector.ledger(self.pipeline.name))
        return out

    def _ledger_len(self) -> int:
        """Ledger entries in all stores together (a new one in any store is progress)."""
        return sum(len(ledger) for ledger in self._ledgers())

    def _inspect(
        self,
    ) -> tuple[dict[str, list[dict[str, Any]]], list[list[LedgerEntry]], list[Owner | None]]:
        """(each output's rows, each store's ledger, each store's owner)."""
        rows = {}
        for name, inspector in self._inspectors.items():
            inspector.open()
            rows[name] = inspector.rows()
        owners = []
        for names in self.stores:
            inspector = self._inspectors[names[0]]
            owners.append(inspector.owner(self.pipeline.name))
        return rows, self._ledgers(), owners

    def store_names(self) -> list[str]:
        """Each store, as its outputs and its URL (no secrets), in commit order."""
        return [_store_name(names, [self.sinks[n] for n in names]) for names in self.stores]

    # -- oracle ------------------------------------------------------------------------
    def run_oracle(
        self, seconds: float | None = None, timing: tuple[float | None, float | None] = (None, None)
    ) -> Oracle:
        """The failure-free run. ``seconds`` and ``timing`` (its time to the first ledger
        entry and between entries): what kills are planned on, as recorded by an earlier
        segment of this campaign (default: this run's)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.clean("oracle")
        if self.quick_start:
            # Every driver of the campaign starts about 7 s sooner with it (a minute to build,
            # once per machine); built before the oracle, so that all runs start alike.
            from sparkonce.spark import classdata

            classdata.ensure_archive(on_build=self.on_event)
        self.on_event("oracle: failure-free run")
        started_wall = time.time()
        driver = self._driver(self.workdir / "oracle.log").start()
        code = driver.wait(DRIVER_TIMEOUT_S)
        if code != 0:
            raise VerificationError(
                f"the failure-free oracle run of {self.pipeline_file} failed (exit {code}); "
                f"fix the pipeline first. Last lines of {driver.log_path}:\n{driver.log_tail()}"
            )
        rows, ledgers, _ = self._inspect()
        if not any(ledgers):
            raise VerificationError(
                f"the oracle run of {self.pipeline_file} committed no batch: its source is "
                "empty, so there is nothing to verify. Produce input first."
            )
        apart = self._stores_apart(ledgers)
        if apart:
            raise VerificationError(
                f"the failure-free oracle run of {self.pipeline_file} left its stores at "
                f"different points: {'; '.join(apart)}. Every store must commit every batch; "
                f"see {driver.log_path}"
            )
        everything = [r for output in rows.values() for r in output]
        measured = _entry_timing(ledgers[0], started_wall)
        first, interval = measured if seconds is None else timing
        phases = recovery_split(driver.phases(), measured[0]) if measured[0] else None
        self.oracle = Oracle(
            everything,
            driver.seconds if seconds is None else seconds,
            len(ledgers[0]),
            rows if self.multi else None,
            records=sum(e.ranges.count for e in ledgers[0]),
            first_commit_s=first,
            batch_interval_s=interval,
            phases=phases,
        )
        per_output = (
            " (" + ", ".join(f"{n} {len(r)}" for n, r in rows.items()) + ")" if self.multi else ""
        )
        self.on_event(
            f"oracle: {len(everything)} rows{per_output}, {len(ledgers[0])} batches"
            + (f" in each of {len(ledgers)} stores" if len(ledgers) > 1 else "")
            + f" in {driver.seconds:.1f} s"
            + ("" if seconds is None else f"; kills are planned on the recorded {seconds:.1f} s")
        )
        if self.check_reference:
            self.run_reference()
        else:
            self._resolve_columns()
        self._plan_consistency()
        return self.oracle

    def _resolve_columns(self) -> None:
        """Each output's declared non-deterministic columns, from the columns the oracle
        (and the reference run, when it ran) showed."""
        assert self.oracle is not None
        known: dict[str, set[str] | None] = {}
        for name, rows in self.oracle.output_rows().items():
            columns = {c for r in rows for c in r} | set(self._reference_columns.get(name, ()))
            known[name] = columns or None
        self._columns = {n: c or set() for n, c in known.items()}
        self.nondeterministic = {
            n: cols for n, cols in resolve_columns(self.declared, dict(known)).items() if cols
        }
        if self.nondeterministic:
            self.on_event(
                "non-deterministic columns, checked by count and across outputs: "
                + "; ".join(
                    (f"{n}: " if self.multi else "") + ", ".join(c)
                    for n, c in self.nondeterministic.items()
                )
            )

    def _plan_consistency(self) -> None:
        """Which pairs of outputs must hold the same values of a declared column."""
        assert self.oracle is not None
        if not self.nondeterministic or len(self.sinks) < 2:
            return
        pairs = consistency_pairs(self._columns, self.nondeterministic)
        self.pairs, self.skipped_pairs = split_pairs(self.oracle.output_rows(), pairs)
        for pair in self.pairs:
            self.on_event(f"across outputs: {pair.describe()}")
        for pair, found in self.skipped_pairs:
            self.on_event(
                f"not checked across outputs: {pair.describe()}: the failure-free run already "
                f"disagrees ({found.describe()}), so the transform computes {pair.column} "
                "separately for each output"
            )

    def run_reference(self) -> ReferenceCheck:
        """Check the failure-free run against Spark's plain ``foreachBatch`` run.

        See :mod:`sparkonce.verify.reference`; declared non-deterministic columns are not
        compared. Raises :class:`ReferenceMismatchError` (a :class:`VerificationError`) if
        the sink's rows differ; ``self.reference`` holds the comparison either way.
        """
        assert self.oracle is not None, "run_oracle() first"
        where = self.workdir / "reference"
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir(parents=True)
        rows_file, checkpoint = where / "rows.jsonl", where / "checkpoint"
        self.on_event("reference: the transform through Spark's plain foreachBatch")
        args = ["--out", str(rows_file), "--checkpoint", str(checkpoint)]
        if self.master is not None:
            # In local mode beside this process, whatever the trials' master: the reference
            # needs no cluster, and its checkpoint is a local directory.
            args += ["--master", "local[2]"]
        if self.quick_start:
            args.append("--quick-start")
        if self._aborted.is_set():
            raise VerificationError("the campaign was stopped")
        driver = Driver(
            self.pipeline_file,
            where / "reference.log",
            entry=REFERENCE_ENTRY,
            extra_args=tuple(args),
        )
        self._drivers.append(driver)
        code = driver.start().wait(DRIVER_TIMEOUT_S)
        if code != 0:
            raise VerificationError(
                f"the reference run of {self.pipeline_file} (plain Spark foreachBatch, no "
                f"sparkonce commit logic) failed (exit {code}). Last lines of "
                f"{driver.log_path}:\n{driver.log_tail()}"
            )
        shutil.rmtree(checkpoint, ignore_errors=True)
        if self.multi:
            schemas = read_output_schemas(rows_file)
            self._reference_columns = {n: list(d["columns"]) for n, d in schemas.items()}
            self._resolve_columns()
            references, batches = load_output_references(rows_file, self.pipeline)
            left_out = {
                n: (*self.nondeterministic.get(n, ()), *_dead_letter_extra(schemas.get(n)))
                for n in self.sinks
            }
            check = ReferenceCheck.compare_outputs(
                references,
                self.oracle.output_rows(),
                self.output_keys,
                {n: sem for n, (sem, _keys) in output_semantics(self.pipeline).items()},
                left_out=left_out,
                batches=batches,
                seconds=driver.seconds,
                rows_file=str(rows_file),
            )
        else:
            self._resolve_columns()
            rows, batches = load_reference(rows_file, self.pipeline)
            check = ReferenceCheck.compare(
                rows,
                self.oracle.rows,
                self.keys,
                batches=batches,
                seconds=driver.seconds,
                semantics=sink_semantics(self.pipeline)[0],
                rows_file=str(rows_file),
                left_out=(
                    *self.nondeterministic.get(SINGLE_OUTPUT, ()),
                    *self._single_dead_letter_extra(rows),
                ),
            )
        self.reference = check
        if not check.matched:
            message = check.message(self.pipeline_file, driver.log_path)
            self.on_event(message)  # the table, for a console that shows one line per error
            raise ReferenceMismatchError(message, check)
        self.on_event(
            f"reference: {check.diff.expected_rows} rows in {batches} micro-batches in "
            f"{driver.seconds:.1f} s; the failure-free run matches it"
        )
        return check

    # -- one trial ---------------------------------------------------------------------
    def trial_seed(self, trial: int) -> str:
        return f"{self.seed}:{trial}"

    def plan(self, trial: int) -> Fault:
        if trial in self.recorded_faults:
            return self.recorded_faults[trial]
        assert self.oracle is not None, "run_oracle() first"
        rng = random.Random(self.trial_seed(trial))
        kind = self.kinds[trial % len(self.kinds)]
        return plan_fault(kind, rng, self.oracle, len(self.stores))

    def run_trial(self, trial: int) -> TrialOutcome:
        assert self.oracle is not None, "run_oracle() first"
        fault = self.plan(trial)
        out = TrialOutcome(trial, self.trial_seed(trial), fault, quick_start=self.quick_start)
        started = time.monotonic()
        self._drivers = [d for d in self._drivers if d.proc is None or d.proc.poll() is None]
        logs = self.workdir / "trials" / f"{trial:05d}"
        if logs.exists():
            shutil.rmtree(logs)
        logs.mkdir(parents=True)
        try:
            self.clean(f"trial-{trial:05d}")
            self._live = self._live_reader()
            if self._live is not None:
                self._live.__enter__()
            finished = self._inject(fault, out, logs)
            restarts = 0
            while not finished:
                restarts += 1
                if restarts > MAX_RESTARTS:
                    raise VerificationError(f"no clean finish after {MAX_RESTARTS} restarts")
                before = self._ledger_len()
                d = self._driver(logs / f"restart{restarts}.log").start()
                out.driver_runs += 1
                first_commit = self._wait_first_commit(d, before)
                code = d.wait(DRIVER_TIMEOUT_S)
                if out.recovery_s is None and first_commit is not None:
                    out.recovery_s = first_commit
                    out.recovery_phases = recovery_split(d.phases(), first_commit)
                if code != 0:
                    out.error = f"restart {restarts} exited with {code}: {d.log_tail(5)}"
                    continue
                finished = True
            self._end_live(out)
            self._check(out)
        except VerificationError as exc:
            out.error = str(exc)
            out.passed = False
        finally:
            self._end_live(out)
            self._end_trial_source(out)
        out.seconds = time.monotonic() - started
        if out.passed and not self.keep_logs:
            shutil.rmtree(logs, ignore_errors=True)  # a failed trial keeps its driver logs
        return out

    def _live_reader(self) -> LiveReader | None:
        """A live reader of every store for this trial (None: live reading is off)."""
        if self.live_interval_s is None:
            return None
        assert self.oracle is not None
        oracle = self.oracle.output_rows()
        complete = self.pipeline.output_mode == "complete"
        stores = []
        for names, where in zip(self.stores, self.store_names(), strict=True):
            specs = [
                OutputSpec(
                    n,
                    oracle.get(n, []),
                    _upsert_keys(self.sinks[n]),
                    complete,
                    self.nondeterministic.get(n, ()),
                )
                for n in names
            ]
            reader, why = self._store_reader(names)
            tasks_commit = isinstance(reader, KafkaLiveReader)  # documented: per partition
            stores.append(
                LiveStore(where, reader, LiveCheck(specs, tasks_commit=tasks_commit), why)
            )
        return LiveReader(stores, self.live_interval_s)

    def _store_reader(self, names: Sequence[str]) -> tuple[StoreReader | None, str | None]:
        """The live reader of the store holding ``names`` (None and why, if there is none)."""
        from sparkonce.sinks.delta import DeltaSink
        from sparkonce.sinks.kafka import KafkaSink
        from sparkonce.sinks.sql import SqlSink

        sinks = {n: self.sinks[n] for n in names}
        if all(isinstance(s, SqlSink) for s in sinks.values()):
            return SqlReader(sinks, self.pipeline.name), None
        (name, sink), *more = sinks.items()
        if more:
            return None, "a store with several outputs is read live only in SQL"
        if isinstance(sink, KafkaSink):
            return KafkaLiveReader(name, self._inspectors[name].fresh, self.pipeline.name), None
        if isinstance(sink, DeltaSink):
            if "://" in sink.path and not sink.path.startswith("file:"):
                return None, f"the live Delta reader reads local tables only, not {sink.path}"
            return DeltaLogReader(name, sink.path, self.pipeline.name), None
        return None, f"no live reader for {type(sink).__name__}"

    def _end_live(self, out: TrialOutcome) -> None:
        """Stop the trial's live reader, if one runs, and record what it found."""
        live, self._live = self._live, None
        if live is None:
            return
        live.stop()
        out.live = live.report()
        out.live_anomalies = live.anomalies()
        if out.live_anomalies:
            kinds = sorted({k for s in out.live for k, n in s["anomalies"].items() if n})
            first = next(e[0] for s in out.live for e in s["examples"].values() if e)
            found = f"live readers saw {out.live_anomalies} anomalies ({', '.join(kinds)}): {first}"
            out.error = found if out.error is None else f"{out.error}; {found}"
            out.passed = False

    def _wait_first_commit(self, d: Driver, before: int) -> float | None:
        """Seconds from the restart until its first new ledger entry (or its exit)."""
        while d.poll() is None:
            if self._ledger_len() > before:
                return d.seconds
            if d.seconds > DRIVER_TIMEOUT_S:
                d.kill()
                break
            time.sleep(0.2)
        return d.seconds if d.proc is not None and d.proc.returncode == 0 else None

    def _inject(self, fault: Fault, out: TrialOutcome, logs: Path) -> bool:
        """Run the faulty part of a trial. Returns True if the input is fully consumed."""
        if fault.kind == "kill":
            return self._kill(fault, out, logs)
        if fault.kind == "crash-point":
            d = self._driver(logs / "fault.log", crash=fault).start()
            out.driver_runs += 1
            code = d.wait(DRIVER_TIMEOUT_S)
            out.fault_fired = code == SIGKILL_EXIT and bool(d.events("crash"))
            if code not in (0, SIGKILL_EXIT):
                raise VerificationError(f"faulty run exited with {code}: {d.log_tail(8)}")
            return code == 0
        if fault.kind in ("task-failure", "db-drop"):
            env = (
                {FAIL_TASKS_ENV: "read,write"}
                if fault.kind == "task-failure"
                else {DROP_CONNECTION_ENV: f"{fault.point}@{fault.hit}"}
            )
            d = self._driver(logs / "fault.log", env=env, master=self._retry_master()).start()
            out.driver_runs += 1
            code = d.wait(DRIVER_TIMEOUT_S)
            # Spark's Python workers record their task failures in the same events file.
            event = "task-failure" if fault.kind == "task-failure" else "drop-connection"
            out.fault_fired = bool(d.events(event))
            if code != 0:
                raise VerificationError(
                    f"{fault.kind}: the run should have recovered by itself but exited with "
                    f"{code}: {d.log_tail(8)}"
                )
            return True
        if fault.kind == "zombie":
            return self._zombie(fault, out, logs)
        if fault.kind == "resend":
            return self._resend(fault, out, logs)
        raise ConfigError(f"unknown fault kind {fault.kind!r}")

    def _kill(self, fault: Fault, out: TrialOutcome, logs: Path) -> bool:
        """SIGKILL the driver at the planned moment: ``delay_s`` after its
        ``after_entries``-th new ledger entry (planned on progress), or ``delay_s`` after
        its start (older reports, planned on the oracle's wall-clock time).

        A driver that finishes first is run again from a clean slate, at most
        :data:`KILL_RESCALES` times, with the moment moved earlier: half the delay after
        the entry, or the same fraction of the run time just measured as of the oracle's
        (trials often run faster than the oracle, whose JVM and caches started cold)."""
        assert fault.delay_s is not None
        on_progress = bool(fault.after_entries)
        fraction = 0.0
        if not on_progress:
            assert self.oracle is not None
            fraction = fault.delay_s / max(self.oracle.seconds, 0.01)
        for attempt in range(KILL_RESCALES + 1):
            base = self._ledger_len()
            d = self._driver(logs / f"fault{attempt or ''}.log").start()
            out.driver_runs += 1
            if on_progress:
                while d.poll() is None and self._ledger_len() - base < (fault.after_entries or 0):
                    if d.seconds > DRIVER_TIMEOUT_S:
                        break
                    time.sleep(0.1)
                kill_at = d.seconds + fault.delay_s
            else:
                kill_at = fault.delay_s
            while d.poll() is None and d.seconds < kill_at:
                time.sleep(0.05)
            if d.poll() is None:
                d.kill()
                out.fault_fired = True
            code = d.wait(60)
            if out.fault_fired or code != 0 or attempt == KILL_RESCALES:
                return code == 0 and not out.fault_fired
            delay = fault.delay_s / 2 if on_progress else fraction * d.seconds
            fault = replace(fault, delay_s=round(delay, 2))
            out.fault = fault
            self.clean(f"trial-{out.trial:05d}")
        return False  # not reached

    def _resend(self, fault: Fault, out: TrialOutcome, logs: Path) -> bool:
        """A producer crash and re-send into a fresh trial source, then the pipeline on it
        (see the module docstring and :mod:`.resend`)."""
        from sparkonce.verify import resend

        assert fault.kill_after is not None and fault.progress_every is not None
        source = resend.trial_source(
            self.pipeline.source, log_dir=logs / "source", workdir=self.workdir, trial=out.trial
        )
        self._trial_source = source
        out.resend = {"source": mask_url(source.uri())}
        every = str(fault.progress_every)
        progress = str(logs / "producer.progress")
        common = ("--to", source.uri(), "--progress", progress, "--every", every)
        first = self._producer(
            logs / "producer1.log",
            (*common, "--producer-id", f"resend-{out.trial}-1"),
            ("--pause-after", str(fault.kill_after)),
        )
        if not _wait_stopped(first, DRIVER_TIMEOUT_S):
            code = first.wait(60)  # the copy ended before the k-th record: nothing to re-send
            if code != 0:
                raise VerificationError(
                    f"the resend producer exited with {code}: {first.log_tail(8)}"
                )
            out.resend.update(resend.window([], first.events(resend.DONE_EVENT)))
        else:
            first.kill()
            killed = first.wait(60) == SIGKILL_EXIT
            second = self._producer(
                logs / "producer2.log", (*common, "--producer-id", f"resend-{out.trial}-2")
            )
            code = second.wait(DRIVER_TIMEOUT_S)
            if code != 0:
                raise VerificationError(
                    f"the restarted resend producer exited with {code}: {second.log_tail(8)}"
                )
            found = resend.window(
                first.events(resend.PAUSE_EVENT), second.events(resend.DONE_EVENT)
            )
            out.resend.update(found)
            out.fault_fired = (
                killed and (found["killed_after"] or 0) >= 1 and (found["resent"] or 0) >= 1
            )
        d = self._driver(logs / "pipeline.log").start()
        out.driver_runs += 1
        return d.wait(DRIVER_TIMEOUT_S) == 0

    def _producer(self, log: Path, args: tuple[str, ...], more: tuple[str, ...] = ()) -> Driver:
        """Start a resend producer process (see :mod:`.resend`) in its own process group."""
        from sparkonce.verify.resend import ENTRY

        if self._aborted.is_set():
            raise VerificationError("the campaign was stopped")
        producer = Driver(self.pipeline_file, log, entry=ENTRY, extra_args=(*args, *more))
        self._drivers.append(producer)
        return producer.start()

    def _end_trial_source(self, out: TrialOutcome) -> None:
        """After a resend trial: drivers read the file's source again, and a Kafka trial
        topic is deleted (a failure to delete is reported, not a failed trial)."""
        source, self._trial_source = self._trial_source, None
        if source is None:
            return
        from sparkonce.errors import SparkOnceError
        from sparkonce.verify.resend import drop_trial_source

        try:
            drop_trial_source(source)
        except SparkOnceError as exc:
            self.on_event(
                f"trial {out.trial}: could not delete its source {mask_url(source.uri())}: {exc}"
            )

    def _zombie(self, fault: Fault, out: TrialOutcome, logs: Path) -> bool:
        old = self._driver(logs / "zombie.log", env={PAUSE_ENV: f"{fault.point}@{fault.hit}"})
        old.start()
        out.driver_runs += 1
        if not _wait_stopped(old, DRIVER_TIMEOUT_S):
            code = old.wait(60)
            if code == 0:
                out.zombie_fenced = None  # finished before the pause point: no zombie
                return True
            raise VerificationError(f"zombie-to-be exited with {code}: {old.log_tail(8)}")
        out.fault_fired = bool(old.events("pause"))
        try:
            before = self._ledger_len()
            new = self._driver(logs / "newer.log").start()
            out.driver_runs += 1
            first = self._wait_first_commit(new, before)
            code = new.wait(DRIVER_TIMEOUT_S)
            out.recovery_s = first
            out.recovery_phases = None if first is None else recovery_split(new.phases(), first)
            if code != 0:
                raise VerificationError(f"the newer run exited with {code}: {new.log_tail(8)}")
        finally:
            old.resume()
        code = old.wait(DRIVER_TIMEOUT_S)
        out.zombie_fenced = code == EXIT_FENCED and bool(old.events("fenced"))
        if not out.zombie_fenced:
            raise VerificationError(
                f"the zombie run was not fenced: it exited with {code}: {old.log_tail(8)}"
            )
        return True

    def _single_dead_letter_extra(self, reference: Sequence[dict[str, Any]]) -> tuple[str, ...]:
        """A single sink with stable output adds ``pipeline`` and ``batch_seq`` to dead
        letters, as named outputs do: not compared with the reference, which lacks them."""
        from sparkonce.outputs.output_set import DEAD_LETTER_EXTRA

        assert self.oracle is not None
        if self.pipeline.output_set is None or not self.oracle.rows:
            return ()
        shown = set(self.oracle.rows[0])
        known = {c for r in reference[:1] for c in r}
        extra = tuple(c for c in DEAD_LETTER_EXTRA if c in shown and c not in known)
        return extra if len(extra) == len(DEAD_LETTER_EXTRA) else ()

    def _check(self, out: TrialOutcome) -> None:
        assert self.oracle is not None
        rows, ledgers, owners = self._inspect()
        oracle = self.oracle.output_rows()
        diffs = {
            name: compare_output(
                oracle.get(name, []),
                rows[name],
                self.output_keys[name],
                self.nondeterministic.get(name, ()),
            )
            for name in self.sinks
        }
        out.lost_rows = sum(d.lost for d in diffs.values())
        out.duplicated_rows = sum(d.duplicated for d in diffs.values())
        out.value_mismatches = sum(d.mismatched for d in diffs.values())
        if self.multi:
            out.outputs = {name: d.counts() for name, d in diffs.items()}
        found = check_consistency(rows, self.pairs)
        out.inconsistent = sum(i.count for i in found)
        out.inconsistencies = [f"{i.pair.a} vs {i.pair.b}: {i.describe()}" for i in found]
        problems: list[str] = []
        names = self.store_names()
        for where, ledger, owner in zip(names, ledgers, owners, strict=True):
            prefix = f"{where}: " if len(ledgers) > 1 else ""
            problems += [prefix + p for p in _ledger_problems(ledger, owner)]
        problems += self._stores_apart(ledgers)
        out.ledger_problems = problems
        out.passed = (
            out.lost_rows == 0
            and out.duplicated_rows == 0
            and out.value_mismatches == 0
            and out.inconsistent == 0
            and not problems
            and out.zombie_fenced is not False
            and out.error is None
            and out.live_anomalies == 0
        )

    def _stores_apart(self, ledgers: Sequence[Sequence[LedgerEntry]]) -> list[str]:
        """A problem if the stores' ledgers hold other batches (offset ranges).

        No-data batches are left out: one commits only in the stores it has rows for
        (the last windows of an append-mode aggregation, say)."""
        if len(ledgers) < 2:
            return []

        def batches(ledger: Sequence[LedgerEntry]) -> list[str]:
            return [e.ranges.to_json() for e in ledger if not e.ranges.empty]

        first = batches(ledgers[0])
        names = self.store_names()
        out = []
        for where, ledger in zip(names[1:], ledgers[1:], strict=True):
            other = batches(ledger)
            if other != first:
                same = next(
                    (i for i, (a, b) in enumerate(zip(first, other, strict=False)) if a != b),
                    min(len(first), len(other)),
                )
                out.append(
                    f"the ledgers of {names[0]} ({len(first)} batches with data) and "
                    f"{where} ({len(other)}) hold other batches from the {same + 1}th on"
                )
        return out


def _ledger_problems(ledger: Sequence[LedgerEntry], owner: Owner | None) -> list[str]:
    """Gaps, seq numbers, epochs: what one store's ledger must get right."""
    problems = check_chain(e.ranges for e in ledger)
    seqs = [e.seq for e in ledger]
    if seqs != list(range(len(seqs))):
        problems.append(f"ledger seq numbers are not 0..{len(seqs) - 1}: {seqs[:20]}")
    epochs = [e.epoch for e in ledger]
    if epochs != sorted(epochs):
        problems.append(f"ledger epochs go backwards: {epochs[:20]}")
    if owner is not None and epochs and max(epochs) > owner.epoch:
        problems.append(f"a ledger entry has epoch {max(epochs)} > owner {owner.epoch}")
    return problems


def _store_name(names: Sequence[str], sinks: Sequence[Sink]) -> str:
    """``store sqlite:///a.db (totals, dead_letters)``: no secrets (URLs mask passwords)."""
    url = getattr(sinks[0], "url", None)
    where = str(url) if url is not None else sinks[0].describe()
    return f"store {where} ({', '.join(names)})"


def _upsert_keys(sink: Sink) -> tuple[str, ...]:
    """The sink's upsert keys (none for an append sink)."""
    if getattr(sink, "mode", None) != "upsert":
        return ()
    return tuple(getattr(sink, "keys", ()) or ())


def _check_one_store(pipeline: Pipeline) -> None:
    """``--sink URL`` moves every output to one store: refuse it for outputs in several."""
    outputs = pipeline.output_set
    if pipeline.outputs is None or outputs is None or len(outputs.groups) < 2:
        return
    stores = "; ".join(_store_name(g.names, g.sinks) for g in outputs.groups)
    raise ConfigError(
        f"--sink (or SPARKONCE_VERIFY_SINK): pipeline {pipeline.name!r} writes its outputs to "
        f"{len(outputs.groups)} stores ({stores}). --sink would move every output into one "
        "store, and the campaign would no longer test commits across stores. Leave --sink "
        "out: the trials then run in the pipeline's own stores, one at a time, and each "
        "trial wipes these outputs and the pipeline's ledger there, so point the pipeline "
        "file at test stores"
    )


def _dead_letter_extra(schema: dict[str, Any] | None) -> tuple[str, ...]:
    from sparkonce.outputs.output_set import DEAD_LETTER_EXTRA

    return tuple(DEAD_LETTER_EXTRA) if schema and schema.get("dead_letter") else ()


def run_trials(
    campaigns: Sequence[Campaign],
    trials: Iterable[int],
    on_start: Callable[[int, Fault], None] | None = None,
) -> Iterator[TrialOutcome]:
    """Run ``trials``, one at a time per campaign, and yield outcomes as they finish.

    Several campaigns are the same pipeline on separate test stores (``verify
    --sink A --sink B``): their trials run side by side. A trial's fault plan
    depends only on ``(seed, trial)`` and the shared oracle, so the result is the
    same campaign as a serial run, in another order. Leaving early (an error in
    a worker, or closing the iterator) kills the running drivers and starts no
    more trials.
    """
    if not campaigns:
        raise ConfigError("run_trials needs at least one campaign")
    oracle = campaigns[0].oracle
    if oracle is None or any(c.oracle is not oracle for c in campaigns):
        raise ConfigError("run the oracle first, and give every campaign the same oracle")
    pending = list(trials)
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for n in pending:
        todo.put(n)
    done: queue.SimpleQueue[TrialOutcome | BaseException] = queue.SimpleQueue()
    stop = threading.Event()

    def work(index: int, campaign: Campaign) -> None:
        while not stop.is_set():
            try:
                n = todo.get_nowait()
            except queue.Empty:
                return
            try:
                if on_start is not None:
                    on_start(n, campaign.plan(n))
                outcome = campaign.run_trial(n)
            except BaseException as exc:  # handed to the caller's thread
                done.put(exc)
                return
            outcome.worker = index
            done.put(outcome)

    threads = [
        threading.Thread(target=work, args=(i, c), name=f"verify-worker-{i}", daemon=True)
        for i, c in enumerate(campaigns)
    ]
    for t in threads:
        t.start()
    finished = False
    try:
        for _ in pending:
            item = done.get()
            if isinstance(item, BaseException):
                raise item
            yield item
        finished = True
    finally:
        stop.set()
        if not finished:  # an error or an early exit: no driver may outlive the campaign
            for c in campaigns:
                c.abort()
        for t in threads:
            t.join()


def _wait_stopped(d: Driver, timeout: float) -> bool:
    """Wait until the driver SIGSTOPped itself (state 'T'); False if it exited first."""
    deadline = time.monotonic() + timeout
    stat = Path(f"/proc/{d.pid}/stat")
    while time.monotonic() < deadline:
        if d.poll() is not None:
            return False
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            state = ""
        if state in ("T", "t"):
            return True
        time.sleep(0.1)
    d.kill()
    raise VerificationError(f"the driver did not reach its pause point in {timeout:.0f} s")


@dataclass
class KindSummary:
    kind: str
    trials: int
    passed: int
    fired: int
    lost_rows: int
    duplicated_rows: int
    value_mismatches: int
    recovery_mean_s: float | None
    recovery_p95_s: float | None
    inconsistent: int = 0
    # Means of the recoveries' split (recovery_split), over the trials that recorded it.
    recovery_phases_mean_s: dict[str, float] | None = None
    live_observations: int = 0  # the live readers' observations, every store
    live_anomalies: int = 0


def failure_hint(outcomes: Sequence[TrialOutcome]) -> str | None:
    """One line for failed ``resend`` trials that counted re-sent records again (duplicated
    rows or other values): how to remove such duplicates. None if there are none."""
    trials = [
        o.trial
        for o in outcomes
        if o.fault.kind == "resend" and not o.passed and (o.duplicated_rows or o.value_mismatches)
    ]
    if not trials:
        return None
    return f"resend trials {trials[:20]}: {RESEND_HINT}"


def summarize(outcomes: Sequence[TrialOutcome], kinds: Sequence[str]) -> list[KindSummary]:
    out = []
    for kind in dict.fromkeys(k.partition(":")[0] for k in kinds):
        mine = [o for o in outcomes if o.fault.kind == kind]
        if not mine:
            continue
        rec = sorted(o.recovery_s for o in mine if o.recovery_s is not None)
        p95 = rec[min(len(rec) - 1, round(0.95 * (len(rec) - 1)))] if rec else None
        out.append(
            KindSummary(
                kind,
                len(mine),
                sum(o.passed for o in mine),
                sum(o.fault_fired for o in mine),
                sum(o.lost_rows for o in mine),
                sum(o.duplicated_rows for o in mine),
                sum(o.value_mismatches for o in mine),
                statistics.fmean(rec) if rec else None,
                p95,
                sum(o.inconsistent for o in mine),
                _mean_phases([o.recovery_phases for o in mine if o.recovery_phases]),
                sum(s.get("observations", 0) for o in mine for s in o.live),
                sum(o.live_anomalies for o in mine),
            )
        )
    return out


def live_totals(outcomes: Sequence[TrialOutcome]) -> list[dict[str, Any]]:
    """The live readers' findings per store over all trials: observations, anomalies by
    kind with the first few examples (each naming its trial), read errors."""
    from sparkonce.verify.live import ANOMALY_KINDS, EXAMPLES

    stores: dict[str, dict[str, Any]] = {}
    for o in sorted(outcomes, key=lambda o: o.trial):
        for found in o.live:
            doc = stores.setdefault(
                found["store"],
                {
                    "store": found["store"],
                    "reader": found.get("reader"),
                    "trials": 0,
                    "observations": 0,
                    "anomalies": dict.fromkeys(ANOMALY_KINDS, 0),
                    "examples": {},
                    "read_errors": 0,
                },
            )
            doc["trials"] += 1
            doc["observations"] += found.get("observations", 0)
            doc["read_errors"] += found.get("read_errors", 0)
            if found.get("not_read"):
                doc["not_read"] = found["not_read"]
            for kind, n in found.get("anomalies", {}).items():
                doc["anomalies"][kind] = doc["anomalies"].get(kind, 0) + n
            for kind, examples in found.get("examples", {}).items():
                shown = doc["examples"].setdefault(kind, [])
                shown += [f"trial {o.trial}, {e}" for e in examples][: EXAMPLES - len(shown)]
    return list(stores.values())


RECOVERY_PHASES = ("start_s", "plan_s", "first_batch_s")
RECOVERY_GOAL = 1.5  # recovery p95 at most this times the oracle's start to first commit


def recovery_split(phases: dict[str, float], recovery_s: float) -> dict[str, float] | None:
    """A recovering run's time, from its process start to its first new ledger entry (or
    its end, when it had nothing new to commit), in three parts: ``start_s`` (the process,
    its imports and its Spark session), ``plan_s`` (reading the ledger, taking the epoch,
    planning and starting the query) and ``first_batch_s``, the rest (Spark plans, runs
    and commits the first batch: the replayed one, or the next). None when the run did not
    record its marks (a driver of an older sparkonce)."""
    try:
        run, query = phases["run-started"], phases["query-started"]
    except KeyError:
        return None
    return {
        "start_s": round(run, 3),
        "plan_s": round(query - run, 3),
        "first_batch_s": round(max(0.0, recovery_s - query), 3),
    }


def recovery_goal(
    outcomes: Sequence[TrialOutcome], oracle: Oracle | None, at_a_time: int = 1
) -> dict[str, Any] | None:
    """The recovery goal: the p95 of every recovery at most :data:`RECOVERY_GOAL` times the
    oracle's time from its start to its first commit (a cold start plus one batch).

    The oracle always runs alone. ``at_a_time`` is how many trials ran side by side
    (one per ``--sink``): above 1, each recovery shared the machine with another trial's
    drivers while the oracle did not, so the ratio overstates recovery; the result says
    so (``fair``: False), and only a campaign with one store judges the goal.
    """
    rec = sorted(o.recovery_s for o in outcomes if o.recovery_s is not None)
    if not rec or oracle is None or not oracle.first_commit_s:
        return None
    p95 = rec[min(len(rec) - 1, round(0.95 * (len(rec) - 1)))]
    limit = RECOVERY_GOAL * oracle.first_commit_s
    return {
        "recoveries": len(rec),
        "p95_s": round(p95, 2),
        "cold_start_and_one_batch_s": oracle.first_commit_s,
        "limit_s": round(limit, 2),
        "ratio": round(p95 / oracle.first_commit_s, 2),
        "met": p95 <= limit,
        "trials_at_a_time": at_a_time,
        "fair": at_a_time == 1,
    }


def _mean_phases(split: Sequence[dict[str, float]]) -> dict[str, float] | None:
    if not split:
        return None
    return {k: round(statistics.fmean(s[k] for s in split), 2) for k in RECOVERY_PHASES}


@dataclass
class Recorded:
    """What an earlier segment of a campaign left in its ``verify.json``."""

    outcomes: list[TrialOutcome] = field(default_factory=list)
    oracle_seconds: float | None = None  # the run time its kill delays were planned on
    # The oracle's time to its first entry and between entries (None: an older report).
    oracle_timing: tuple[float | None, float | None] = (None, None)

    def split(self) -> tuple[list[TrialOutcome], list[int]]:
        """(trials to keep, trials to run again): a passed trial whose fault did not
        fire tested nothing and runs again; a failed trial is always kept."""
        keep = [o for o in self.outcomes if o.fault_fired or not o.passed]
        again = sorted(o.trial for o in self.outcomes if o.passed and not o.fault_fired)
        return keep, again

    def fault_of(self, trial: int) -> Fault | None:
        """The fault recorded for ``trial`` (None if the report does not hold it)."""
        return next((o.fault for o in self.outcomes if o.trial == trial), None)


def load_report(path: Path, seed: int, kinds: Sequence[str]) -> Recorded:
    """The trials and oracle time in ``path``, written by a campaign with the same
    seed and faults (empty if there is no such file)."""
    if not path.exists():
        return Recorded()
    try:
        doc = json.loads(path.read_text())
        if doc.get("seed") != seed or list(doc.get("faults", [])) != list(kinds):
            raise ConfigError(
                f"{path} holds a campaign with seed {doc.get('seed')} and faults "
                f"{doc.get('faults')}; --resume and --replay need the same --seed and "
                "--faults (or another --out)"
            )
        out = []
        for t in doc.get("trials", []):
            fault = Fault(**t.pop("fault"))
            out.append(TrialOutcome(fault=fault, **t))
        oracle = doc.get("oracle") or {}
        seconds = oracle.get("seconds")

        def number(name: str) -> float | None:
            v = oracle.get(name)
            return float(v) if v is not None else None

        return Recorded(
            out,
            float(seconds) if seconds is not None else None,
            (number("first_commit_s"), number("batch_interval_s")),
        )
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{path} is not a verify report this version can read ({exc}); "
            "move it away, or give another --out"
        ) from exc


def write_json(
    path: Path,
    campaign: Campaign,
    outcomes: Sequence[TrialOutcome],
    elapsed_s: float,
    stores: Sequence[str] = (),
    ran: int | None = None,
) -> None:
    """The campaign report. ``elapsed_s`` is the wall time of this invocation, which ran
    ``ran`` of the trials (default: all of them; fewer after ``--resume``);
    ``trial_seconds`` sums every recorded trial, across all segments. ``stores`` lists
    the test stores of parallel trials."""
    oracle = campaign.oracle
    reference: ReferenceCheck | None = getattr(campaign, "reference", None)
    doc: dict[str, Any] = {
        "pipeline_file": str(campaign.pipeline_file),
        "pipeline": campaign.pipeline.name,
        "sink": campaign.pipeline.sink.describe(),
        "stores": list(stores) or [campaign.pipeline.sink.describe()],
        "seed": campaign.seed,
        "faults": list(campaign.kinds),
        "oracle": None
        if oracle is None
        else {
            "rows": len(oracle.rows),
            "batches": oracle.batches,
            "seconds": oracle.seconds,
            "first_commit_s": oracle.first_commit_s,
            "batch_interval_s": oracle.batch_interval_s,
            "phases": oracle.phases,
        },
        "reference": None if reference is None else reference.to_json(),
        "this_run": {
            "trials": len(outcomes) if ran is None else ran,
            "elapsed_s": round(elapsed_s, 1),
        },
        "trial_seconds": round(sum(o.seconds for o in outcomes), 1),
        "summary": [asdict(s) for s in summarize(outcomes, campaign.kinds)],
        "recovery_goal": recovery_goal(outcomes, oracle, max(1, len(stores))),
        "live": {
            "interval_s": getattr(campaign, "live_interval_s", None),
            "stores": live_totals(outcomes),
        },
        "trials": [_trial_json(o) for o in sorted(outcomes, key=lambda o: o.trial)],
    }
    doc.update(_outputs_section(campaign, outcomes))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    tmp.replace(path)


def _trial_json(outcome: TrialOutcome) -> dict[str, Any]:
    """A trial as the report holds it: the fields of resend trials only appear in those."""
    doc = asdict(outcome)
    if outcome.resend is None:
        del doc["resend"]
    for name in ("kill_after", "progress_every", "after_entries"):
        if doc["fault"][name] is None:
            del doc["fault"][name]
    return doc


def _outputs_section(campaign: Campaign, outcomes: Sequence[TrialOutcome]) -> dict[str, Any]:
    """The report's parts about outputs and declared columns (none for a single sink
    without declared columns, so such reports keep their old shape)."""
    doc: dict[str, Any] = {}
    declared = getattr(campaign, "declared", ())
    if declared:
        doc["nondeterministic"] = {
            "declared": [str(s) for s in declared],
            "columns": {n: list(c) for n, c in campaign.nondeterministic.items()},
        }
    if getattr(campaign, "multi", False):
        oracle = campaign.oracle.output_rows() if campaign.oracle is not None else {}
        store_of = {n: i for i, names in enumerate(campaign.stores) for n in names}
        doc["stores_of_outputs"] = campaign.store_names()
        doc["outputs"] = {
            name: {
                "sink": sink.describe(),
                "store": store_of[name],
                "keys": list(campaign.output_keys[name]),
                "nondeterministic": list(campaign.nondeterministic.get(name, ())),
                "oracle_rows": len(oracle[name]) if name in oracle else None,
                **{
                    k: sum(o.outputs.get(name, {}).get(k, 0) for o in outcomes)
                    for k in ("lost_rows", "duplicated_rows", "value_mismatches", "null_values")
                },
            }
            for name, sink in campaign.sinks.items()
        }
    if getattr(campaign, "pairs", None) or getattr(campaign, "skipped_pairs", None):
        doc["consistency"] = {
            "checked": [p.describe() for p in campaign.pairs],
            "not_checked": [
                {"pair": p.describe(), "oracle": i.describe()} for p, i in campaign.skipped_pairs
            ],
            "inconsistent": sum(o.inconsistent for o in outcomes),
        }
    return doc


def write_chart(path: Path, outcomes: Sequence[TrialOutcome], kinds: Sequence[str]) -> bool:
    """A PNG box plot of recovery times per fault kind. False if nothing to plot."""
    data = [
        (k, [o.recovery_s for o in outcomes if o.fault.kind == k and o.recovery_s is not None])
        for k in dict.fromkeys(k.partition(":")[0] for k in kinds)
    ]
    data = [(k, v) for k, v in data if v]
    if not data:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.boxplot([v for _, v in data], tick_labels=[k for k, _ in data])
    ax.set_ylabel("recovery time (s)")
    ax.set_title(f"sparkonce verify: recovery time per fault kind ({len(outcomes)} trials)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _entry_timing(
    entries: Sequence[LedgerEntry], started_wall: float
) -> tuple[float | None, float | None]:
    """(seconds from the driver's start to its first ledger entry, median seconds between
    two entries) of a failure-free run; the interval of a one-entry run is half the first."""
    if not entries:
        return None, None
    stamps = [e.committed_at.timestamp() for e in entries]
    first = round(max(0.1, stamps[0] - started_wall), 2)
    gaps = [b - a for a, b in itertools.pairwise(stamps) if b > a]
    interval = statistics.median(gaps) if gaps else first / 2
    return first, round(max(0.1, interval), 2)
