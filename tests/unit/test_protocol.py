"""Tests of sparkonce.protocol: crash specs and crash points (real SIGKILLs in children)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sparkonce import protocol
from sparkonce.errors import ConfigError
from sparkonce.protocol import CRASH_ENV, CrashPoint, crash_point, parse_crash_spec


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


@pytest.fixture
def fake_kill(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace the SIGKILL with a recorder, and reset the per-process hit counters."""
    kills: list[str] = []
    monkeypatch.setattr(protocol, "_hits", {})
    monkeypatch.setattr(protocol, "kill_self", lambda: kills.append("killed"))
    return kills


def test_crash_point_does_nothing_without_the_env_var(
    monkeypatch: pytest.MonkeyPatch, fake_kill: list[str]
) -> None:
    monkeypatch.delenv(CRASH_ENV, raising=False)
    for p in CrashPoint:
        crash_point(p)
    monkeypatch.setenv(CRASH_ENV, "")
    crash_point(CrashPoint.AFTER_ROWS)
    assert fake_kill == []


def test_crash_point_ignores_other_points(
    monkeypatch: pytest.MonkeyPatch, fake_kill: list[str]
) -> None:
    monkeypatch.setenv(CRASH_ENV, "after-ledger-commit")
    for _ in range(3):
        crash_point(CrashPoint.AFTER_ROWS)
        crash_point(CrashPoint.BEFORE_COMMIT)
    assert fake_kill == []
    crash_point(CrashPoint.AFTER_LEDGER_COMMIT)
    assert fake_kill == ["killed"]


def test_crash_point_fires_on_the_nth_hit_only(
    monkeypatch: pytest.MonkeyPatch, fake_kill: list[str]
) -> None:
    monkeypatch.setenv(CRASH_ENV, "before-commit@3")
    fired_at = []
    for i in range(1, 6):
        crash_point(CrashPoint.BEFORE_COMMIT)
        if fake_kill and not fired_at:
            fired_at.append(i)
    assert fired_at == [3]
    assert fake_kill == ["killed"]


def test_crash_point_with_a_bad_spec_raises(
    monkeypatch: pytest.MonkeyPatch, fake_kill: list[str]
) -> None:
    monkeypatch.setenv(CRASH_ENV, "after-rowz")
    with pytest.raises(ConfigError, match="unknown crash point"):
        crash_point(CrashPoint.AFTER_ROWS)
    assert fake_kill == []


_CHILD = textwrap.dedent(
    """
    from sparkonce.protocol import CrashPoint, crash_point
    for i in range(3):
        crash_point(CrashPoint.AFTER_ROWS)
        print(f"survived {i + 1}", flush=True)
    """
)


def _env(spec: str) -> dict[str, str]:
    env = dict(os.environ)
    env[CRASH_ENV] = spec
    return env


def test_crash_point_really_sigkills_the_process() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=_env("after-rows@2"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.splitlines() == ["survived 1"]


def test_crash_point_other_point_lets_the_child_finish() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=_env("before-commit"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["survived 1", "survived 2", "survived 3"]


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_crash_point_kills_the_whole_group_of_a_group_leader() -> None:
    child = textwrap.dedent(
        """
        import subprocess, sys
        from sparkonce.protocol import CrashPoint, crash_point
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(helper.pid, flush=True)
        crash_point(CrashPoint.BEFORE_COMMIT)
        print("survived", flush=True)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", child],
        env=_env("before-commit"),
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,  # the child leads its own process group
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    helper = int(lines[0])
    deadline = time.monotonic() + 10
    while not _dead(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _dead(helper), "the group member outlived the crash"
