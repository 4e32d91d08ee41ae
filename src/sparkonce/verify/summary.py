"""A campaign's numbers: per fault kind (:func:`summarize`), the live readers' totals, the
recovery times' split and the recovery goal, and the hint for failed resend trials."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkonce.verify.model import Oracle, TrialOutcome

RESEND_HINT = (
    "records the producer re-sent under the same record ids took effect again: remove them "
    'by record id with sparkonce.outputs.dedupe (docs/guides/dedupe.md: "Removing '
    'duplicates a producer re-sent")'
)


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
