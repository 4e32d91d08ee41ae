"""Fault injection: the trial's driver processes (``sparkonce run`` and the resend
producer) and how each fault kind is injected into them (the kinds are described in
:mod:`sparkonce.verify.campaign`). :class:`Injection` is the part of
:class:`~sparkonce.verify.campaign.Campaign` that starts, stops, pauses and kills
processes; the campaign gives it the state named in its annotations."""

from __future__ import annotations

import re
import shlex
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sparkonce.config import mask_url
from sparkonce.errors import ConfigError, VerificationError
from sparkonce.protocol import (
    DROP_CONNECTION_ENV,
    FAIL_TASKS_ENV,
    PAUSE_ENV,
    CrashPoint,
)
from sparkonce.verify.driver import SIGKILL_EXIT, Driver
from sparkonce.verify.model import Fault, Oracle, TrialOutcome
from sparkonce.verify.summary import recovery_split

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.pipeline.pipeline import Pipeline
    from sparkonce.sources.base import Source

EXIT_FENCED = 3  # sparkonce.cli.EXIT_FENCED; the CLI is above this layer
RETRY_MASTER = "local[2,4]"  # local mode with up to 4 attempts per task
DRIVER_TIMEOUT_S = 600.0
MAX_RESTARTS = 4
# A kill planned after the driver had finished is planned again, on that run's own time, at
# most this many times in a trial.
KILL_RESCALES = 2


BROKER_COMMAND_TIMEOUT_S = 120.0
_NODE = re.compile(r"[A-Za-z0-9._:-]+")


@dataclass(frozen=True)
class BrokerKill:
    """How a ``broker-kill`` trial kills and starts one broker node of the user's cluster.

    ``kill`` and ``start`` are argument lists in which ``{node}`` stands for the node's
    name; they run without a shell (a node name cannot inject anything), each within
    :data:`BROKER_COMMAND_TIMEOUT_S`. ``down_s``: seconds between the two. The start
    command always runs after a kill command, whatever happens in between."""

    nodes: tuple[str, ...]
    kill: tuple[str, ...]
    start: tuple[str, ...]
    down_s: float = 5.0

    @classmethod
    def parse(
        cls, nodes: Sequence[str], kill: str | None, start: str | None, down_s: float = 5.0
    ) -> BrokerKill:
        """From the command line's text; a :class:`ConfigError` names what is missing."""
        names = tuple(n.strip() for n in nodes if n.strip())
        bad = [n for n in names if not _NODE.fullmatch(n)]
        if len(names) < 2 or bad:
            raise ConfigError(
                f"--broker-nodes {','.join(nodes)!r}: name at least two broker nodes (a "
                "broker-kill on a single broker stops the cluster), each of letters, digits "
                f"and . _ : -{f'; not {bad}' if bad else ''}"
            )
        argv: list[tuple[str, ...]] = []
        for option, text in (("--broker-kill-command", kill), ("--broker-start-command", start)):
            words = tuple(shlex.split(text or ""))
            if not any("{node}" in w for w in words):
                raise ConfigError(
                    f"{option} {text!r}: give the command with {{node}} where the node's name "
                    "goes, e.g. 'ssh {node} sudo systemctl kill -s KILL kafka'"
                )
            argv.append(words)
        if down_s < 0:
            raise ConfigError(f"--broker-down {down_s}: seconds, 0 or more")
        return cls(names, argv[0], argv[1], down_s)

    def run(self, which: str, node: str, log: Path) -> None:
        """Run the ``kill`` or ``start`` command for ``node``, its output appended to
        ``log``; a failure or a timeout raises :class:`VerificationError`."""
        cmd = [w.replace("{node}", node) for w in (self.kill if which == "kill" else self.start)]
        with open(log, "ab") as out:
            try:
                code = subprocess.run(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=BROKER_COMMAND_TIMEOUT_S,
                    check=False,
                ).returncode
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise VerificationError(
                    f"the broker {which} command {shlex.join(cmd)} failed: {exc}"
                ) from exc
        if code != 0:
            raise VerificationError(
                f"the broker {which} command {shlex.join(cmd)} exited with {code}; its "
                f"output is in {log}"
            )


