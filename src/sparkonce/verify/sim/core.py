"""One schedule against one target: drive the events, then check the invariants."""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sparkonce.commit import CORRECT_STEPS, CommitSteps, Committer
from sparkonce.errors import FencedError, LedgerError
from sparkonce.faults import FaultPlan
from sparkonce.ledger.base import BatchContext, CommitResult, LedgerEntry
from sparkonce.offsets import BatchRanges, TopicPartition, check_chain, plan_batch
from sparkonce.protocol import CrashPoint
from sparkonce.verify.sim.schedule import Event, Grow, Repeat, Schedule, Stale, Start, Step, Thaw
from sparkonce.verify.sim.target import Observer, Planned, Row
from sparkonce.verify.sim.world import (
    Checkpoint,
    Failure,
    InjectedFailure,
    Run,
    SimCrash,
    Stats,
    Zombie,
    crash,
    short,
    spans,
)

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.verify.sim.target import Entry, Target

TOPIC = "events"
TIMER_PARTITION = -1  # a no-data batch's timer row: (-1, batch id, checkpoint id, epoch)
_NO_FAULTS = FaultPlan(on_crash=crash)
_PLAIN_STEP = Step()


class Simulation(Observer):
    """Runs one schedule against a target and checks the invariants."""

    def __init__(
        self,
        schedule: Schedule,
        target: Target,
        steps: CommitSteps = CORRECT_STEPS,
    ) -> None:
        self.s = schedule
        self.t = target
        self.steps = steps
        self.available = {(TOPIC, p): n for p, n in enumerate(schedule.initial)}
        self.runs: list[Run] = []
        self.failures: list[Failure] = []
        self.stats = Stats(schedules=1)
        self.clock = 0
        self.acquired: list[tuple[int, int]] = []  # (tick, epoch), on the logical clock
        self.stamps: list[tuple[int, LedgerEntry]] = []  # (tick, entry) of committed txns
        self.completed_nodata: set[tuple[str, int]] = set()
        self.backups: list[Checkpoint] = []  # the pipeline's checkpoint after each plan
        self.failed_attempts: list[int] = []  # two-phase: attempts that must stay invisible
        # Sinks whose tasks commit before the ledger entry (Kafka): the checkpoint that
        # planned a batch whose tasks committed and whose entry did not; a run that plans
        # another batch is refused, and the operator restores this checkpoint.
        self.partial: Checkpoint | None = None
        self.operator_restore = False
        self.refusals: list[str] = []  # named when the final run cannot drain
        seed = schedule.seed
        # Record (p, o)'s value, the row's third column.
        self.values = [[f"{seed}/{p}/{o}" for o in range(n)] for p, n in enumerate(schedule.totals)]

    # -- the logical clock --------------------------------------------------------------
    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def committed(self, entries: list[LedgerEntry]) -> None:
        t = self.tick()
        self.stamps += [(t, e) for e in entries]
        self.partial = None  # the batch ledger moved on: no batch is partly committed now

    def owner_at(self, t: int) -> int | None:
        owner = None
        for at, epoch in self.acquired:
            if at < t:
                owner = epoch
        return owner

    def fail(self, kind: str, detail: str) -> None:
        self.failures.append(Failure(kind, detail))

    # -- driving ------------------------------------------------------------------------
    def run(self) -> list[Failure]:
        """Run the schedule, then check the invariants; returns the failures."""
        try:
            for i, event in enumerate(self.s.events):
                self._apply(i, event)
            self._final()
            self._check()
        except Exception as exc:  # the harness or the store failed: a failure too
            self.fail("harness", f"{type(exc).__name__}: {exc}")
        finally:
            self._release()
        return self.failures

    def _apply(self, i: int, event: Event) -> None:
        if type(event) is Step:
            run = self.runs[-1] if self.runs else None
            if run is not None and run.state == "live":
                self._step(run, event, i)
        elif type(event) is Start:
            self._start(event)
        elif type(event) is Thaw:
            frozen = [r for r in self.runs if r.state == "frozen"]
            if frozen:
                self._thaw(frozen[event.index % len(frozen)], event.kill, f"event {i}")
        elif type(event) is Repeat:
            run = self.runs[-1] if self.runs else None
            if run is not None and run.state == "live":
                self._repeat(run, f"event {i}")
        elif type(event) is Stale:
            newest = self.runs[-1] if self.runs else None
            stale = [r for r in self.runs if r.state == "live" and r is not newest]
            if stale:
                self._stale(stale[event.index % len(stale)], f"event {i}")
        elif type(event) is Grow:
            tp = (TOPIC, event.partition % len(self.s.totals))
            self.available[tp] = min(self.s.totals[tp[1]], self.available[tp] + event.count)
        if self.failed_attempts:
            self._check_attempts(f"after event {i}")

    def _committer(self, run: Run, faults: FaultPlan) -> Committer:
        run.endpoint.stager.task_steps = self.steps.tasks  # a planted bug's tasks, if any
        return Committer(run.endpoint.store, run.endpoint.stager, faults=faults, steps=self.steps)

    def _newest(self) -> Run | None:
        return self.runs[-1] if self.runs else None

    def _start(self, ev: Start) -> Run:
        ep = self.t.take()
        ep.store.observer = self
        previous = self._newest()
        owner = self.t.acquire(ep)
        last_epoch = self.acquired[-1][1] if self.acquired else 0
        if owner.epoch != last_epoch + 1:
            self.fail("epoch", f"acquire returned epoch {owner.epoch} after {last_epoch}")
        self.acquired.append((self.tick(), owner.epoch))
        self.stats.runs += 1
        if self.operator_restore and self.partial is not None:
            # The operator restores the checkpoint that planned the partly committed batch.
            checkpoint = self.partial.copy()
            self.operator_restore = False
        elif ev.restore and self.backups:
            checkpoint = self.backups[-min(ev.restore, len(self.backups))].copy()
            checkpoint.restored = True
        elif ev.keep_checkpoint and previous is not None:
            checkpoint = previous.checkpoint.copy()
        else:
            checkpoint = Checkpoint(f"q{len(self.runs)}")
        resume: dict[TopicPartition, int] = {}
        if not checkpoint.planned:  # a new or lost checkpoint: resume from the ledger,
            last = ep.store.last(self.t.pipeline)  # read after taking the epoch
            resume = {} if last is None else last.end_offsets
        run = Run(
            len(self.runs),
            owner.epoch,
            ep,
            checkpoint,
            resume,
            ev.max_per_partition,
            ev.max_total,
        )
        self.runs.append(run)
        return run

    def _plan(self, run: Run, nodata: bool, quiet: bool = False) -> Planned | None:
        """The run's next batch, written to its offset log (None: Spark runs no batch)."""
        ck = run.checkpoint
        start = ck.planned[-1].ends if ck.planned else run.resume
        ranges = plan_batch(
            start,
            self.available,
            max_per_partition=run.max_per_partition,
            max_total=run.max_total,
        )
        nodata = nodata and ranges.count == 0  # as Spark: only when no new input is there
        if nodata:
            if not ck.planned:
                return None  # a no-data batch follows a batch of the same checkpoint
            ranges = BatchRanges.at(start)
        elif ranges.count == 0:
            return None
        batch = Planned(len(ck.planned), ranges, nodata, nodata and quiet)
        ck.planned.append(batch)
        if run is self.runs[-1]:  # the pipeline's checkpoint: a backup may copy it
            self.backups.append(ck.copy())
        return batch

    def _rows(self, run: Run, batch: Planned) -> list[Row]:
        if batch.nodata:
            if batch.quiet:
                return []
            return [(TIMER_PARTITION, batch.batch_id, run.checkpoint.id, run.epoch)]
        values = self.values
        epoch = run.epoch
        return [
            (r.partition, o, values[r.partition][o], epoch)
            for r in batch.ranges.ranges
            for o in range(r.start, r.end)
        ]

    def _ctx(self, run: Run, batch: Planned) -> BatchContext:
        return BatchContext(
            self.t.pipeline, run.epoch, batch.ranges, batch.batch_id, run.checkpoint.id
        )

    def _step(self, run: Run, ev: Step, index: int | str) -> None:
        batch = run.checkpoint.pending or self._plan(run, ev.nodata, ev.quiet)
        if batch is None:
            return
        ctx = self._ctx(run, batch)
        if ev.crash or ev.drop:
            crash_at = (CrashPoint(ev.crash[0]), ev.crash[1]) if ev.crash else None
            drop = (CrashPoint.AFTER_ROWS, 1) if ev.drop else None
            plan = FaultPlan(crash=crash_at, drop_connection=drop, on_crash=crash)
        else:
            crash_at, plan = None, _NO_FAULTS
        committer = self._committer(run, plan)
        stage, attempts, failed = self.t.stage(run, ctx, batch, self._rows(run, batch), ev.fail)
        where = f"event {index}" if isinstance(index, int) else index
        frame = getattr(stage, "frame", None)
        before = len(self.stamps)
        if ev.freeze:
            zombie = Zombie(committer, ctx, stage, attempts)
            zombie.frame = frame
            if frame is not None and batch.batch_id % 2:
                frame.before_tasks = zombie.freeze_here  # frozen before its tasks start
            zombie.start()
            self.failed_attempts += failed
            if zombie.froze:
                run.state, run.zombie = "frozen", zombie
                self.stats.zombies += 1
                if frame is not None and frame.wrote and self.t.tasks_commit_early:
                    self.partial = run.checkpoint.copy()
                return
            what = functools.partial(self._what, where, run, batch, ctx)
            self._outcome(run, batch, zombie.result, zombie.error, what, owner=True, ev=ev)
            return
        self.stats.drops += ev.drop + ev.lost_ack
        store = run.endpoint.store
        store.lose_ack = int(ev.lost_ack)
        result: CommitResult | None = None
        error: BaseException | None = None
        try:
            result = committer.commit_with(ctx, stage)
        except (Exception, SimCrash) as exc:
            error = exc
        finally:
            store.lose_ack = 0
        self.failed_attempts += failed
        if len(self.stamps) == before:  # no ledger entry landed
            self.failed_attempts += attempts
            if frame is not None and frame.wrote and self.t.tasks_commit_early:
                self.partial = run.checkpoint.copy()
        if ev.fail and isinstance(error, InjectedFailure):
            self._die(run)
            return
        what = functools.partial(self._what, where, run, batch, ctx)
        self._outcome(run, batch, result, error, what, True, ev)

    @staticmethod
    def _what(where: str, run: Run, batch: Planned, ctx: BatchContext) -> str:
        return f"{where}: run {run.index} (epoch {run.epoch}) batch {batch.batch_id} [{ctx.ranges}]"

    def _outcome(
        self,
        run: Run,
        batch: Planned,
        result: CommitResult | None,
        error: BaseException | None,
        describe: str | Callable[[], str],
        owner: bool,
        ev: Step | None = None,
    ) -> None:
        """Judge a commit's outcome; mark the batch done or the run dead."""

        def what() -> str:
            return describe if isinstance(describe, str) else describe()

        if error is not None:
            if isinstance(error, SimCrash):
                self.stats.crashes += 1
            elif isinstance(error, FencedError):
                self.stats.fenced += 1
                if owner:
                    self.fail("owner-error", f"{what()}: the owner's commit raised {short(error)}")
            elif isinstance(error, LedgerError) and self._may_refuse(run):
                self.stats.refused += 1
                self.refusals.append(short(error))
                if owner and self.partial is not None and not run.checkpoint.restored:
                    self.operator_restore = True
            elif self._injected(ev, error):
                pass  # the injected connection fault stops a run whose store does not retry
            elif owner:
                self.fail("owner-error", f"{what()}: the owner's commit raised {short(error)}")
            elif not isinstance(error, LedgerError):
                self.fail("fenced-error", f"{what()}: a fenced run's commit raised {short(error)}")
            self._die(run)
            return
        assert result is not None
        if not owner and not result.skipped:
            self.fail("fenced-commit", f"{what()}: a fenced run committed ({result})")
        if result.skipped:
            self.stats.skips += 1
        else:
            self.stats.commits += 1
        if batch.nodata:
            self.stats.nodata += 1
            # Owed to readers: a no-data batch the owner completed. Not one "skipped" with no
            # entry of its own because its offsets lie behind a ledger that other runs moved
            # on: a fenced run's, or a restored checkpoint's (a history the ledger did not take).
            superseded = result.skipped and result.seq is None
            if owner and not batch.quiet and not (superseded and run.checkpoint.restored):
                self.completed_nodata.add((run.checkpoint.id, batch.batch_id))
        if run.checkpoint.pending == batch:
            run.checkpoint.done += 1

    def _may_refuse(self, run: Run) -> bool:
        """Whether a run may stop with ``LedgerError`` (its message names the operator's fix).

        A checkpoint restored behind the ledger; and, for sinks whose tasks commit first
        (Kafka), a batch another checkpoint left partly committed.
        """
        if run.checkpoint.restored:
            return True
        return self.t.tasks_commit_early and self.partial is not None

    def _injected(self, ev: Step | None, error: BaseException) -> bool:
        if ev is None or not (ev.drop or ev.lost_ack) or self.t.retries_connection_faults:
            return False
        return isinstance(error, self.t.connection_fault_error)

    def _die(self, run: Run) -> None:
        run.state = "dead"
        self.t.give_back(run.endpoint)

    def _thaw(self, run: Run, kill: bool, where: str) -> None:
        zombie = run.zombie
        assert zombie is not None
        run.zombie = None
        run.state = "live"
        before = len(self.stamps)
        frame = zombie.frame
        wrote_before = frame is not None and frame.wrote
        zombie.thaw(kill)
        batch = run.checkpoint.pending
        assert batch is not None
        fenced = run.epoch < self.acquired[-1][1]
        if len(self.stamps) == before:  # no ledger entry landed
            self.failed_attempts += zombie.attempts
            # Its tasks ran after the thaw (it froze before them) and wrote: partly committed.
            if frame is not None and frame.wrote and not wrote_before and self.t.tasks_commit_early:
                self.partial = run.checkpoint.copy()
        what = f"{where}: zombie run {run.index} (epoch {run.epoch}) batch {batch.batch_id}"
        # Kafka: a zombie frozen before its tasks runs them first on thaw; a task refuses a
        # batch its marker contradicts (LedgerError) before the driver's fence check.
        refusals = (FencedError, LedgerError) if self.t.tasks_commit_early else FencedError
        if fenced and not kill and not isinstance(zombie.error, refusals):
            got = short(zombie.error) if zombie.error else f"result {zombie.result}"
            self.fail("zombie-not-fenced", f"{what}: expected FencedError, got {got}")
            self._die(run)
            return
        self._outcome(run, batch, zombie.result, zombie.error, what, owner=not fenced)

    def _repeat(self, run: Run, where: str) -> None:
        batch = run.checkpoint.last_done
        if batch is None:
            return
        ctx = self._ctx(run, batch)
        committer = self._committer(run, _NO_FAULTS)
        stage, attempts, failed = self.t.stage(run, ctx, batch, self._rows(run, batch), False)
        what = f"{where}: run {run.index} repeats batch {batch.batch_id} [{ctx.ranges}]"
        try:
            result = committer.commit_with(ctx, stage)
        except Exception as exc:
            self.fail("repeat", f"{what}: raised {short(exc)}")
            self._die(run)
            return
        finally:
            self.failed_attempts += failed + attempts
        if not result.skipped:
            self.fail("repeat", f"{what}: committed again ({result})")

    def _stale(self, run: Run, where: str) -> None:
        batch = run.checkpoint.pending or self._plan(run, False)
        if batch is None:
            return
        ctx = self._ctx(run, batch)
        committer = self._committer(run, _NO_FAULTS)
        what = f"{where}: stale run {run.index} (epoch {run.epoch}) batch {batch.batch_id}"
        result: CommitResult | None = None
        error: BaseException | None = None
        stage, attempts, failed = self.t.stage(run, ctx, batch, self._rows(run, batch), False)
        try:
            result = committer.commit_with(ctx, stage)
        except (Exception, SimCrash) as exc:
            error = exc
        self.failed_attempts += failed
        if result is None or result.skipped:
            self.failed_attempts += attempts
        self._outcome(run, batch, result, error, what, owner=False)

    def _final(self) -> None:
        for tp in self.available:
            self.available[tp] = self.s.totals[tp[1]]
        final = self.s.final
        newest = self._newest()
        if newest is not None and newest.checkpoint.restored:
            final = replace(final, keep_checkpoint=False)  # as the LedgerError advises
        for attempt in range(3):
            refused = self.stats.refused
            run = self._start(final)
            if attempt == 0:
                for zombie_run in [r for r in self.runs if r.state == "frozen"]:
                    self._thaw(zombie_run, False, "final")
            if self._drain(run):
                return
            if self.stats.refused == refused:
                self.fail("drain", f"the final run {run.index} died: it cannot drain the log")
                return
            # Refused (its message names the fix): the operator applies it and runs again.
            final = replace(final, keep_checkpoint=False)
        self.fail(
            "drain", f"the final run was refused three times: {'; '.join(self.refusals[-3:])}"
        )

    def _drain(self, run: Run) -> bool:
        limit = sum(self.s.totals) + 3
        for _ in range(limit):
            if run.state != "live":
                return False
            if run.checkpoint.pending is None and self._plan(run, False) is None:
                return True
            self._step(run, _PLAIN_STEP, "final")
        self.fail("drain", f"the final run did not drain the log in {limit} batches")
        return True

    def _release(self) -> None:
        for run in self.runs:
            if run.zombie is not None:
                with contextlib.suppress(Exception):
                    run.zombie.thaw(kill=True)
                run.zombie = None
            if run.state != "dead":
                run.state = "dead"
                self.t.give_back(run.endpoint)

    # -- invariants ---------------------------------------------------------------------
    def _check_attempts(self, when: str) -> None:
        n = self.t.check_after_event(self.failed_attempts)
        if n:
            self.fail("2pc-visible", f"{when}: {n} rows of failed task attempts are visible")

    def _check(self) -> None:
        entries = self._resolve(self.t.ledger())
        rows = self.t.visible_rows()
        self._check_ledger(entries)
        self._check_epochs(entries)
        self._check_rows(entries, rows)
        if self.failed_attempts:
            self._check_attempts("at the end")

    def _resolve(self, entries: list[Entry]) -> list[Entry]:
        """Entries read back as text (SQL) get the ranges recorded with that exact text.

        Comparing the stored text with what the committer recorded is cheaper than
        parsing it, and checks the same thing; text nobody recorded is parsed.
        """
        if all(e.ranges is not None for e in entries):
            return entries
        recorded: dict[int, list[LedgerEntry]] = {}
        for _, r in self.stamps:
            recorded.setdefault(r.seq, []).append(r)
        out = []
        for e in entries:
            if e.ranges is None:
                text = e.ranges_json
                match = next(
                    (r.ranges for r in recorded.get(e.seq, ()) if r.ranges.to_json() == text), None
                )
                e = e._replace(ranges=match or BatchRanges.from_json(text or ""))
            out.append(e)
        return out

    def _check_ledger(self, entries: list[Entry]) -> None:
        """Invariant 2: the ledger is gap-free, monotonic and ends at the log's end."""
        seqs = [e.seq for e in entries]
        if seqs != list(range(len(entries))):
            self.fail("ledger", f"ledger seqs are {seqs}, not 0..{len(entries) - 1}")
        for problem in check_chain(e.ranges for e in entries):
            self.fail("ledger", problem)
        ends: dict[TopicPartition, int] = {}
        for e in entries:
            empty = True
            for r in e.ranges.ranges:
                ends[r.tp] = r.end
                empty = empty and r.start == r.end
            if empty and e.row_count == 0:
                self.fail("ledger", f"entry {e.seq} holds a no-data batch without rows")
        want = {(TOPIC, p): n for p, n in enumerate(self.s.totals)}
        if ends != want:
            self.fail("ledger", f"the ledger ends at {ends}, the log at {want}")
        owner = self.t.owner_epoch()
        if owner != self.acquired[-1][1]:
            self.fail("epoch", f"the owner row holds epoch {owner}, the last run took a newer one")

    def _check_epochs(self, entries: list[Entry]) -> None:
        """Invariant 4: every entry committed, once, while its epoch owned the pipeline."""
        stamped: dict[int, list[tuple[int, LedgerEntry]]] = {}
        for t, stamp in self.stamps:
            stamped.setdefault(stamp.seq, []).append((t, stamp))
        for e in entries:
            seen = [(t, s) for t, s in stamped.get(e.seq, ()) if s.ranges == e.ranges]
            if len(seen) != 1:
                self.fail(
                    "fenced-commit",
                    f"ledger entry {e.seq} [{e.ranges}] was committed by {len(seen)} observed "
                    "store transactions (expected 1)",
                )
                continue
            t, s = seen[0]
            if (s.epoch, s.row_count) != (e.epoch, e.row_count):
                self.fail(
                    "ledger",
                    f"ledger entry {e.seq} reads back as epoch {e.epoch}, {e.row_count} rows; "
                    f"it was recorded as epoch {s.epoch}, {s.row_count} rows",
                )
            owner = self.owner_at(t)
            if owner != e.epoch:
                self.fail(
                    "fenced-commit",
                    f"ledger entry {e.seq} [{e.ranges}] committed by epoch {e.epoch} at tick {t}, "
                    f"when epoch {owner} owned the pipeline",
                )

    def _check_rows(self, entries: list[Entry], rows: list[Row]) -> None:
        """Invariants 1, 3 and 5: each input row once, inside its ledger entry, same epoch.

        One pass over the ledger's offsets, looking each up among the visible rows; the
        details (which rows are lost, doubled, outside) are worked out only on a failure.
        """
        # Data rows by (partition, offset); timer rows by (checkpoint id, batch id).
        index = {((r[0], r[1]) if r[0] != TIMER_PARTITION else (r[2], r[1])): r for r in rows}
        values = self.values
        covered = 0
        bad: list[str] = []
        # Sinks whose tasks commit before the ledger entry (Kafka): a batch's rows may be
        # written by an older epoch whose run died, and its entry by the run that finished
        # it; never by a newer epoch than the entry's.
        same_epoch = not self.t.tasks_commit_early
        for e in entries:
            n = 0
            epoch = e.epoch
            if e.checkpoint_id is not None and e.spark_batch_id is not None:
                timer = index.get((e.checkpoint_id, e.spark_batch_id))
                if timer is not None and not e.ranges.count:
                    n += 1
                    if timer[3] != epoch and (same_epoch or timer[3] > epoch):
                        bad.append(
                            f"timer {timer[2]}#{timer[1]} by epoch {timer[3]} in entry "
                            f"{e.seq} of epoch {epoch}"
                        )
            for r in e.ranges.ranges:
                p = r.partition
                vp = values[p] if 0 <= p < len(values) else ()
                for o in range(r.start, r.end):
                    row = index.get((p, o))
                    if row is None:
                        continue
                    n += 1
                    if (
                        o >= len(vp)
                        or row[2] != vp[o]
                        or (row[3] != epoch and (same_epoch or row[3] > epoch))
                    ):
                        bad.append(
                            f"({p}, {o}) holds {row[2]!r} by epoch {row[3]} in entry "
                            f"{e.seq} of epoch {epoch}"
                        )
            covered += n
            if n != e.row_count:
                self.fail(
                    "row-count",
                    f"ledger entries whose row count differs from their visible rows: entry "
                    f"{e.seq} [{e.ranges}] counts {e.row_count}, {n} visible",
                )
        if bad:
            self.fail("epoch", f"{ROW_PROBLEMS['epoch']}: {'; '.join(bad[:5])}")
        total = sum(self.s.totals) + len(self.completed_nodata)
        if covered == len(rows) == len(index) and len(index) >= total and not self._missing(index):
            return
        self._row_details(entries, rows, index)

    def _missing(self, index: dict[tuple[Any, int], Row]) -> bool:
        for p, n in enumerate(self.s.totals):
            for o in range(n):
                if (p, o) not in index:
                    return True
        return any(key not in index for key in self.completed_nodata)

    def _row_details(
        self, entries: list[Entry], rows: list[Row], index: dict[tuple[Any, int], Row]
    ) -> None:
        """What exactly is lost, doubled or outside the ledger (only run on a failure)."""
        by_offset: set[tuple[int, int]] = set()
        by_timer: set[tuple[Any, int]] = set()
        for e in entries:
            if e.checkpoint_id is not None and e.spark_batch_id is not None and e.ranges.empty:
                by_timer.add((e.checkpoint_id, e.spark_batch_id))
            for r in e.ranges.ranges:
                by_offset.update((r.partition, o) for o in range(r.start, r.end))
        counts: Counter[tuple[Any, int]] = Counter()
        found: dict[str, list[str]] = {}
        for p, o, v, _epoch in rows:
            if p == TIMER_PARTITION:
                counts[(v, o)] += 1
                inside = (v, o) in by_timer
            else:
                counts[(p, o)] += 1
                inside = (p, o) in by_offset
            if not inside:
                what = f"timer {v}#{o}" if p == TIMER_PARTITION else f"({p}, {o})"
                found.setdefault("outside", []).append(what)
        for p, total in enumerate(self.s.totals):
            missing = [o for o in range(total) if (p, o) not in counts]
            if missing:
                found.setdefault("loss", []).append(f"partition {p} offsets {spans(missing)}")
        for key in sorted(self.completed_nodata):
            if key not in counts:
                found.setdefault("loss", []).append(
                    f"the timer row of completed no-data batch {key[0]}#{key[1]}"
                )
        for key, n in counts.items():
            if n > 1:
                found.setdefault("duplicate", []).append(f"{key} x{n}")
        for kind in ("loss", "duplicate", "outside"):
            items = found.get(kind)
            if items:
                more = f" (+{len(items) - 5} more)" if len(items) > 5 else ""
                self.fail(kind, f"{ROW_PROBLEMS[kind]}: {'; '.join(items[:5])}{more}")


ROW_PROBLEMS = {
    "loss": "input records not visible",
    "duplicate": "rows visible more than once",
    "outside": "visible rows outside every ledger range (or no-data batch without an entry)",
    "value": "rows with a value their record does not have",
    "epoch": "rows written by another epoch than their ledger entry's (rows and ledger row "
    "not committed together)",
    "row-count": "ledger entries whose row count differs from their visible rows",
}
