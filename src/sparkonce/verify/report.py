"""The campaign's report: ``verify.json`` (written by :func:`write_json`, read back by
``--resume`` and ``--replay`` through :func:`load_report`, and by ``sparkonce ui``) and
the recovery chart. :class:`VerifyReport` is the report's one codec."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkonce.errors import ConfigError, RecordVersionError
from sparkonce.records import VERSION_KEY, record_version
from sparkonce.verify.model import Fault, TrialOutcome
from sparkonce.verify.summary import live_totals, recovery_goal, summarize

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.verify.campaign import Campaign
    from sparkonce.verify.reference import ReferenceCheck


REPORT_VERSION = 1
NEWER_REPORT = (
    "read it with the sparkonce that wrote it, or move it away (or give another --out) "
    "to start a new campaign"
)
# The report's keys this codec types; every other key is kept as written (``sections``).
_TYPED = ("pipeline_file", "pipeline", "sink", "stores", "seed", "faults", "oracle")


@dataclass
class VerifyReport:
    """``verify.json``: the campaign (pipeline, stores, seed and fault kinds), the oracle's
    numbers, the per-kind ``summary`` and every ``trial``; ``sections`` holds the rest as
    written (reference, this_run, trial_seconds, recovery_goal, live, and the sections
    about outputs: see :func:`write_json`).

    It carries :data:`REPORT_VERSION` under ``version``; a report without one (written
    before it) is version 1, and a newer one raises
    :class:`~sparkonce.errors.RecordVersionError`."""

    seed: int | None
    faults: list[str]
    trials: list[TrialOutcome] = field(default_factory=list)
    summary: list[dict[str, Any]] = field(default_factory=list)
    oracle: dict[str, Any] | None = None
    pipeline_file: str | None = None
    pipeline: str | None = None
    sink: str | None = None
    stores: list[str] | None = None
    sections: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> dict[str, Any]:
        doc: dict[str, Any] = {VERSION_KEY: REPORT_VERSION}
        doc.update({k: getattr(self, k) for k in _TYPED})
        doc.update(self.sections)
        doc["summary"] = self.summary
        doc["trials"] = [_trial_json(o) for o in self.trials]
        return doc

    @classmethod
    def decode(cls, doc: Any, where: str) -> VerifyReport:
        """The report in the decoded JSON ``doc`` read from ``where``. Raises
        :class:`RecordVersionError` for a newer report, and KeyError, TypeError or
        ValueError for one that is not a verify report."""
        if not isinstance(doc, dict):
            raise TypeError(f"a verify report is a JSON object, not {type(doc).__name__}")
        record_version(doc, REPORT_VERSION, f"verify report {where}", NEWER_REPORT)
        trials = []
        for t in doc.get("trials", []):
            t = dict(t)
            fault = Fault(**t.pop("fault"))
            trials.append(TrialOutcome(fault=fault, **t))
        skip = {VERSION_KEY, "summary", "trials", *_TYPED}
        return cls(
            seed=doc.get("seed"),
            faults=list(doc.get("faults", [])),
            trials=trials,
            summary=list(doc.get("summary", [])),
            oracle=doc.get("oracle"),
            pipeline_file=doc.get("pipeline_file"),
            pipeline=doc.get("pipeline"),
            sink=doc.get("sink"),
            stores=doc.get("stores"),
            sections={k: v for k, v in doc.items() if k not in skip},
        )


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
        report = VerifyReport.decode(json.loads(path.read_text()), str(path))
        if report.seed != seed or report.faults != list(kinds):
            raise ConfigError(
                f"{path} holds a campaign with seed {report.seed} and faults "
                f"{report.faults}; --resume and --replay need the same --seed and "
                "--faults (or another --out)"
            )
        oracle = report.oracle or {}
        seconds = oracle.get("seconds")

        def number(name: str) -> float | None:
            v = oracle.get(name)
            return float(v) if v is not None else None

        return Recorded(
            report.trials,
            float(seconds) if seconds is not None else None,
            (number("first_commit_s"), number("batch_interval_s")),
        )
    except RecordVersionError:
        raise
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
    report = VerifyReport(
        pipeline_file=str(campaign.pipeline_file),
        pipeline=campaign.pipeline.name,
        sink=campaign.pipeline.sink.describe(),
        stores=list(stores) or [campaign.pipeline.sink.describe()],
        seed=campaign.seed,
        faults=list(campaign.kinds),
        oracle=None
        if oracle is None
        else {
            "rows": len(oracle.rows),
            "batches": oracle.batches,
            "seconds": oracle.seconds,
            "first_commit_s": oracle.first_commit_s,
            "batch_interval_s": oracle.batch_interval_s,
            "phases": oracle.phases,
        },
        sections={
            "reference": None if reference is None else reference.to_json(),
            # How every trial driver reached Spark: a classic driver of this master, or a
            # Spark Connect client of a server it started (--remote).
            "spark_session": (
                {"mode": "connect", "remote": campaign.remote}
                if getattr(campaign, "remote", None)
                else {"mode": "classic", "master": getattr(campaign, "master", None) or "local[2]"}
            ),
            "this_run": {
                "trials": len(outcomes) if ran is None else ran,
                "elapsed_s": round(elapsed_s, 1),
            },
            "trial_seconds": round(sum(o.seconds for o in outcomes), 1),
            "recovery_goal": recovery_goal(outcomes, oracle, max(1, len(stores))),
            "live": {
                "interval_s": getattr(campaign, "live_interval_s", None),
                "stores": live_totals(outcomes),
            },
            **_outputs_section(campaign, outcomes),
            **_readers_section(outcomes),
        },
        summary=[asdict(s) for s in summarize(outcomes, campaign.kinds)],
        trials=sorted(outcomes, key=lambda o: o.trial),
    )
    doc = report.encode()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    tmp.replace(path)


def _trial_json(outcome: TrialOutcome) -> dict[str, Any]:
    """A trial as the report holds it: the fields of resend trials only appear in those."""
    doc = asdict(outcome)
    if outcome.resend is None:
        del doc["resend"]
    if not outcome.readers:  # only for stores read by a second reader (Iceberg)
        del doc["readers"]
    if outcome.leftovers is None:
        del doc["leftovers"]
    for name in ("kill_after", "progress_every", "after_entries", "node"):
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


def _readers_section(outcomes: Sequence[TrialOutcome]) -> dict[str, Any]:
    """Totals of the second readers' findings and of the leftovers over all trials (none
    when no trial has any, so other reports keep their shape)."""
    doc: dict[str, Any] = {}
    readers = sorted({r for o in outcomes for r in o.readers})
    if readers:
        doc["readers"] = {
            r: {
                "trials": sum(1 for o in outcomes if r in o.readers),
                **{
                    k: sum(o.readers.get(r, {}).get(k, 0) for o in outcomes)
                    for k in ("lost_rows", "duplicated_rows", "value_mismatches")
                },
            }
            for r in readers
        }
    counted = [o.leftovers for o in outcomes if o.leftovers is not None]
    if counted:
        kinds = sorted({k for c in counted for k in c})
        doc["leftovers"] = {
            "trials": len(counted),
            **{k: sum(c.get(k, 0) for c in counted) for k in kinds},
            "trials_with_any": sum(1 for c in counted if any(c.values())),
            "max_per_trial": {k: max(c.get(k, 0) for c in counted) for k in kinds},
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
