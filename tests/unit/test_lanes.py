"""The three test lanes split the suite completely, and ``make test`` keeps its crash slice.

``make test`` runs ``pytest -m "not crash_lane and not campaign_lane"``, ``make test-crash``
``pytest -m crash_lane`` and ``make test-campaign`` ``pytest -m campaign_lane`` (Makefile),
so each test is in exactly one lane; CI runs the first two. Crash tests that
start real drivers live in tests/crash and tests/verify; the ones that stay in ``make
test`` are the representatives of the (sink family, fault kind) pairs of
``tests/conftest.py``'s ``FAULT_MATRIX``, marked ``covers(family, kind)``, plus the few
listed in :data:`ALSO_IN_MAKE_TEST` with the reason they stay.

The capability markers (``postgres``, ``kafka``, ``s3``, ``spark``) follow the fixtures a
test uses (tests/conftest.py's ``SERVICE_FIXTURES``), so ``-m "not kafka"`` leaves out every
test that starts the Kafka broker.

One ``pytest --collect-only -m "not kafka"`` of the whole suite in a subprocess (a few
seconds, no test runs) gives each test's lane, pairs, markers, fixtures and whether ``-m``
kept it, through the root conftest's ``--lanes-report``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TypedDict

import pytest

from tests.conftest import CAMPAIGN_MARK, FAULT_MATRIX, LANE_MARK, SERVICE_FIXTURES

REPO = Path(__file__).resolve().parents[2]


class Entry(TypedDict):
    """One test in the ``--lanes-report``."""

    lane: str
    covers: list[list[str]]  # [family, kind] pairs
    selected: bool  # kept by -m
    marks: list[str]
    fixtures: list[str]  # with the fixtures its fixtures use


Lanes = dict[str, Entry]

# Tests of tests/crash and tests/verify that run in `make test` without standing for a
# (family, kind) pair, and why.
ALSO_IN_MAKE_TEST = {
    "tests/crash/test_pause_point.py::test_pause_stops_the_calling_thread_at_once": (
        "starts no driver: a small child process, under a second"
    ),
    # A whole file: every test in it.
    "tests/verify/test_checks.py": "pure Python (verify's row checks), a few seconds in all",
    # The resend fault (issue 18) once; without dedupe and into Kafka: make test-crash.
    "tests/verify/test_resend.py::test_with_dedupe_every_resend_trial_matches_the_oracle": (
        "the one end-to-end `sparkonce verify` in make test: reference check, one trial of "
        "the resend fault kind (the embedded log with dedupe), report"
    ),
}
DRIVER_DIRS = ("tests/crash/", "tests/verify/")


def _recipe(target: str) -> str:
    """The recipe lines of ``target`` in the Makefile, joined."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"^{re.escape(target)}:", line))
    body = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        body.append(line.strip())
    return "\n".join(body)


def test_make_targets_select_complementary_lanes() -> None:
    makefile = (REPO / "Makefile").read_text()
    lane = re.search(r"^LANE := (\S+)$", makefile, re.M)
    assert lane is not None and lane.group(1) == LANE_MARK
    campaign = re.search(r"^CAMPAIGN := (\S+)$", makefile, re.M)
    assert campaign is not None and campaign.group(1) == CAMPAIGN_MARK
    test, crash, campaigns = _recipe("test"), _recipe("test-crash"), _recipe("test-campaign")
    assert '-m "not $(LANE) and not $(CAMPAIGN)"' in test, test
    assert '-m "$(LANE)"' in crash, crash
    assert '-m "$(CAMPAIGN)"' in campaigns, campaigns
    for recipe in (test, crash, campaigns):
        pytest_lines = [line for line in recipe.splitlines() if "-m pytest" in line]
        assert len(pytest_lines) == 1, recipe
        # Exit code 5 (no test selected) must fail the target: nothing may swallow it.
        assert not re.search(r"\|\||;|\btrue\b|-k\b|--deselect|--ignore", pytest_lines[0]), (
            pytest_lines[0]
        )
        assert not pytest_lines[0].startswith("-"), "make must not ignore the exit code"


def test_ci_runs_both_lanes() -> None:
    text = (REPO / ".ci" / "run").read_text()
    commands = [line.split()[:2] for line in text.splitlines() if line.startswith("make ")]
    assert commands == [["make", "test"], ["make", "test-crash"]], text


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory) -> Lanes:
    out = tmp_path_factory.mktemp("lanes") / "lanes.json"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--lanes-report={out}",
            "-m",
            "not kafka",
            "tests",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report: Lanes = json.loads(out.read_text())
    # The report is the collection pytest printed: the tests it selected, no more, no fewer,
    # and as many in all as it collected.
    printed = {line for line in done.stdout.splitlines() if "::" in line}
    assert printed == {nodeid for nodeid, info in report.items() if info["selected"]}
    collected = re.search(r"(\d+)/(\d+) tests collected", done.stdout)
    assert collected is not None, done.stdout[-1000:]
    assert int(collected.group(2)) == len(report) > int(collected.group(1)) == len(printed)
    return report


