"""A deterministic simulation of the commit protocol: seeded schedules against real stores.

FoundationDB and TigerBeetle check their protocols by running many seeded schedules
of faults and checking invariants after each one. This package does the same for
sparkonce's commit protocol (DESIGN.md section 6), without Spark: it drives the
**real** :class:`~sparkonce.commit.Committer` against the **real** ledger stores and
stagers (SQLite files, PostgreSQL databases, a Kafka broker), so what it checks is
the code that runs in production, not a model of it. Real SIGKILL trials
(``tests/crash``, ``sparkonce verify``) remain the ground truth; the simulation gives
the volume.

A **schedule** (:mod:`~sparkonce.verify.sim.schedule`) is generated from one integer
seed. It holds a synthetic log (2-3 partitions of 5-30 records; record ``(p, o)``'s row
is ``(p, o, "<seed>/<p>/<o>", <epoch of the run that wrote it>)``) and a list of events
over several runs of one pipeline:

* ``start``: a new run takes a new epoch (fencing every older run) and either keeps
  the pipeline's checkpoint (Spark's offset log and commit log, held in memory),
  starts with an empty one (planning from the ledger's end offsets, as the runner
  does), or restores one from an old backup (behind the ledger);
* ``step``: the newest run re-runs its pending batch (a replay) or plans its next one
  (each run has its own read limits, so batch boundaries differ between runs),
  commits it through the committer and marks it done in its checkpoint. A step may
  carry a fault: a crash at a :class:`~sparkonce.protocol.CrashPoint` (the run is then
  dead), a dropped store connection inside the commit or a lost acknowledgement of its
  COMMIT, a failed batch (or failed task attempts, retried), or a freeze after
  staging (a zombie, played by a thread blocked in the stage function); when no input
  is left a step may plan a no-data batch (the previous batch's end offsets) that
  emits one timer row, or none;
* ``thaw`` (a zombie resumes; if a newer run exists its commit must be fenced),
  ``repeat`` (the newest run commits its last done batch again: must be a skip),
  ``stale`` (an older run that does not know it was replaced commits: must not land),
  ``grow`` (more of the log becomes readable).

A final clean run then drains the log (zombies still frozen are thawed first; a run
refused with a ``LedgerError`` that names the operator's fix is followed by a run
with that fix applied), and the invariants are checked against the schedule's own
input, never against another sparkonce run:

1. every input record's row is visible exactly once (Kafka: to ``read_committed``
   readers), with its value, and nothing else (no loss, no duplicate, nothing outside
   the ledger's ranges);
2. the ledger is gap-free and monotonic (:func:`~sparkonce.offsets.check_chain`), its
   ``seq`` is 0, 1, 2..., and it ends at the log's end;
3. every visible row lies in the ledger entry that covers it, carries that entry's
   epoch, and every entry's row count matches its visible rows;
4. no commit lands from a fenced epoch: every store transaction that committed a
   ledger entry is stamped on a logical clock, on which the simulator also records
   each epoch acquisition; the entry's epoch must be the owner's at that tick, and
   the entry must read back as it was recorded;
5. each no-data batch's timer row appears once, with its ledger entry, and no-data
   batches that completed are all visible;
6. per event: the owner run's commit raises nothing but the injected fault, a
   repeated commit is a skip, a thawed zombie is fenced, a stale run never commits.
   With the two-phase sink, no row of a failed, aborted or zombie task attempt is
   ever visible (checked after every event).

Stores (:mod:`~sparkonce.verify.sim.sql`, :mod:`~sparkonce.verify.sim.kafka`): SQLite
and PostgreSQL with the SQL sink, PostgreSQL with the two-phase sink, and Kafka with
the Kafka sink. Sinks whose ``prepare`` starts Spark tasks run their own ``prepare``
and task functions on a stand-in DataFrame (:class:`~sparkonce.verify.sim.target.TaskFrame`).

Events run one at a time: after each one the simulator waits until every thread is
either finished or frozen, so a seed always replays the same interleaving. Many
schedules run in **lanes** (:mod:`~sparkonce.verify.sim.runner`): each lane has its
own namespace in the store (pipeline, table, topics), several lanes overlap a server
store's round trips, several processes use several cores. A failing schedule is
shrunk (greedy delta debugging over its events) and printed with the command that
replays it; ``--save DIR`` stores it as JSON (:mod:`~sparkonce.verify.sim.regression`),
which ``tests/sim`` replays as a regression test::

    python -m sparkonce.verify.sim --schedules 100000 --workers 2 --progress
    python -m sparkonce.verify.sim --replay 4242
    python -m sparkonce.verify.sim --store postgres --url postgresql://... --lanes 8
    python -m sparkonce.verify.sim --store kafka --bootstrap HOST:PORT --lanes 16

Fidelity notes. A crash raises :class:`SimCrash` (a ``BaseException``, so no
``except Exception`` cleanup runs, as with SIGKILL); the dying run's open transaction
is rolled back (the stores' ``except BaseException`` clauses do it: the same outcome
as a dead session) and its connection returned to a pool, which is what the store sees
when a process dies and a new one connects (``--fresh-connections`` opens a new
connection per run instead, slower). Spark's checkpoint is modelled, not run. A zombie
freezes only outside the store transaction: one frozen inside it would hold the
store's lock, and ordering its commit against a newer run's epoch would then depend
on thread timing. SQLite files are written with ``synchronous=OFF``.
"""

from sparkonce.verify.sim.core import TIMER_PARTITION, TOPIC, Simulation
from sparkonce.verify.sim.regression import Regression
from sparkonce.verify.sim.runner import (
    Campaign,
    Summary,
    TargetSpec,
    close_target,
    run_campaign,
    run_schedule,
    run_schedules,
    shrink,
)
from sparkonce.verify.sim.schedule import (
    Event,
    Grow,
    Repeat,
    Schedule,
    Stale,
    Start,
    Step,
    Thaw,
    generate,
)
from sparkonce.verify.sim.sql import COLUMNS, SqlTarget, remove_sqlite, sqlite_url
from sparkonce.verify.sim.target import Endpoint, Entry, Target, TaskFrame
from sparkonce.verify.sim.world import Failure, InjectedFailure, SimCrash, Stats

__all__ = [
    "COLUMNS",
    "TIMER_PARTITION",
    "TOPIC",
    "Campaign",
    "Endpoint",
    "Entry",
    "Event",
    "Failure",
    "Grow",
    "InjectedFailure",
    "Regression",
    "Repeat",
    "Schedule",
    "SimCrash",
    "Simulation",
    "SqlTarget",
    "Stale",
    "Start",
    "Stats",
    "Step",
    "Summary",
    "Target",
    "TargetSpec",
    "TaskFrame",
    "Thaw",
    "close_target",
    "generate",
    "remove_sqlite",
    "run_campaign",
    "run_schedule",
    "run_schedules",
    "shrink",
    "sqlite_url",
]
