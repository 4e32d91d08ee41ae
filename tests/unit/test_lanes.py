"""The three test lanes split the suite completely, and ``make test`` keeps its crash slice.

``make test`` runs ``pytest -m "not crash_lane and not campaign_lane"``, ``make test-crash``
``pytest -m crash_lane`` and ``make test-campaign`` ``pytest -m campaign_lane`` (Makefile),
so each test is in exactly one lane; CI runs the first and a shard. Crash tests that
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

The crash and campaign lanes are split into rotating shards (tests/shards.py, ``make
test-shard K=<k>``), one of which CI runs after ``make test``: every test of those lanes is
in exactly one shard, the map is the same for the same tests, and each shard's estimate is
within the box.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import TypedDict

import pytest

from tests import shards
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
    shard = _recipe("test-shard")
    assert '-m "not $(LANE) and not $(CAMPAIGN)"' in test, test
    assert '-m "$(LANE)"' in crash, crash
    assert '-m "$(CAMPAIGN)"' in campaigns, campaigns
    # A shard is chosen from the whole collection: no -m, no test paths.
    assert "--shard=$(K)" in shard and ' -m "' not in shard and "tests/" not in shard, shard
    for recipe in (test, crash, campaigns, shard):
        pytest_lines = [line for line in recipe.splitlines() if "-m pytest" in line]
        assert len(pytest_lines) == 1, recipe
        # Exit code 5 (no test selected) must fail the target: nothing may swallow it.
        assert not re.search(r"\|\||;|\btrue\b|-k\b|--deselect|--ignore", pytest_lines[0]), (
            pytest_lines[0]
        )
        assert not pytest_lines[0].startswith("-"), "make must not ignore the exit code"


def test_ci_runs_make_test_and_the_rotating_shard() -> None:
    text = (REPO / ".ci" / "run").read_text()
    commands = [line.strip() for line in text.splitlines() if line.strip().startswith("make ")]
    assert commands == ["make test || status=1", 'make test-shard K="$shard" || status=1'], text
    # The shard: the number of commits modulo the number of shards.
    assert "git rev-list --count HEAD" in text and "$((commits % shards))" in text, text
    assert "$(make -s test-shard-count" in text, text


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory) -> Lanes:
    out = tmp_path_factory.mktemp("lanes") / "lanes.json"
    done = shards.collect(f"--lanes-report={out}", "-m", "not kafka", "tests", timeout=300)
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


# -- rotating shards ---------------------------------------------------------------------------


def _sharded(lanes: Lanes) -> dict[str, str]:
    return {n: str(i["lane"]) for n, i in lanes.items() if i["lane"] in shards.SHARDED_LANES}


def test_every_crash_and_campaign_test_is_in_exactly_one_shard(
    lanes: Lanes,
) -> None:
    plan = shards.plan({n: str(i["lane"]) for n, i in lanes.items()})
    placed = [nodeid for shard in plan for nodeid in shard.tests]
    twice = sorted({n for n in placed if placed.count(n) > 1})
    assert not twice, f"in more than one shard: {twice}"
    wanted = set(_sharded(lanes))
    assert wanted, "no crash_lane or campaign_lane test collected"
    missing, extra = sorted(wanted - set(placed)), sorted(set(placed) - wanted)
    assert not missing, f"crash/campaign tests in no shard: {missing}"
    assert not extra, f"in a shard, but not crash_lane or campaign_lane: {extra}"
    assert [s.index for s in plan] == list(range(len(plan)))
    assert all(s.tests for s in plan), "an empty shard (make test-shard would exit 5)"


def test_the_shard_map_is_the_same_for_the_same_tests(
    lanes: Lanes,
) -> None:
    tests = list(_sharded(lanes).items())
    first = shards.plan(dict(tests))
    for seed in range(3):
        random.Random(seed).shuffle(tests)
        assert shards.plan(dict(tests)) == first


def test_each_shard_is_estimated_within_the_box(lanes: Lanes) -> None:
    plan = shards.plan(_sharded(lanes))
    box = shards.BOX_MINUTES * 60
    over = {s.index: s.seconds for s in plan if s.seconds > box and len(s.tests) > 1}
    assert not over, (
        f"shards of several tests estimated over the {shards.BOX_MINUTES:g} min box "
        f"(seconds): {over}; re-measured times outgrew a pinned shard: "
        "python -m tests.shards --rebalance packs them afresh"
    )
    # A test longer than the box alone gets a shard of its own; it may not run for long.
    alone = {s.tests[0]: s.seconds for s in plan if s.seconds > box}
    assert all(seconds <= 1.5 * box for seconds in alone.values()), (
        f"tests over one and a half boxes alone: split them ({alone})"
    )


def test_the_durations_file_names_live_tests_and_the_source_of_each_figure(
    lanes: Lanes,
) -> None:
    durations = shards.load_durations()
    stale = sorted(set(durations) - set(_sharded(lanes)))
    assert not stale, (
        f"{shards.DURATIONS_FILE.name} names tests that are no crash/campaign test (renamed or "
        f"gone: move or remove their entries): {stale}"
    )
    for nodeid, entry in durations.items():
        assert entry.seconds > 0 and entry.source.startswith(("measured", "estimate")), nodeid


def test_packing_keeps_files_whole_and_splits_only_a_file_longer_than_the_box() -> None:
    box = 600.0
    tests = {f"tests/a/test_small_{f}.py::t{i}": 50.0 for f in range(6) for i in range(3)}
    tests.update({f"tests/a/test_big.py::t{i}": 200.0 for i in range(4)})  # 800 s > box
    tests.update({f"tests/cluster/test_{f}.py::t": 100.0 for f in range(3)})  # a shared dir
    plan = shards.pack(tests, box, overhead=0.0)
    home = {n: s.index for s in plan for n in s.tests}
    for f in range(6):
        assert len({home[f"tests/a/test_small_{f}.py::t{i}"] for i in range(3)}) == 1
    assert len({home[f"tests/cluster/test_{f}.py::t"] for f in range(3)}) == 1
    assert len({home[f"tests/a/test_big.py::t{i}"] for i in range(4)}) > 1
    assert all(s.seconds <= box for s in plan)
    assert len(plan) == 4  # 2,000 s in all: the fewest boxes of 600 s that can hold it


def test_a_pinned_test_stays_in_its_shard_and_a_new_one_joins_its_file() -> None:
    box = 600.0
    pinned = [
        ["tests/a/test_x.py::t1", "tests/a/test_gone.py::t"],
        ["tests/a/test_y.py::t1", "tests/a/test_y.py::t2"],
        ["tests/a/test_gone.py::u"],
    ]
    tests = {"tests/a/test_x.py::t1": 500.0, "tests/a/test_y.py::t1": 100.0}
    tests["tests/a/test_y.py::t2"] = 100.0
    tests["tests/a/test_x.py::t2"] = 50.0  # new: its file's shard has room
    tests["tests/a/test_z.py::t"] = 300.0  # new: the emptiest shard with room
    tests["tests/a/test_w.py::t"] = 350.0  # new: no shard has room left
    plan = shards.place(pinned, tests, box, overhead=0.0)
    assert [s.tests for s in plan] == [
        ("tests/a/test_x.py::t1", "tests/a/test_x.py::t2"),
        ("tests/a/test_y.py::t1", "tests/a/test_y.py::t2", "tests/a/test_z.py::t"),
        ("tests/a/test_w.py::t",),  # the gone tests' shard was dropped; a new one at the end
    ]


def test_a_new_test_moves_no_other_test_to_another_shard(lanes: Lanes) -> None:
    """The rotation's record: a shard that passed keeps its tests when a test is added."""
    before = shards.plan(_sharded(lanes))
    home = {n: s.index for s in before for n in s.tests}
    grown = {**_sharded(lanes), "tests/crash/test_brand_new.py::test_it": "crash"}
    after = shards.plan(grown)
    moved = {
        n: (home[n], s.index) for s in after for n in s.tests if home.get(n, s.index) != s.index
    }
    assert not moved, f"tests moved between shards: {moved}"
    assert "tests/crash/test_brand_new.py::test_it" in {n for s in after for n in s.tests}


