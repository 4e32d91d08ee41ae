"""Tests of sparkonce.protocol: crash specs (the crash points themselves: test_faults.py)."""

from __future__ import annotations

import os
import select
import signal
import time

import pytest

from sparkonce.errors import ConfigError
from sparkonce.protocol import CRASH_ENV, CrashPoint, kill_self, parse_crash_spec


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


def _run_kill_self(*, lead_group: bool) -> tuple[int, bool]:
    """Fork a child that starts a grandchild and calls kill_self(); the child leads its own
    process group when ``lead_group``. Returns the child's wait status and whether the
    grandchild died with it (the pipe only it still holds open reaches EOF); a grandchild
    still alive is then killed."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child never returns: it is SIGKILLed)
        try:
            os.close(read_end)
            if lead_group:
                os.setpgid(0, 0)
            ready_read, ready_write = os.pipe()
            if os.fork() == 0:  # the grandchild: says its pid, holds the pipe open, waits
                os.write(write_end, b"%d\n" % os.getpid())
                os.write(ready_write, b".")
                time.sleep(30)
                os._exit(0)
            os.close(write_end)
            os.read(ready_read, 1)  # the grandchild has said its pid
            kill_self()
        finally:
            os._exit(3)  # kill_self returned or raised: the test sees exit code 3
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        _, status = os.waitpid(child, 0)
        grandchild = int(pipe.readline())
        # a group kill has already happened when the child is dead: a short wait is enough
        ready, _, _ = select.select([pipe], [], [], 5 if lead_group else 0.5)
        grandchild_died = bool(ready) and pipe.read(1) == b""
    if not grandchild_died:
        os.kill(grandchild, signal.SIGKILL)
    return status, grandchild_died


def test_kill_self_kills_the_process_and_the_group_it_leads() -> None:
    status, grandchild_died = _run_kill_self(lead_group=True)
    assert os.WIFSIGNALED(status), f"kill_self did not kill the process (status {status})"
    assert os.WTERMSIG(status) == signal.SIGKILL
    assert grandchild_died, "the process group's other member outlived kill_self"


def test_kill_self_of_a_process_that_leads_no_group_kills_it_alone() -> None:
    status, grandchild_died = _run_kill_self(lead_group=False)
    assert os.WIFSIGNALED(status), f"kill_self did not kill the process (status {status})"
    assert os.WTERMSIG(status) == signal.SIGKILL
    # the grandchild is in the test's own process group, which must live on
    assert not grandchild_died
