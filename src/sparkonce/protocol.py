"""The named crash points of the commit protocol, and the fault plan's environment variables.

The protocol itself (the owner epoch, the ledger, and the steps 0-5 every batch's commit
goes through) is written once, in ``docs/concepts/protocol.md``; the committer
(:mod:`sparkonce.commit.committer`) is its one implementation. Step numbers here are that
page's.

Crash points
------------
:class:`CrashPoint` names the moments the crash tests and ``sparkonce verify``
kill a driver at. They are named after the protocol's steps, and the committer marks
them with :meth:`sparkonce.faults.FaultPlan.crash_point`. The plan comes from
these environment variables, parsed once when ``sparkonce run`` starts and
handed to the run (see :mod:`sparkonce.faults`); with none set, nothing happens::

    SPARKONCE_CRASH_AT=after-ledger-commit        # first time the point is reached
    SPARKONCE_CRASH_AT=after-ledger-commit@3      # third time, in this process

The crash is a SIGKILL of this process's whole process group when the process
leads its group (the verifier starts drivers that way, so the JVM and Python
workers die with it, as on a machine failure), otherwise of this process alone.

``SPARKONCE_DROP_CONNECTION_AT`` (same form) makes a SQL sink lose its
database connection at that point, inside the open transaction, as a network
drop would: the sink must retry on a new connection and commit exactly once.

``SPARKONCE_FAIL_TASKS=read`` makes about half of the source's read tasks fail
halfway on their first attempt, so Spark retries them (run with a master that
allows task retries, such as ``local[2,4]``). ``write`` does the same to the
two-phase sink's pre-commit tasks, *after* their pre-commit is durable: the
failed attempt's rows exist, and only the retry's may become visible. The two
combine: ``SPARKONCE_FAIL_TASKS=read,write``. Spark's Python workers read this
variable themselves, once per worker process.

``SPARKONCE_PAUSE_TASKS=write`` makes each Kafka sink task stop itself (SIGSTOP) on its
first attempt once its records and its marker are sent, before it commits its Kafka
transaction: the transaction stays open, holding the ledger's last stable offset. Kill
the driver then, and the run dies with its tasks' transactions open, as a machine that
fails mid-batch leaves them (a test that a new run aborts them). Spark's Python workers
read it, as ``SPARKONCE_FAIL_TASKS``.

``SPARKONCE_PAUSE_AT`` takes the same ``NAME[@N]`` form but SIGSTOPs this
process instead: a driver that looks dead but is not. Sent SIGCONT later, it
carries on from that point: this is how the zombie tests make an old run
resume after a newer one has taken over.

``SPARKONCE_FAULT_EVENTS`` names a file that records each fault as it fires
(JSON lines; see :mod:`sparkonce.faults`).
"""

from __future__ import annotations

import os
import signal
from enum import StrEnum

from sparkonce.errors import ConfigError

CRASH_ENV = "SPARKONCE_CRASH_AT"
PAUSE_ENV = "SPARKONCE_PAUSE_AT"
DROP_CONNECTION_ENV = "SPARKONCE_DROP_CONNECTION_AT"
FAIL_TASKS_ENV = "SPARKONCE_FAIL_TASKS"
PAUSE_TASKS_ENV = "SPARKONCE_PAUSE_TASKS"


class CrashPoint(StrEnum):
    """Named crash points, in the order a batch reaches them."""

    BEFORE_COMMIT = "before-commit"
    """The batch's offsets are in Spark's checkpoint; the sink transaction has not begun.

    For the two-phase and Kafka sinks: before the batch's tasks pre-commit."""

    AFTER_ROWS = "after-rows"
    """Step 3 done: rows written inside the open transaction, no ledger row yet.

    For the two-phase sink: the tasks' pre-commits are durable and the driver's open
    transaction has flipped the successful attempts."""

    BEFORE_LEDGER_COMMIT = "before-ledger-commit"
    """Step 4 done: rows and ledger row written, transaction not yet committed."""

    AFTER_LEDGER_COMMIT = "after-ledger-commit"
    """Step 5 done: committed in the sink, Spark's commit log not yet written."""


def parse_crash_spec(spec: str, env: str = CRASH_ENV) -> tuple[CrashPoint, int]:
    """Parse ``NAME`` or ``NAME@N`` into a crash point and the hit number."""
    name, _, nth = spec.strip().partition("@")
    try:
        point = CrashPoint(name)
    except ValueError:
        names = ", ".join(p.value for p in CrashPoint)
        raise ConfigError(
            f"{env}={spec!r}: unknown crash point {name!r}; choose one of: {names}"
        ) from None
    try:
        hit = int(nth) if nth else 1
    except ValueError:
        raise ConfigError(f"{env}={spec!r}: the part after '@' must be an integer") from None
    if hit < 1:
        raise ConfigError(f"{env}={spec!r}: the hit number must be >= 1")
    return point, hit


# Not mutation tested: tests/unit/test_protocol.py checks kill_self in forked children, which
# it SIGKILLs, so mutmut never learns which test reaches it (it would report "no tests").
def kill_self() -> None:  # pragma: no mutate block
    """SIGKILL this process, and its group if it leads one (as a machine failure would)."""
    pid = os.getpid()
    if os.getpgid(0) == pid:
        os.killpg(pid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