def test_the_map_file_names_live_tests(lanes: Lanes) -> None:
    named = {n for tests in shards.load_map() for n in tests}
    assert named, f"{shards.MAP_FILE.name} is missing or empty: python -m tests.shards --rebalance"
    stale = sorted(named - set(_sharded(lanes)))
    assert not stale, (
        f"{shards.MAP_FILE.name} names tests that are no crash/campaign test (renamed or "
        f"gone): python -m tests.shards --update drops them: {stale}"
    )


def test_the_shard_option_runs_the_planned_shard(lanes: Lanes) -> None:
    """``pytest --shard K`` (make test-shard) selects exactly shard K of the map."""
    plan = shards.plan(_sharded(lanes))
    shard = max(plan, key=lambda s: (len(s.tests), -s.index))
    done = shards.collect(f"--shard={shard.index}", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    selected = sorted(line for line in done.stdout.splitlines() if "::" in line)
    assert selected == list(shard.tests)


def test_a_reader_that_stops_early_ends_the_shard_command_without_a_traceback() -> None:
    """``python -m tests.shards --list | head``: the pipe closes while the map prints."""
    import subprocess
    import sys

    script = (
        "import sys, tests.shards as s\n"
        "def noisy(argv=None):\n"
        "    for i in range(200000):\n"
        "        print('shard line', i)\n"
        "    return 0\n"
        "s.main = noisy\n"
        "sys.exit(s.run())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"shard line 0")
    proc.stdout.close()  # as head does after its lines
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
