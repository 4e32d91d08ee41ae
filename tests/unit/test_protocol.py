"""Tests of sparkonce.protocol: crash specs (the crash points themselves: test_faults.py)."""

from __future__ import annotations

import pytest

from sparkonce.errors import ConfigError
from sparkonce.protocol import CRASH_ENV, CrashPoint, parse_crash_spec


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("after-rows", (CrashPoint.AFTER_ROWS, 1)),
        ("before-commit@1", (CrashPoint.BEFORE_COMMIT, 1)),
        ("after-ledger-commit@3", (CrashPoint.AFTER_LEDGER_COMMIT, 3)),
        ("  before-ledger-commit@12 ", (CrashPoint.BEFORE_LEDGER_COMMIT, 12)),
    ],
)
def test_parse_crash_spec_valid(spec: str, expected: tuple[CrashPoint, int]) -> None:
    point, nth = parse_crash_spec(spec)
    assert (point, nth) == expected
    assert point is expected[0]


def test_parse_crash_spec_unknown_name_lists_the_valid_names() -> None:
    with pytest.raises(ConfigError) as info:
        parse_crash_spec("after-everything@2")
    msg = str(info.value)
    assert "'after-everything'" in msg
    assert CRASH_ENV in msg
    for p in CrashPoint:
        assert p.value in msg
    assert "choose one of: " + ", ".join(p.value for p in CrashPoint) in msg


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("after-rows@x", "must be an integer"),
        ("after-rows@1.5", "must be an integer"),
        ("after-rows@0", ">= 1"),
        ("after-rows@-2", ">= 1"),
        ("@2", "unknown crash point"),
        ("AFTER-ROWS", "unknown crash point"),
    ],
)
def test_parse_crash_spec_invalid(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_crash_spec(spec)
