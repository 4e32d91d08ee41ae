"""Write benchmarks/results/mutation.json from finished mutmut runs (see `make mutation`).

Reads mutmut's per-file results (mutants/**/*.py.meta), and for every mutant no test
killed (survived, or no test reached it) its diff and a reason: the explanation in
tests/mutation-equivalent.json (mutant name -> why it is equivalent), or "unexplained".
Timeouts are listed apart: a mutant whose tests never finish (an endless loop) counts as
caught (as in Stryker's mutation score), but not as killed. The goal applies to the caught
share, score_with_timeouts = (killed + timeouts) / mutants; explained survivors count
against it like any other.

Run from the repository root, with the venv that holds mutmut:
    .venv/bin/python scripts/mutation-report.py [--out FILE] [--only GLOB...]
    .venv/bin/python scripts/mutation-report.py --merge GROUP.json... [--out FILE]
        [--recheck RECHECK.json...]
``--only`` reports the mutants of one group (``mutmut run GLOB``); ``--merge`` adds up the
reports of groups run apart (tests/mutation/test_mutation_score.py, one per group).
``--recheck`` takes reports of survivors run again since (``mutmut run NAME...`` and
``--only NAME...``, exact names): their statuses replace the merged reports' ones.
Exit code 1 when the caught share is below --goal (default 0.95), a mutant was not
checked, or a survivor is unexplained.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

EQUIVALENT = Path("tests/mutation-equivalent.json")
NOT_KILLED = ("survived", "no tests", "suspicious", "skipped", "segfault")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/mutation.json")
    parser.add_argument("--goal", type=float, default=0.95)
    parser.add_argument("--seconds", type=float, help="the run's wall time, for the report")
    parser.add_argument(
        "--only",
        action="append",
        metavar="GLOB",
        help="report only the mutants whose name matches (repeatable; `mutmut run GLOB`)",
    )
    parser.add_argument("--commit", help="the commit the run tested (default: git's HEAD)")
    parser.add_argument("--merge", nargs="+", metavar="REPORT", help="group reports to add up")
    parser.add_argument(
        "--recheck",
        nargs="+",
        metavar="REPORT",
        default=[],
        help="with --merge: reports of survivors run again by name; they replace their status",
    )
    args = parser.parse_args()
    if args.merge:
        report = merge(
            [json.loads(Path(p).read_text()) for p in args.merge],
            args.commit,
            [json.loads(Path(p).read_text()) for p in args.recheck],
        )
    else:
        built = from_mutants(args.only, args.seconds, args.commit)
        if built is None:
            print("error: no mutmut results in mutants/; run `mutmut run` first", file=sys.stderr)
            return 2
        report = built
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    for source, m in report["modules"].items():
        print(
            f"{source:<40} {m['killed']:>4}/{m['mutants']:<4} killed ({m['score']:.1%}), "
            f"{m['timeouts']} timeouts, {m['survived']} not killed"
        )
    total = report["mutants"]
    print(
        f"all: {report['killed']}/{total} killed ({report['score'] or 0:.1%}), "
        f"{report['timeouts']} timeouts (caught: {report['score_with_timeouts'] or 0:.1%}), "
        f"{len(report['survivors'])} survivors ({report['unexplained']} unexplained); wrote {out}"
    )
    if report["not_checked"]:
        print(f"warning: {report['not_checked']} mutants not checked (the run did not finish)")
    caught = report["score_with_timeouts"]
    if not total or report["not_checked"] or caught < args.goal or report["unexplained"]:
        return 1
    return 0


def from_mutants(
    only: list[str] | None, seconds: float | None, commit: str | None
) -> dict[str, Any] | None:
    """The report of the mutants in mutants/ (those matching ``only``), or None if none."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    metas = sorted(Path("mutants").glob("src/**/*.py.meta"))
    if not metas:
        return None
    reasons: dict[str, str] = json.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
    modules: dict[str, dict[str, Any]] = {}
    survivors: list[dict[str, str]] = []
    timeouts: list[str] = []
    unchecked_total = 0
    for meta in metas:
        source = str(meta.relative_to("mutants"))[: -len(".meta")]
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if only:
            codes = {n: c for n, c in codes.items() if any(fnmatch.fnmatch(n, g) for g in only)}
        if not codes:
            continue
        statuses = {name: status_by_exit_code[code] for name, code in sorted(codes.items())}
        unchecked = [n for n, s in statuses.items() if s == "not checked"]  # an unfinished run
        unchecked_total += len(unchecked)
        statuses = {n: s for n, s in statuses.items() if s != "not checked"}
        if not statuses:
            continue
        count = Counter(statuses.values())
        count["not checked"] = len(unchecked)
        modules[source] = _module(count)
        for name, status in statuses.items():
            if status == "timeout":
                timeouts.append(name)
            elif status in NOT_KILLED:
                survivors.append(
                    {
                        "mutant": name,
                        "module": source,
                        "status": status,
                        "reason": reasons.get(name, "unexplained"),
                        "diff": get_diff_for_mutant(name, path=source),
                    }
                )
    return _report(modules, survivors, timeouts, unchecked_total, seconds, commit, only)


