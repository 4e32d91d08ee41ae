"""scripts/mutation-report.py --merge with --recheck: survivors run again by name replace
their earlier status in the merged report, and nothing else can be replaced. Pure (no
mutmut run): the reports are written here in the shape the script writes them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "mutation_report", REPO / "scripts/mutation-report.py"
)
assert _spec is not None and _spec.loader is not None
report_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report_script)

OFFSETS = "src/sparkonce/offsets.py"


def _group(statuses: dict[str, int], survivors: list[str], timeouts: list[str]) -> dict[str, Any]:
    modules = {OFFSETS: report_script._module(report_script.Counter(statuses))}
    return report_script._report(
        modules,
        [
            {"mutant": m, "module": OFFSETS, "status": "survived", "reason": "unexplained"}
            for m in survivors
        ],
        timeouts,
        0,
        10.0,
        "c0",
        ["sparkonce.offsets.*"],
    )


def _recheck(names: list[str], killed: int, survivors: list[str]) -> dict[str, Any]:
    statuses = {"killed": killed, "survived": len(survivors)}
    report = _group(statuses, survivors, [])
    return {**report, "mutants_selected": names, "commit": "c1"}


def test_rechecked_survivors_take_their_new_status() -> None:
    old = _group(
        {"killed": 7, "survived": 2, "timeout": 1},
        ["sparkonce.offsets.x_a__mutmut_1", "sparkonce.offsets.x_a__mutmut_2"],
        ["sparkonce.offsets.x_b__mutmut_3"],
    )
    again = _recheck(
        ["sparkonce.offsets.x_a__mutmut_1", "sparkonce.offsets.x_b__mutmut_3"],
        killed=1,
        survivors=["sparkonce.offsets.x_b__mutmut_3"],
    )
    merged = report_script.merge([old], None, [again])
    assert (merged["mutants"], merged["killed"], merged["timeouts"]) == (10, 8, 0)
    assert sorted(s["mutant"] for s in merged["survivors"]) == [
        "sparkonce.offsets.x_a__mutmut_2",
        "sparkonce.offsets.x_b__mutmut_3",
    ]
    assert merged["timeout_mutants"] == []
    assert merged["modules"][OFFSETS]["statuses"] == {"killed": 8, "survived": 2, "timeout": 0}


def test_a_later_recheck_may_run_again_an_earlier_rechecks_survivors() -> None:
    old = _group({"killed": 3, "survived": 1}, ["sparkonce.offsets.x_a__mutmut_1"], [])
    first = _recheck(["sparkonce.offsets.x_a__mutmut_1"], 0, ["sparkonce.offsets.x_a__mutmut_1"])
    second = _recheck(["sparkonce.offsets.x_a__mutmut_1"], 1, [])
    merged = report_script.merge([old], None, [first, second])
    assert (merged["mutants"], merged["killed"], merged["survivors"]) == (4, 4, [])


def test_a_recheck_may_replace_only_survivors_and_timeouts_named_one_by_one() -> None:
    old = _group({"killed": 3, "survived": 1}, ["sparkonce.offsets.x_a__mutmut_1"], [])
    with pytest.raises(SystemExit, match="only run again what the reports list as survivors"):
        report_script.merge([old], None, [_recheck(["sparkonce.offsets.x_a__mutmut_9"], 1, [])])
    unfinished = {**_recheck(["sparkonce.offsets.x_a__mutmut_1"], 0, []), "not_checked": 1}
    with pytest.raises(SystemExit, match="must run each mutant it names: 0 of 1 ran"):
        report_script.merge([old], None, [unfinished])
    with pytest.raises(SystemExit, match="must name its mutants"):
        report_script.merge([old], None, [_recheck(["sparkonce.offsets.*"], 1, [])])
