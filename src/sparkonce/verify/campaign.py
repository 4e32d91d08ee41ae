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
``broker-kill`` (opt-in; needs ``broker``, :class:`~.injection.BrokerKill`)
    One Kafka broker node of the user's multi-broker cluster is killed by the user's
    command at a moment planned like ``kill``'s, and started again by the user's command
    ``down_s`` later (always, once killed). The run must finish by itself: a driver exit
    fails the trial. The node comes from the trial's seed.
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
import random
import re
import shutil
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sparkonce.errors import ConfigError, SparkOnceError, VerificationError
from sparkonce.files import join, location
from sparkonce.ledger.base import LedgerEntry, Owner
from sparkonce.offsets import check_chain
from sparkonce.outputs.output_set import SINGLE_OUTPUT
from sparkonce.pipeline.loader import load_pipeline
from sparkonce.pipeline.pipeline import Pipeline
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
from sparkonce.verify.driver import Driver
from sparkonce.verify.injection import DRIVER_TIMEOUT_S, MAX_RESTARTS, BrokerKill, Injection
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
from sparkonce.verify.model import FAULT_KINDS, Fault, Oracle, TrialOutcome, plan_fault
from sparkonce.verify.reference import ENTRY as REFERENCE_ENTRY
from sparkonce.verify.reference import (
    ReferenceCheck,
    ReferenceMismatchError,
    first_batch_apart,
    load_output_references,
    load_reference,
    output_semantics,
    planned_batches,
    read_output_schemas,
    sink_semantics,
)
from sparkonce.verify.summary import recovery_split