def merge(
    reports: list[dict[str, Any]],
    commit: str | None,
    rechecks: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One report adding up ``reports`` (groups of disjoint mutants); each of ``rechecks``,
    in order, ran again by name mutants the reports (or an earlier recheck) list as
    survivors or timeouts, and its statuses replace theirs."""
    counts: dict[str, Counter[str]] = {}
    for r in reports:
        for source, m in r["modules"].items():
            counts.setdefault(source, Counter()).update(m["statuses"])
    for recheck in rechecks or []:  # in order: a recheck may run again a recheck's survivors
        again = set(recheck["mutants_selected"])
        if recheck["not_checked"] or recheck["mutants"] != len(again):
            raise SystemExit(
                f"error: a recheck must run each mutant it names: {recheck['mutants']} of "
                f"{len(again)} ran ({recheck['not_checked']} not checked)"
            )
        if any(ch in name for name in again for ch in "*?["):
            raise SystemExit("error: a recheck report must name its mutants (no globs)")
        earlier = {s["mutant"]: (s["module"], s["status"]) for r in reports for s in r["survivors"]}
        earlier.update(
            {t: (_module_of(t, reports), "timeout") for r in reports for t in r["timeout_mutants"]}
        )
        missing = sorted(again - set(earlier))
        if missing:
            raise SystemExit(
                "error: a recheck may only run again what the reports list as survivors or "
                f"timeouts (their other statuses are not kept by name): {', '.join(missing)}"
            )
        for name in again:
            source, status = earlier[name]
            counts[source][status] -= 1
        for source, m in recheck["modules"].items():
            counts.setdefault(source, Counter()).update(m["statuses"])
        reports = [
            {
                **r,
                "survivors": [s for s in r["survivors"] if s["mutant"] not in again],
                "timeout_mutants": [t for t in r["timeout_mutants"] if t not in again],
            }
            for r in reports
        ] + [recheck]
    modules = {source: _module(c) for source, c in sorted(counts.items())}
    # explanations added since a group ran apply to its survivors
    reasons: dict[str, str] = json.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
    survivors = [
        {**s, "reason": reasons.get(s["mutant"], s["reason"])}
        for r in reports
        for s in r["survivors"]
    ]
    timeouts = [t for r in reports for t in r["timeout_mutants"]]
    seconds = sum(r["run_seconds"] or 0 for r in reports)
    report = _report(
        modules,
        survivors,
        timeouts,
        sum(r["not_checked"] for r in reports),
        seconds,
        commit or reports[0]["commit"],
        [g for r in reports for g in r["mutants_selected"]],
    )
    report["groups"] = {
        " ".join(r["mutants_selected"]): {
            "mutants": r["mutants"],
            "killed": r["killed"],
            "run_seconds": r["run_seconds"],
            "commit": r["commit"],
            "generated": r["generated"],
        }
        for r in reports
    }
    return report


def _module_of(mutant: str, reports: list[dict[str, Any]]) -> str:
    """The source file of a mutant named in ``reports`` only as a timeout."""
    path = "src/" + mutant.split(".x")[0].replace(".", "/") + ".py"
    if not any(path in r["modules"] for r in reports):
        raise SystemExit(f"error: no module {path} in the reports for timeout {mutant}")
    return path


def _module(count: Counter[str]) -> dict[str, Any]:
    statuses = {s: n for s, n in count.items() if s != "not checked"}
    total = sum(statuses.values())
    killed = count["killed"]
    return {
        "mutants": total,
        "killed": killed,
        "timeouts": count["timeout"],
        "survived": sum(count[s] for s in NOT_KILLED),
        "score": round(killed / total, 4) if total else None,
        "statuses": dict(count),
    }


def _report(
    modules: dict[str, dict[str, Any]],
    survivors: list[dict[str, str]],
    timeouts: list[str],
    unchecked: int,
    seconds: float | None,
    commit: str | None,
    only: list[str] | None,
) -> dict[str, Any]:
    total = sum(m["mutants"] for m in modules.values())
    killed = sum(m["killed"] for m in modules.values())
    timed_out = sum(m["timeouts"] for m in modules.values())
    explained = [s for s in survivors if s["reason"] != "unexplained"]
    return {
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "tool": "mutmut 3 (make mutation)",
        "commit": commit or _head(),
        "mutants_selected": only or ["all"],
        "run_seconds": seconds,
        "mutants": total,
        "not_checked": unchecked,
        "killed": killed,
        "timeouts": timed_out,
        "score": round(killed / total, 4) if total else None,
        "score_with_timeouts": round((killed + timed_out) / total, 4) if total else None,
        # the share killed among the mutants not explained as equivalent or unreachable
        "score_without_explained": round(killed / (total - len(explained)), 4)
        if total > len(explained)
        else None,
        "explained": len(explained),
        "unexplained": len(survivors) - len(explained),
        "modules": modules,
        "survivors": survivors,
        "timeout_mutants": timeouts,
    }


def _head() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None  # not a git checkout (a copy made for the run)
    return out.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