class Injection(ABC):
    """Starting drivers and injecting a trial's fault (a mixin of
    :class:`~sparkonce.verify.campaign.Campaign`, which sets these attributes)."""

    pipeline_file: Path
    workdir: Path
    pipeline: Pipeline
    master: str | None
    remote: str | None
    sink_url: str | None
    quick_start: bool
    checkpoint: str | Path
    oracle: Oracle | None
    on_event: Callable[[str], None]
    _drivers: list[Driver]
    _trial_source: Source | None
    _aborted: threading.Event
    broker: BrokerKill | None

    @abstractmethod
    def _ledger_len(self) -> int:
        """The pipeline's ledger entries in the sink (the campaign's)."""

    @abstractmethod
    def clean(self, run: str = "run") -> None:
        """Remove a trial's checkpoint and reset its stores (the campaign's)."""

    def _driver_args(self, master: str | None = None) -> tuple[str, ...]:
        master = master or self.master
        args = ["--checkpoint", str(self.checkpoint)]
        if self.sink_url:
            args += ["--sink", self.sink_url]
        if self._trial_source is not None:
            args += ["--source", self._trial_source.uri()]
        if self.remote:
            # Each driver starts a Spark Connect server of its own and runs as its client.
            args += ["--remote", self.remote]
        elif master:
            args += ["--master", master]
        if self.quick_start:
            args.append("--quick-start")
        return tuple(args)

    def _driver(
        self,
        log: Path,
        *,
        crash: Fault | None = None,
        env: dict[str, str] | None = None,
        master: str | None = None,
    ) -> Driver:
        if self._aborted.is_set():
            raise VerificationError("the campaign was stopped")
        point = CrashPoint(crash.point) if crash and crash.point else None
        driver = Driver(
            self.pipeline_file,
            log,
            crash_at=point,
            crash_hit=crash.hit if crash else 1,
            env=env,
            extra_args=self._driver_args(master),
        )
        self._drivers.append(driver)
        return driver

    def abort(self) -> None:
        """Kill this campaign's running drivers and start no new ones (from any thread)."""
        self._aborted.set()
        for d in list(self._drivers):
            if d.proc is not None and d.proc.poll() is None:
                d.kill()

    def _retry_master(self) -> str:
        """The master of a run that must survive a failed task: ``local[2,4]`` (four attempts
        per task) for local runs, else the campaign's cluster, which retries tasks itself
        (``spark.task.maxFailures``, 4 by default)."""
        if self.master is None or self.master.startswith("local"):
            return RETRY_MASTER
        return self.master

    def _wait_first_commit(self, d: Driver, before: int) -> float | None:
        """Seconds from the restart until its first new ledger entry (or its exit)."""
        while d.poll() is None:
            if self._ledger_len() > before:
                return d.seconds
            if d.seconds > DRIVER_TIMEOUT_S:
                d.kill()
                break
            time.sleep(0.2)
        return d.seconds if d.proc is not None and d.proc.returncode == 0 else None

    def _inject(self, fault: Fault, out: TrialOutcome, logs: Path) -> bool:
        """Run the faulty part of a trial. Returns True if the input is fully consumed."""
        if fault.kind == "kill":
            return self._kill(fault, out, logs)
        if fault.kind == "crash-point":
            d = self._driver(logs / "fault.log", crash=fault).start()
            out.driver_runs += 1
            code = d.wait(DRIVER_TIMEOUT_S)
            crashed = bool(d.events("crash"))
            if self.remote:
                # The commit runs in the Connect server's Python worker, which the crash
                # SIGKILLs; the query fails with it, and the client exits with that failure.
                out.fault_fired = crashed and code != 0
            else:
                out.fault_fired = crashed and code == SIGKILL_EXIT
            if code != 0 and not out.fault_fired:
                raise VerificationError(f"faulty run exited with {code}: {d.log_tail(8)}")
            return code == 0
        if fault.kind in ("task-failure", "db-drop"):
            env = (
                {FAIL_TASKS_ENV: "read,write"}
                if fault.kind == "task-failure"
                else {DROP_CONNECTION_ENV: f"{fault.point}@{fault.hit}"}
            )
            d = self._driver(logs / "fault.log", env=env, master=self._retry_master()).start()
            out.driver_runs += 1
            code = d.wait(DRIVER_TIMEOUT_S)
            # Spark's Python workers record their task failures in the same events file.
            event = "task-failure" if fault.kind == "task-failure" else "drop-connection"
            out.fault_fired = bool(d.events(event))
            if code != 0:
                raise VerificationError(
                    f"{fault.kind}: the run should have recovered by itself but exited with "
                    f"{code}: {d.log_tail(8)}"
                )
            return True
        if fault.kind == "zombie":
            return self._zombie(fault, out, logs)
        if fault.kind == "resend":
            return self._resend(fault, out, logs)
        if fault.kind == "broker-kill":
            return self._broker_kill(fault, out, logs)
        raise ConfigError(f"unknown fault kind {fault.kind!r}")

    def _kill(self, fault: Fault, out: TrialOutcome, logs: Path) -> bool:
        """SIGKILL the driver at the planned moment: ``delay_s`` after its
        ``after_entries``-th new ledger entry (planned on progress), or ``delay_s`` after
        its start (older reports, planned on the oracle's wall-clock time).

        A driver that finishes first is run again from a clean slate, at most
        :data:`KILL_RESCALES` times, with the moment moved earlier: half the delay after
        the entry, or the same fraction of the run time just measured as of the oracle's
        (trials often run faster than the oracle, whose JVM and caches started cold)."""
        assert fault.delay_s is not None
        on_progress = bool(fault.after_entries)
        fraction = 0.0
        if not on_progress:
            assert self.oracle is not None
            fraction = fault.delay_s / max(self.oracle.seconds, 0.01)
        for attempt in range(KILL_RESCALES + 1):
            base = self._ledger_len()
            d = self._driver(logs / f"fault{attempt or ''}.log").start()
            out.driver_runs += 1
            if on_progress:
                while d.poll() is None and self._ledger_len() - base < (fault.after_entries or 0):
                    if d.seconds > DRIVER_TIMEOUT_S:
                        break
                    time.sleep(0.1)
                kill_at = d.seconds + fault.delay_s
            else:
                kill_at = fault.delay_s
            while d.poll() is None and d.seconds < kill_at:
                time.sleep(0.05)
            if d.poll() is None:
                d.kill()
                out.fault_fired = True
            code = d.wait(60)
            if out.fault_fired or code != 0 or attempt == KILL_RESCALES:
                return code == 0 and not out.fault_fired
            delay = fault.delay_s / 2 if on_progress else fraction * d.seconds
            fault = replace(fault, delay_s=round(delay, 2))
            out.fault = fault
            self.clean(f"trial-{out.trial:05d}")
        return False  # not reached

    def _broker_kill(self, fault: Fault, out: TrialOutcome, logs: Path) -> bool:
        """Kill one broker node at the planned moment (as ``kill`` plans the driver's) and
        start it again ``down_s`` later; the run must finish by itself, with no exit."""
        assert self.broker is not None and fault.node is not None and fault.delay_s is not None
        base = self._ledger_len()
        d = self._driver(logs / "fault.log").start()
        out.driver_runs += 1
        while d.poll() is None and self._ledger_len() - base < (fault.after_entries or 0):
            if d.seconds > DRIVER_TIMEOUT_S:
                break
            time.sleep(0.1)
        kill_at = d.seconds + fault.delay_s if fault.after_entries else fault.delay_s
        while d.poll() is None and d.seconds < kill_at:
            time.sleep(0.05)
        if d.poll() is None:
            broker_log = logs / "broker.log"
            self.broker.run("kill", fault.node, broker_log)
            out.fault_fired = True
            try:
                time.sleep(self.broker.down_s)
            finally:
                self.broker.run("start", fault.node, broker_log)
        code = d.wait(DRIVER_TIMEOUT_S)
        if code != 0:
            raise VerificationError(
                f"broker-kill: the run should have ridden out the death of broker "
                f"{fault.node} but exited with {code}: {d.log_tail(8)}"
            )
        return True

    def _resend(self, fault: Fault, out: TrialOutcome, logs: Path) -> bool:
        """A producer crash and re-send into a fresh trial source, then the pipeline on it
        (see the module docstring and :mod:`.resend`)."""
        from sparkonce.verify import resend

        assert fault.kill_after is not None and fault.progress_every is not None
        source = resend.trial_source(
            self.pipeline.source, log_dir=logs / "source", workdir=self.workdir, trial=out.trial
        )
        self._trial_source = source
        out.resend = {"source": mask_url(source.uri())}
        every = str(fault.progress_every)
        progress = str(logs / "producer.progress")
        common = ("--to", source.uri(), "--progress", progress, "--every", every)
        first = self._producer(
            logs / "producer1.log",
            (*common, "--producer-id", f"resend-{out.trial}-1"),
            ("--pause-after", str(fault.kill_after)),
        )
        if not _wait_stopped(first, DRIVER_TIMEOUT_S):
            code = first.wait(60)  # the copy ended before the k-th record: nothing to re-send
            if code != 0:
                raise VerificationError(
                    f"the resend producer exited with {code}: {first.log_tail(8)}"
                )
            out.resend.update(resend.window([], first.events(resend.DONE_EVENT)))
        else:
            first.kill()
            killed = first.wait(60) == SIGKILL_EXIT
            second = self._producer(
                logs / "producer2.log", (*common, "--producer-id", f"resend-{out.trial}-2")
            )
            code = second.wait(DRIVER_TIMEOUT_S)
            if code != 0:
                raise VerificationError(
                    f"the restarted resend producer exited with {code}: {second.log_tail(8)}"
                )
            found = resend.window(
                first.events(resend.PAUSE_EVENT), second.events(resend.DONE_EVENT)
            )
            out.resend.update(found)
            out.fault_fired = (
                killed and (found["killed_after"] or 0) >= 1 and (found["resent"] or 0) >= 1
            )
        d = self._driver(logs / "pipeline.log").start()
        out.driver_runs += 1
        return d.wait(DRIVER_TIMEOUT_S) == 0

    def _producer(self, log: Path, args: tuple[str, ...], more: tuple[str, ...] = ()) -> Driver:
        """Start a resend producer process (see :mod:`.resend`) in its own process group."""
        from sparkonce.verify.resend import ENTRY

        if self._aborted.is_set():
            raise VerificationError("the campaign was stopped")
        producer = Driver(self.pipeline_file, log, entry=ENTRY, extra_args=(*args, *more))
        self._drivers.append(producer)
        return producer.start()

    def _end_trial_source(self, out: TrialOutcome) -> None:
        """After a resend trial: drivers read the file's source again, and a Kafka trial
        topic is deleted (a failure to delete is reported, not a failed trial)."""
        source, self._trial_source = self._trial_source, None
        if source is None:
            return
        from sparkonce.errors import SparkOnceError
        from sparkonce.verify.resend import drop_trial_source

        try:
            drop_trial_source(source)
        except SparkOnceError as exc:
            self.on_event(
                f"trial {out.trial}: could not delete its source {mask_url(source.uri())}: {exc}"
            )

    def _zombie(self, fault: Fault, out: TrialOutcome, logs: Path) -> bool:
        old = self._driver(logs / "zombie.log", env={PAUSE_ENV: f"{fault.point}@{fault.hit}"})
        old.start()
        out.driver_runs += 1
        # On Spark Connect the commit, and so the pause, is in the server's Python worker: a
        # process of the driver's group (its server runs in it), found by the pause event.
        if not _wait_stopped(old, DRIVER_TIMEOUT_S, by_event="pause" if self.remote else None):
            code = old.wait(60)
            if code == 0:
                out.zombie_fenced = None  # finished before the pause point: no zombie
                return True
            raise VerificationError(f"zombie-to-be exited with {code}: {old.log_tail(8)}")
        out.fault_fired = bool(old.events("pause"))
        try:
            before = self._ledger_len()
            new = self._driver(logs / "newer.log").start()
            out.driver_runs += 1
            first = self._wait_first_commit(new, before)
            code = new.wait(DRIVER_TIMEOUT_S)
            out.recovery_s = first
            out.recovery_phases = None if first is None else recovery_split(new.phases(), first)
            if code != 0:
                raise VerificationError(f"the newer run exited with {code}: {new.log_tail(8)}")
        finally:
            old.resume()
        code = old.wait(DRIVER_TIMEOUT_S)
        out.zombie_fenced = code == EXIT_FENCED and bool(old.events("fenced"))
        if not out.zombie_fenced:
            raise VerificationError(
                f"the zombie run was not fenced: it exited with {code}: {old.log_tail(8)}"
            )
        return True


def _wait_stopped(d: Driver, timeout: float, *, by_event: str | None = None) -> bool:
    """Wait until the driver SIGSTOPped itself (state 'T'); False if it exited first.
    ``by_event``: the process that stops is the one that recorded that event (a Python
    worker of the driver's group), not the driver's own."""
    deadline = time.monotonic() + timeout
    stat = Path(f"/proc/{d.pid}/stat")
    while time.monotonic() < deadline:
        if d.poll() is not None:
            return False
        if by_event is not None:
            found = [e["pid"] for e in d.events(by_event) if isinstance(e.get("pid"), int)]
            if not found:
                time.sleep(0.1)
                continue
            stat = Path(f"/proc/{found[0]}/stat")
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            state = ""
        if state in ("T", "t"):
            return True
        time.sleep(0.1)
    d.kill()
    raise VerificationError(f"the driver did not reach its pause point in {timeout:.0f} s")
