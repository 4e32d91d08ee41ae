"""What one ``sparkonce verify`` invocation runs, before it runs anything.

A campaign may run in segments: ``--resume`` keeps the trials an earlier segment
recorded in ``verify.json`` and runs the rest, and ``--replay N`` runs one trial again
with the fault recorded for it. This module decides, from the request and that report:

* which requests are refused outright (:func:`check_request`);
* which trials run now, which recorded outcomes are kept, and which recorded trials run
  again because their fault did not fire (:class:`TrialPlan`, :func:`plan_trials`);
* which fault a replay takes (the recorded one, else the one planned from the seed);
* which oracle run time kills are planned on (the recorded one, unless
  ``--retime-oracle``), so that a busy machine's slower oracle does not move them;
* where the report and chart of this invocation go (a replay never overwrites
  ``verify.json``);
* the work directory of each test store when trials run in parallel
  (:func:`store_workdirs`).

The report must come from a campaign with the same seed and fault kinds
(:func:`check_same_campaign`). Nothing here starts a driver or touches a sink.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sparkonce.errors import ConfigError
from sparkonce.verify.model import Fault, TrialOutcome
from sparkonce.verify.report import Recorded, load_report

REPORT_NAME = "verify.json"
CHART_NAME = "recovery.png"


@dataclass(frozen=True)
class VerifyRequest:
    """The options of ``sparkonce verify`` that decide its plan."""

    trials: int = 20  # trials 0..trials-1 make up the campaign
    seed: int = 0
    replay: int | None = None  # run only this trial again
    resume: bool = False  # keep the trials recorded in the report
    retime_oracle: bool = False  # plan kills on this invocation's oracle time

    @property
    def reads_report(self) -> bool:
        """Whether this invocation goes on from, or repeats a trial of, a recorded campaign."""
        return self.resume or self.replay is not None


def check_request(request: VerifyRequest) -> None:
    """Refuse a request that cannot do what it says (:class:`ConfigError`), before any
    directory is made or pipeline loaded."""
    if request.trials < 1 and request.replay is None:
        raise ConfigError(f"--trials must be >= 1, got {request.trials}")
    if request.replay is not None and request.replay < 0:
        raise ConfigError(
            f"--replay takes a trial number from verify.json (0 or more), got {request.replay}"
        )
    if request.retime_oracle and not request.reads_report:
        raise ConfigError(
            "--retime-oracle only changes a campaign that goes on (--resume) or repeats a "
            "trial (--replay N); a new campaign always times its oracle"
        )


def store_workdirs(out_dir: Path, sink_urls: Sequence[str | None]) -> list[Path]:
    """The work directory of each test store, in order (each trial's checkpoint lives in
    its store's). One store works in ``OUT/work``; several in ``OUT/work/w0``, ``w1``...

    Two trials on one store would wipe each other's output, so a store named twice is
    refused. ``None`` stands for the pipeline file's own sink.
    """
    if len(set(sink_urls)) != len(sink_urls):
        raise ConfigError(
            f"--sink names the same store twice ({list(sink_urls)}); parallel trials each "
            "need their own store"
        )
    if len(sink_urls) == 1:
        return [out_dir / "work"]
    return [out_dir / f"work/w{i}" for i in range(len(sink_urls))]


@dataclass(frozen=True)
class TrialPlan:
    """What one invocation runs and keeps; see :func:`plan_trials`."""

    trials: list[int]  # the trials to run now, in this order
    report: Path  # where this invocation writes its report
    chart: Path  # and its recovery-time chart
    kept: list[TrialOutcome] = field(default_factory=list)  # recorded, not run again
    rerun: list[int] = field(default_factory=list)  # recorded, fault not fired: run again
    replay: int | None = None
    replay_fault: Fault | None = None  # recorded for the replayed trial; None: from the seed
    oracle_seconds: float | None = None  # plan kills on this time; None: the oracle's own
    # and on these (time to the first ledger entry, between entries), recorded with it
    oracle_timing: tuple[float | None, float | None] = (None, None)
    notes: list[str] = field(default_factory=list)  # what the plan took from the report

    @property
    def recorded_faults(self) -> dict[int, Fault]:
        """Trials whose fault is taken as recorded instead of planned from the seed
        (:attr:`Campaign.recorded_faults <sparkonce.verify.campaign.Campaign>`)."""
        if self.replay is None or self.replay_fault is None:
            return {}
        return {self.replay: self.replay_fault}


def plan_trials(request: VerifyRequest, recorded: Recorded | None, out_dir: Path) -> TrialPlan:
    """The plan for ``request``, given what an earlier segment ``recorded`` (None: no
    report was read, as for a new campaign).

    * ``--replay N``: trial N alone, with the fault recorded for it if the report holds it
      (else the fault planned from the seed); nothing is kept, and the report and chart
      go to ``replay-N.json`` and ``replay-N.png`` beside ``verify.json``.
    * Otherwise, trials ``0..trials-1`` minus those kept: every recorded trial whose fault
      fired, and every failed one, is kept (even beyond ``trials``). A passed trial whose
      fault did not fire tested nothing, so it runs again.
    * Kills are planned on the oracle time recorded in the report, unless
      ``retime_oracle`` (or nothing was recorded).
    """
    report = out_dir / REPORT_NAME
    oracle_seconds = None
    timing: tuple[float | None, float | None] = (None, None)
    if recorded is not None and not request.retime_oracle:
        oracle_seconds = recorded.oracle_seconds
        timing = recorded.oracle_timing
    if request.replay is not None:
        n = request.replay
        fault = recorded.fault_of(n) if recorded is not None else None
        note = f"replaying trial {n} with " + (
            f"its recorded fault: {fault.describe()}"
            if fault is not None
            else f"the fault planned from seed {request.seed} (not in {report})"
        )
        return TrialPlan(
            trials=[n],
            report=out_dir / f"replay-{n}.json",
            chart=out_dir / f"replay-{n}.png",
            replay=n,
            replay_fault=fault,
            oracle_seconds=oracle_seconds,
            oracle_timing=timing,
            notes=[note],
        )
    kept: list[TrialOutcome] = []
    again: list[int] = []
    if recorded is not None:
        kept, again = recorded.split()
    done = {o.trial for o in kept}
    notes = []
    if done or again:
        notes.append(f"resuming: {len(done)} trials kept from {report}")
    rerun = [n for n in again if n < request.trials]
    if rerun:
        notes.append(f"running again {len(rerun)} trials whose fault did not fire: {rerun[:20]}")
    return TrialPlan(
        trials=[n for n in range(request.trials) if n not in done],
        report=report,
        chart=out_dir / CHART_NAME,
        kept=kept,
        rerun=rerun,
        oracle_seconds=oracle_seconds,
        oracle_timing=timing,
        notes=notes,
    )


def check_same_campaign(path: Path, seed: int, kinds: Sequence[str]) -> None:
    """Refuse the report at ``path`` if another campaign wrote it: one with another seed
    or other fault kinds plans other faults for the same trial numbers, so its trials can
    neither be kept nor replayed. A missing report passes; so does one that is not
    readable JSON, which :func:`~sparkonce.verify.campaign.load_report` then refuses as
    a report this version cannot read.
    """
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):  # no report, or not JSON
        return
    if not isinstance(doc, dict):
        return
    if doc.get("seed") != seed or doc.get("faults", []) != list(kinds):
        raise ConfigError(
            f"{path} holds a campaign with seed {doc.get('seed')} and faults "
            f"{doc.get('faults')}; --resume and --replay need the same --seed and "
            "--faults (or another --out)"
        )


def load_plan(request: VerifyRequest, out_dir: Path, kinds: Sequence[str]) -> TrialPlan:
    """Read ``OUT/verify.json`` if the request goes on from it, and plan.

    The report must hold a campaign with ``request.seed`` and these fault ``kinds`` (the
    campaign's own, after kinds its sink cannot take were left out): another campaign's
    report (:func:`check_same_campaign`), or one this version cannot read, is refused
    with a :class:`ConfigError`. A missing report counts as an empty one.
    """
    recorded = None
    if request.reads_report:
        path = out_dir / REPORT_NAME
        check_same_campaign(path, request.seed, kinds)
        recorded = load_report(path, request.seed, kinds)
    return plan_trials(request, recorded, out_dir)