class Campaign(Injection):
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
        remote: str | None = None,
        checkpoint_root: str | None = None,
        live_interval_s: float | None = DEFAULT_INTERVAL_S,
        broker: BrokerKill | None = None,
    ) -> None:
        """``master``: the Spark master of every trial driver (default: ``sparkonce run``'s).
        ``remote`` (``local[N]``): every driver runs on a Spark Connect session instead, as
        the client of a Connect server it starts (:func:`check_remote` says why only a
        local one).
        ``checkpoint_root``: a directory or URL under which every run gets a fresh checkpoint
        of its own, left in place (default: ``workdir/checkpoint``, removed between runs).
        ``live_interval_s``: how often the live readers poll each store during a trial
        (:mod:`.live`); None: no live reader. ``broker``: how to kill and start a broker
        node, for the ``broker-kill`` kind (needed by it, used by nothing else)."""
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
        if "broker-kill" in self.kinds and broker is None:
            raise ConfigError(
                "--faults broker-kill needs --broker-nodes, --broker-kill-command and "
                "--broker-start-command: which brokers there are, and how to kill and start one"
            )
        self.broker = broker
        base = load_pipeline(self.pipeline_file)
        if sink_url:
            _check_one_store(base)
        if "resend" in self.kinds:
            from sparkonce.verify.resend import check_source

            check_source(base.source, base.name)
        self.pipeline_name = base.name
        self.master = master
        self.remote = remote
        if remote is not None:
            check_remote(remote, master)
            if "task-failure" in self.kinds:
                if tuple(kinds) != FAULT_KINDS:
                    raise ConfigError(
                        f"--faults task-failure with --remote {remote}: a Spark Connect "
                        "session takes no injected task faults; choose among kill, "
                        "crash-point, db-drop, zombie"
                    )
                self.kinds = tuple(k for k in self.kinds if k != "task-failure")
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
                # A second reader that cannot run is refused now, not after the oracle.
                self._inspectors[name].check_readers()
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
        self._readers_agree_on_oracle(rows, driver.log_path)
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

    def _other_rows(self) -> dict[str, tuple[str, list[dict[str, Any]]]]:
        """What each output's other readers (:meth:`Inspector.other_readers`) see now:
        ``label -> (output, rows)``, the label ``READER`` (``OUTPUT:READER`` with several
        outputs)."""
        out = {}
        for name, inspector in self._inspectors.items():
            for reader, read in inspector.other_readers().items():
                label = f"{name}:{reader}" if self.multi else reader
                out[label] = (name, read())
        return out

    def _readers_agree_on_oracle(self, rows: dict[str, list[dict[str, Any]]], log: Path) -> None:
        """The failure-free run's rows as every other reader sees them: the same rows as
        the inspector's own read, or the campaign stops (a reader that disagrees with no
        fault at all would fail every trial, and says nothing about the commit)."""
        for label, (name, seen) in self._other_rows().items():
            diff = compare_output(rows[name], seen, self.output_keys[name])
            if diff.lost or diff.duplicated or diff.mismatched:
                raise VerificationError(
                    f"after the failure-free run of {self.pipeline_file}, reader {label} sees "
                    f"{len(seen)} rows where the sink's inspector sees {len(rows[name])} "
                    f"({diff.lost} missing, {diff.duplicated} more, {diff.mismatched} other "
                    f"values); the two readers of the same table disagree before any fault. "
                    f"See {log}"
                )

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
        if not check.matched:
            check = replace(check, batches_apart=self._batches_apart(checkpoint))
        shutil.rmtree(checkpoint, ignore_errors=True)
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

    def _batches_apart(self, checkpoint: Path) -> str:
        """Where the reference run's planned batches (its checkpoint's offset log) first
        differ from the failure-free run's ledger ("" if they agree or cannot be read)."""
        try:
            planned = planned_batches(checkpoint, self.pipeline.source)
            ledger = [entry.ranges for entry in self._ledgers()[0]]
        except SparkOnceError as exc:
            self.on_event(f"reference: its batches were not compared with the ledger: {exc}")
            return ""
        return first_batch_apart(planned, ledger) or ""

    # -- one trial ---------------------------------------------------------------------
    def trial_seed(self, trial: int) -> str:
        return f"{self.seed}:{trial}"

    def plan(self, trial: int) -> Fault:
        if trial in self.recorded_faults:
            return self.recorded_faults[trial]
        assert self.oracle is not None, "run_oracle() first"
        rng = random.Random(self.trial_seed(trial))
        kind = self.kinds[trial % len(self.kinds)]
        nodes = self.broker.nodes if self.broker is not None else ()
        return plan_fault(kind, rng, self.oracle, len(self.stores), nodes)

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
        # The same checks by every other reader of an output (DuckDB for an Iceberg table):
        # each must see the oracle's rows; the trial counts the worst reader's.
        for label, (name, seen) in self._other_rows().items():
            d = compare_output(
                oracle.get(name, []),
                seen,
                self.output_keys[name],
                self.nondeterministic.get(name, ()),
            )
            out.readers[label] = {**d.counts(), "rows": len(seen)}
            out.lost_rows = max(out.lost_rows, d.lost)
            out.duplicated_rows = max(out.duplicated_rows, d.duplicated)
            out.value_mismatches = max(out.value_mismatches, d.mismatched)
        leftovers: dict[str, int] = {}
        for inspector in (self._inspectors[names[0]] for names in self.stores):
            left = inspector.leftovers(self.pipeline.name)
            for k, n in (left or {}).items():
                leftovers[k] = leftovers.get(k, 0) + n
            if left is not None and out.leftovers is None:
                out.leftovers = leftovers
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


def check_remote(remote: str, master: str | None) -> None:
    """Raise :class:`ConfigError` unless ``remote`` names a local Spark Connect server.

    A campaign must kill and pause the process that commits. On Spark Connect that is a
    Python worker of the server, so each trial driver starts its own server (``local[N]``,
    a server in the driver's process group, as a machine running both would be): a kill
    takes the client and its server down together, a crash point SIGKILLs the worker, and a
    zombie is a server whose worker is frozen while a newer driver's server runs. A shared
    server (``sc://``) cannot be paused for one trial without pausing every client's."""
    if master is not None:
        raise ConfigError(
            f"--master {master} and --remote {remote} exclude each other: give one of them"
        )
    if remote != "local" and not re.fullmatch(r"local\[([1-9][0-9]*|\*)\]", remote):
        raise ConfigError(
            f"--remote {remote}: sparkonce verify runs each trial on a Spark Connect server "
            "of its own, so it takes local or local[N] (a server beside each trial driver); "
            "a shared server (sc://...) cannot be killed or paused for one trial"
        )


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
