"""Stored schedules (``regressions/*.json``) replayed as regression tests.

Each file is a :class:`~sparkonce.verify.sim.Regression`: a schedule stored as data
(so it does not depend on ``generate(seed)`` never changing), the store it runs
against, and what it showed. Every one must pass against the correct committer (and
reach the stats it names); one stored for a planted bug (``tests/sim/planted.py``)
must still catch that bug: the bug's code runs and its invariant fails.

Add one with ``python -m sparkonce.verify.sim ... --save tests/sim/regressions`` (the
first failing schedule, shrunk), or ``python -m tests.sim.planted [POSTGRES_URL]`` for
the planted bugs.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from sparkonce.verify.sim import (
    Regression,
    Schedule,
    Target,
    TargetSpec,
    close_target,
    generate,
    run_schedule,
)
from sparkonce.verify.sim.regression import load_all
from tests.sim.planted import BUGS, NOT_CAUGHT, REGRESSIONS

STORED = load_all(REGRESSIONS)
_MARKS = {"postgres": pytest.mark.postgres, "kafka": pytest.mark.kafka}


def _params() -> list[object]:
    return [
        pytest.param(r, id=p.stem, marks=[_MARKS[r.store]] if r.store in _MARKS else [])
        for p, r in STORED
    ]


def _target(r: Regression, request: pytest.FixtureRequest) -> Target:
    ns = uuid.uuid4().hex[:6]
    if r.store == "postgres":
        url = str(request.getfixturevalue("pg_url"))
        return TargetSpec("postgres", url, sink=r.sink, namespace=ns).build()
    if r.store == "kafka":
        bootstrap = request.getfixturevalue("kafka_broker").bootstrap
        return TargetSpec("kafka", bootstrap, sink="kafka", namespace=ns).build()
    return TargetSpec(r.store, sink=r.sink, namespace=ns).build()  # type: ignore[arg-type]


@pytest.mark.parametrize("r", _params())
def test_stored_schedule(r: Regression, request: pytest.FixtureRequest) -> None:
    target = _target(r, request)
    try:
        failures, stats = run_schedule(r.schedule, target)
        assert not failures, "\n".join(map(str, failures))
        for name, least in r.reached:
            assert getattr(stats, name) >= least, (name, stats)
        if r.planted is not None:
            bug = BUGS[r.planted]()
            failures, _ = run_schedule(r.schedule, target, bug)
            kinds = {f.kind for f in failures}
            assert bug.ran > 0, f"{r.planted}'s own code never ran: {failures}"
            assert kinds & set(r.kinds) & bug.caught_as, f"{r.planted} not caught: {failures}"
    finally:
        close_target(target)


def test_stored_regressions_are_there() -> None:
    names = {r.name for _, r in STORED}
    assert {f"planted-{name}" for name in BUGS} <= names
    assert all(not set(r.kinds) & NOT_CAUGHT for _, r in STORED)


@pytest.mark.parametrize("seed", [0, 3, 606, 2124])
def test_a_schedule_round_trips_through_json(seed: int) -> None:
    schedule = generate(seed)
    assert Schedule.from_json(schedule.to_json()) == schedule


def test_a_stored_schedule_of_another_version_is_refused(tmp_path: Path) -> None:
    obj = generate(1).to_json()
    obj["schema"] = 99
    with pytest.raises(ValueError, match="schema version 99"):
        Schedule.from_json(obj)
    obj["schema"] = 1
    obj["events"] = [{"type": "explode"}]
    with pytest.raises(ValueError, match="unknown event type 'explode'"):
        Schedule.from_json(obj)
    r = Regression("x", generate(1), kinds=("duplicate",), planted="SkipsEpochCheck")
    assert Regression.load(r.save(tmp_path)) == r


def test_a_stored_regression_of_another_version_is_refused_with_both_versions_named(
    tmp_path: Path,
) -> None:
    obj = Regression("x", generate(1)).to_json()
    obj["schema"] = 7
    with pytest.raises(ValueError) as raised:
        Regression.from_json(obj)
    assert str(raised.value) == (
        "a stored regression has schema version 7; this sparkonce reads version 1"
    )
    obj["schema"], obj["schedule"]["schema"] = 1, None
    with pytest.raises(ValueError) as raised:
        Regression.from_json(obj)
    assert str(raised.value) == (
        "a stored schedule has schema version None; this sparkonce reads version 1. "
        "Store it again from its seed or events."
    )


def test_the_cli_stores_the_shrunk_failing_schedule(tmp_path: Path) -> None:
    from sparkonce.verify.sim import Campaign
    from sparkonce.verify.sim.cli import _shrink_and_print
    from tests.sim.planted import SkipsEpochCheck

    _shrink_and_print(Campaign(steps=SkipsEpochCheck()), generate(3), str(tmp_path))
    (path,) = tmp_path.glob("*.json")
    stored = Regression.load(path)
    assert path.name == "sqlite-sql-seed3.json" and "fenced-commit" in stored.kinds
    assert len(stored.schedule.events) < len(generate(3).events)
