"""Write benchmarks/results/mutation.json from a finished `mutmut run` (see `make mutation`).

Reads mutmut's per-file results (mutants/**/*.py.meta), and for every mutant no test
killed (survived, or no test reached it) its diff and a reason: the explanation in
tests/mutation-equivalent.json (mutant name -> why it is equivalent), or "unexplained".
Timeouts are listed apart: a mutant whose tests never finish (an endless loop) counts as
caught, but not as killed.

Run from the repository root, with the venv that holds mutmut:
    .venv/bin/python scripts/mutation-report.py [--out benchmarks/results/mutation.json]
Exit code 1 when the killed share is below --goal (default 0.95) or a survivor is
unexplained.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code

EQUIVALENT = Path("tests/mutation-equivalent.json")
NOT_KILLED = ("survived", "no tests", "suspicious", "skipped", "segfault")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/mutation.json")
    parser.add_argument("--goal", type=float, default=0.95)
    parser.add_argument("--seconds", type=float, help="the run's wall time, for the report")
    args = parser.parse_args()

    metas = sorted(Path("mutants").glob("src/**/*.py.meta"))
    if not metas:
        print("error: no mutmut results in mutants/; run `mutmut run` first", file=sys.stderr)
        return 2
    reasons: dict[str, str] = json.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
    modules: dict[str, dict[str, object]] = {}
    survivors: list[dict[str, str]] = []
    timeouts: list[str] = []
    totals: Counter[str] = Counter()
    for meta in metas:
        source = str(meta.relative_to("mutants"))[: -len(".meta")]
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if not codes:
            continue
        statuses = {name: status_by_exit_code[code] for name, code in sorted(codes.items())}
        unchecked = [n for n, s in statuses.items() if s == "not checked"]  # an unfinished run
        totals["not checked"] += len(unchecked)
        statuses = {n: s for n, s in statuses.items() if s != "not checked"}
        if not statuses:
            continue
        count = Counter(statuses.values())
        totals.update(count)
        count["not checked"] = len(unchecked)
        killed = count["killed"]
        modules[source] = {
            "mutants": len(statuses),
            "killed": killed,
            "timeouts": count["timeout"],
            "survived": sum(count[s] for s in NOT_KILLED),
            "score": round(killed / len(statuses), 4),
            "statuses": dict(count),
        }
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
    unchecked_total = totals.pop("not checked", 0)
    total = sum(totals.values())
    unexplained = [s["mutant"] for s in survivors if s["reason"] == "unexplained"]
    report = {
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "tool": "mutmut 3 (make mutation)",
        "run_seconds": args.seconds,
        "mutants": total,
        "not_checked": unchecked_total,
        "killed": totals["killed"],
        "timeouts": totals["timeout"],
        "score": round(totals["killed"] / total, 4) if total else None,
        "score_with_timeouts": round((totals["killed"] + totals["timeout"]) / total, 4)
        if total
        else None,
        "unexplained": len(unexplained),
        "modules": modules,
        "survivors": survivors,
        "timeout_mutants": timeouts,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    for source, m in modules.items():
        print(
            f"{source:<40} {m['killed']:>4}/{m['mutants']:<4} killed ({m['score']:.1%}), "
            f"{m['timeouts']} timeouts, {m['survived']} not killed"
        )
    print(
        f"all: {totals['killed']}/{total} killed ({report['score']:.1%}), "
        f"{len(survivors)} survivors ({len(unexplained)} unexplained); wrote {out}"
    )
    if unchecked_total:
        print(f"warning: {unchecked_total} mutants not checked (the run did not finish)")
    if not total or unchecked_total or totals["killed"] / total < args.goal or unexplained:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