def test_every_test_is_in_exactly_one_lane(lanes: Lanes) -> None:
    by_lane: dict[str, list[str]] = {}
    for nodeid, info in lanes.items():
        by_lane.setdefault(str(info["lane"]), []).append(nodeid)
    assert set(by_lane) == {"test", "crash", "campaign"}, {k: len(v) for k, v in by_lane.items()}
    assert sum(len(v) for v in by_lane.values()) == len(lanes)


def test_each_fault_pair_has_one_representative_in_make_test(
    lanes: Lanes,
) -> None:
    found: dict[tuple[str, str], list[str]] = {}
    for nodeid, info in lanes.items():
        for family, kind in info["covers"]:
            assert info["lane"] == "test", f"{nodeid} covers ({family}, {kind}) from the crash lane"
            found.setdefault((family, kind), []).append(nodeid)
    wanted = {(family, kind) for kind, families in FAULT_MATRIX.items() for family in families}
    missing = sorted(wanted - set(found))
    assert not missing, f"(family, kind) pairs with no make-test crash test: {missing}"
    repeated = {pair: ids for pair, ids in found.items() if len(ids) > 1}
    assert not repeated, f"one representative per pair, not several: {repeated}"


def test_driver_tests_in_make_test_are_representatives(
    lanes: Lanes,
) -> None:
    """A new test in tests/crash or tests/verify must choose its lane explicitly."""
    stray = sorted(
        nodeid
        for nodeid, info in lanes.items()
        if nodeid.startswith(DRIVER_DIRS)
        and info["lane"] == "test"
        and not info["covers"]
        and nodeid not in ALSO_IN_MAKE_TEST
        and nodeid.split("::")[0] not in ALSO_IN_MAKE_TEST
    )
    assert not stray, (
        f"in make test, but neither covers(family, kind) nor in ALSO_IN_MAKE_TEST: {stray}; "
        f"mark them {LANE_MARK} or say why they stay"
    )
    gone = sorted(
        n
        for n in ALSO_IN_MAKE_TEST
        if not any(
            (i == n or i.startswith(n + "::")) and info.get("lane") == "test"
            for i, info in lanes.items()
        )
    )
    assert not gone, f"ALSO_IN_MAKE_TEST names tests that are not in make test: {gone}"


# -- capability markers ------------------------------------------------------------------------


def test_capability_markers_follow_the_fixtures_a_test_uses(lanes: Lanes) -> None:
    """Directly or through other fixtures (kafka_topic, pg_url, s3_bucket, the crash oracle)."""
    used = {fixture for info in lanes.values() for fixture in info["fixtures"]}
    assert not set(SERVICE_FIXTURES) - used, "SERVICE_FIXTURES names fixtures no test uses"
    unmarked = sorted(
        f"{nodeid}: {mark} (it uses {fixture})"
        for nodeid, info in lanes.items()
        for fixture, mark in SERVICE_FIXTURES.items()
        if fixture in info["fixtures"] and mark not in info["marks"]
    )
    assert not unmarked, (
        f"{len(unmarked)} tests lack the marker of a service they start: {unmarked[:20]}"
    )
    # A store chosen by a parameter and fetched with request.getfixturevalue.
    test = (
        "tests/commit/test_committer.py::"
        + "test_a_new_batch_commits_once_and_its_replay_stages_nothing"
    )
    marks = {
        store: set(lanes[f"{test}[{store}]"]["marks"]) for store in ("sqlite", "postgres", "kafka")
    }
    services = {"kafka", "postgres"}
    assert [services & marks[store] for store in ("sqlite", "postgres", "kafka")] == [
        set(),
        {"postgres"},
        {"kafka"},
    ]


def test_not_kafka_selects_no_test_that_starts_the_broker(lanes: Lanes) -> None:
    selected = {nodeid for nodeid, info in lanes.items() if info["selected"]}
    with_broker = {n for n, info in lanes.items() if "kafka_broker" in info["fixtures"]}
    assert with_broker and not selected & with_broker, sorted(selected & with_broker)[:20]
    kafka_params = {n for n in lanes if n.endswith("[kafka]") and n.startswith("tests/commit/")}
    assert kafka_params and not selected & kafka_params, sorted(selected & kafka_params)
    # ...and it leaves in every test without the marker.
    assert selected == {n for n, info in lanes.items() if "kafka" not in info["marks"]}
