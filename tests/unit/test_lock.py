"""The wheel declares ranges; the locks in requirements/ pin versions inside them.

requirements/lock.txt is what our own runs install (``make setup`` passes it to pip with
``-c``); requirements/oldest.txt and newest-py313.txt are the two ends that
tests/packaging/test_compat.py installs. ``make lock`` regenerates all three with uv. These
checks fail when pyproject.toml's ranges and the locks drift apart, so that neither our runs
nor the compatibility check test versions the wheel does not allow.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The extras the ends install: what a new user is told to install for a database and Kafka.
END_EXTRAS = ("postgres", "kafka")


def _requirements(*extras: str) -> list[Requirement]:
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in PROJECT["optional-dependencies"][extra]]
    return reqs


def _pins(name: str) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.\-\[\]]+)==(\S+)", line)
        if m:
            pins[canonicalize_name(m.group(1).split("[")[0])] = Version(m.group(2))
    return pins


def _outside(reqs: list[Requirement], pins: dict[str, Version]) -> list[str]:
    wrong = []
    for req in reqs:
        pin = pins.get(canonicalize_name(req.name))
        if pin is None or pin not in req.specifier:
            wrong.append(f"{req}: locked {pin}")
    return wrong


def test_the_lock_of_our_runs_pins_every_requirement_inside_its_range() -> None:
    reqs = _requirements(*PROJECT["optional-dependencies"])
    assert _outside(reqs, _pins("lock.txt")) == []


@pytest.mark.parametrize("lock", ["oldest.txt", "newest-py313.txt"])
def test_each_end_pins_the_ranges_of_what_a_user_installs(lock: str) -> None:
    assert _outside(_requirements(*END_EXTRAS), _pins(lock)) == []


def test_the_oldest_end_is_the_lower_bound_of_each_direct_requirement() -> None:
    pins = _pins("oldest.txt")
    not_lowest = []
    for req in _requirements(*END_EXTRAS):
        (lower,) = [Version(s.version) for s in req.specifier if s.operator == ">="]
        if pins[canonicalize_name(req.name)] != lower:
            not_lowest.append(f"{req}: oldest.txt has {pins[canonicalize_name(req.name)]}")
    assert not_lowest == []


def test_setup_installs_from_the_lock() -> None:
    makefile = (ROOT / "Makefile").read_text()
    rule = makefile[makefile.index("$(STAMP):") :].split("\n\n", 1)[0]
    assert "$(LOCK)" in rule.splitlines()[0], "the venv is not rebuilt when the lock changes"
    assert re.search(r"pip install .*-c \$\(LOCK\) -e", rule), rule
