"""Mutation score of the protocol's modules, in the CI rotation (issue 39 item 2).

Each test runs mutmut (the ``[tool.mutmut]`` configuration of pyproject.toml: the fast
tests, 300 simulation schedules on SQLite) over one group of mutants, in a copy of the
source tree under ``tmp_path``, and fails below :data:`FLOOR` caught (killed, or a timeout:
an endless loop), counting explained survivors as not caught; the message lists the
survivors that ``tests/mutation-equivalent.json`` does not explain. The issue's goal is
:data:`GOAL` (the report states it); :data:`FLOOR` is a ratchet below the score measured
so far: all twenty groups, merged (benchmarks/results/mutation.json), catch 95.7% of the
1766 mutants, and the weakest group catches 90.1% (each group's share, rechecked survivors
included), so the floor is 90%. It is raised as survivors are killed, so that the rotation
fails when a change lets more mutants through rather than on the known gap. Groups
are sized to run within a shard's box (tests/shards.py) on the 2-core CI machine:
tests/shard-durations.json holds their times. ``make mutation`` runs all the mutants in
one mutmut run (benchmarks/results/mutation.json); ``mutation-report.py --merge`` adds up
group reports kept with ``SPARKONCE_MUTATION_REPORTS=DIR``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.services.postgres import ENV_URL as PG_URL_ENV
from tests.services.postgres import PostgresServer

pytestmark = pytest.mark.campaign_lane

REPO = Path(__file__).resolve().parents[2]
GOAL = 0.95  # issue 39's goal, reported in mutation.json
FLOOR = 0.90  # what a group must catch to pass; raise it towards GOAL as the score rises
# What mutmut needs of the tree: the sources it mutates, the tests it runs, its config,
# and the report script.
COPIED = ("src", "tests", "pyproject.toml", "scripts/mutation-report.py")
# Group -> mutmut name globs (`mutmut run GLOB...`). A run costs about 4 minutes before
# its first mutant (mutmut maps tests to functions, then runs them clean) and about 2 s a
# mutant: the mutants of every module are dealt into twenty groups by their number's last
# digit and the parity of the digit before it (numbers below 10 count as even), so each
# group fits in a shard's box, and a new mutant always lands in exactly one.
GROUPS: dict[str, tuple[str, ...]] = {
    **{
        f"mutants-{d}e": (f"sparkonce.*__mutmut_{d}", f"sparkonce.*__mutmut_*[02468]{d}")
        for d in "0123456789"
    },
    **{f"mutants-{d}o": (f"sparkonce.*__mutmut_*[13579]{d}",) for d in "0123456789"},
}
ENV = {
    "SPARKONCE_NO_CLASS_DATA": "1",
    "SPARKONCE_SIM_SCHEDULES": "300",
    "SPARKONCE_SIM_WORKERS": "1",
}


def _copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "mutants", ".pytest_cache")
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore, symlinks=True)
        else:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_mutation_score(group: str, tmp_path: Path, pg_server: PostgresServer) -> None:
    globs = GROUPS[group]
    work = tmp_path / "tree"
    commit = _head()  # the commit of the tree copied (uncommitted changes included)
    _copy_tree(work)
    bindir = Path(sys.executable).parent
    # The mutation_pg tests ([tool.mutmut]) use this session's server.
    env = {**os.environ, **ENV, PG_URL_ENV: pg_server.url}
    env.pop("PYTHONPATH", None)  # mutmut puts the mutated copy first on sys.path itself
    started = time.monotonic()
    run = subprocess.run(
        ["nice", "-n", "15", str(bindir / "mutmut"), "run", "--max-children", "1", *globs],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = round(time.monotonic() - started)
    assert run.returncode == 0, (
        f"mutmut run {' '.join(globs)} failed (exit {run.returncode}):\n"
        f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    )
    out = tmp_path / "mutation.json"
    only = [arg for g in globs for arg in ("--only", g)]
    report_args = ["--out", str(out), "--goal", str(GOAL), "--seconds", str(seconds)]
    report_run = subprocess.run(
        [sys.executable, "scripts/mutation-report.py", *report_args, "--commit", commit, *only],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.exists(), f"mutation-report.py wrote no report:\n{report_run.stderr}"
    report = json.loads(out.read_text())
    keep = os.environ.get("SPARKONCE_MUTATION_REPORTS")
    if keep:  # make mutation's per-group reports, and the durations measured here
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy2(out, Path(keep) / f"{group}.json")
    unexplained = [s for s in report["survivors"] if s["reason"] == "unexplained"]
    if unexplained:  # shown in the lane's output; the floor decides pass or fail
        print(f"group {group}: {len(unexplained)} unexplained survivors")
    listing = "\n".join(f"{s['mutant']} ({s['status']}):\n{s['diff']}" for s in unexplained)
    assert report["mutants"] > 0 and report["not_checked"] == 0, report_run.stdout
    caught = report["score_with_timeouts"]  # killed, or looping until the timeout
    assert caught >= FLOOR, (
        f"group {group}: {report['killed']}/{report['mutants']} mutants killed and "
        f"{report['timeouts']} timeouts ({caught:.1%} caught, floor {FLOOR:.0%}, goal "
        f"{GOAL:.0%}); "
        f"{len(report['survivors'])} survivors, "
        f"{len(unexplained)} unexplained (add a test that kills each, or explain why it is "
        f"equivalent in tests/mutation-equivalent.json):\n{listing}\n{report_run.stdout}"
    )


def _head() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
