"""Driver processes the crash harness can kill: ``sparkonce run FILE`` in its own group.

Each driver runs in a new session (its own process group), so a SIGKILL of the
group takes the Python driver, its JVM and its Python workers down together, as
a machine failure would.

Each driver run records the faults that fired in it, and whether it ended fenced,
in its own events file beside its log (``SPARKONCE_FAULT_EVENTS``; the schema is in
:mod:`sparkonce.faults`): :meth:`Driver.events` reads them.

Each driver run also gets Spark scratch space of its own beside its log
(``SPARK_LOCAL_DIRS``, and the driver JVM's ``java.io.tmpdir`` through
``SPARK_SUBMIT_OPTS``; :attr:`Driver.local_dir`), removed once the run has ended. Spark
removes its scratch directories on a clean exit, but a SIGKILLed driver cannot: without
this, every killed trial would leave its shuffle files and its copy of the
``spark.archives`` environment (a hundred megabytes or more on a cluster) in the
system's temporary directory, and a long campaign would fill the disk.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparkonce.faults import EVENTS_ENV, read_events
from sparkonce.protocol import CRASH_ENV, CrashPoint

SIGKILL_EXIT = -signal.SIGKILL
LOCAL_DIRS_ENV = "SPARK_LOCAL_DIRS"
SUBMIT_OPTS_ENV = "SPARK_SUBMIT_OPTS"  # Java options of the driver JVM spark-submit starts


class Driver:
    """One run of a pipeline file in a child process.

    ``entry`` is what follows ``python -m`` before the file: ``sparkonce run`` by
    default, or another module that takes the pipeline file first (the reference
    run of :mod:`sparkonce.verify.reference`).
    """

    def __init__(
        self,
        pipeline_file: str | Path,
        log_path: str | Path,
        *,
        crash_at: CrashPoint | None = None,
        crash_hit: int = 1,
        env: Mapping[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
        entry: tuple[str, ...] = ("sparkonce", "run"),
    ) -> None:
        self.pipeline_file = Path(pipeline_file)
        self.log_path = Path(log_path)
        self.crash_at = crash_at
        self.crash_hit = crash_hit
        self.env = dict(env or {})
        self.extra_args = extra_args
        self.entry = entry
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.started_wall = 0.0
        self.ended_at: float | None = None
        self.killed_by_us = False

    def start(self) -> Driver:
        env = dict(os.environ)
        env.pop(CRASH_ENV, None)
        env.update(self.env)
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        if self.crash_at is not None:
            env[CRASH_ENV] = f"{self.crash_at.value}@{self.crash_hit}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if LOCAL_DIRS_ENV not in self.env:
            # Scratch space of this run only, removed in wait() (see the module docstring).
            shutil.rmtree(self.local_dir, ignore_errors=True)
            self.local_dir.mkdir(parents=True)
            env[LOCAL_DIRS_ENV] = str(self.local_dir)
            # The driver JVM's temporary directory too: spark-submit copies what
            # spark.archives names there, outside the local directories.
            tmpdir = f'"-Djava.io.tmpdir={self.local_dir}"'
            env[SUBMIT_OPTS_ENV] = f"{env.get(SUBMIT_OPTS_ENV, '')} {tmpdir}".strip()
        if EVENTS_ENV not in self.env:
            # This run's events only: the driver and its Python workers append to this file.
            self.events_path.unlink(missing_ok=True)
            env[EVENTS_ENV] = str(self.events_path)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed in wait()
        self._log = log
        extra = self.extra_args
        if self.entry == ("sparkonce", "run") and "--log-file" not in extra:
            # Spark's own log (executor errors, such as injected task failures) goes to a
            # file of its own beside the driver's output; see full_log().
            extra = (*extra, "--log-file", str(self.spark_log_path))
        cmd = [sys.executable, "-m", *self.entry, str(self.pipeline_file), *extra]
        self.started_at = time.monotonic()
        self.started_wall = time.time()  # to place the run's phase events (Unix time)
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "driver not started"
        return self.proc.pid

    def poll(self) -> int | None:
        assert self.proc is not None, "driver not started"
        code = self.proc.poll()
        if code is not None and self.ended_at is None:
            self.ended_at = time.monotonic()
        return code

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the driver's whole process group (driver, JVM, Python workers)."""
        self.killed_by_us = True
        self.signal_group(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP the group: a driver that looks dead but is not (a zombie to be)."""
        self.signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal_group(signal.SIGCONT)

    def wait(self, timeout: float | None = None) -> int:
        assert self.proc is not None, "driver not started"
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is not None:
                self._log.close()
        self.ended_at = self.ended_at or time.monotonic()
        self._reap_group()
        if LOCAL_DIRS_ENV not in self.env:
            shutil.rmtree(self.local_dir, ignore_errors=True)
        return code

    def _reap_group(self) -> None:
        # Children (the JVM) may outlive a SIGKILLed driver for a moment; make sure
        # nothing of this run keeps writing once we consider it dead.
        if self.proc is not None and self.proc.returncode is not None:
            self.signal_group(signal.SIGKILL)

    @property
    def seconds(self) -> float:
        end = self.ended_at if self.ended_at is not None else time.monotonic()
        return end - self.started_at

    @property
    def spark_log_path(self) -> Path:
        """Where ``sparkonce run`` writes Spark's and py4j's full log for this driver."""
        return self.log_path.with_name(self.log_path.name + ".spark.log")

    @property
    def local_dir(self) -> Path:
        """This run's Spark scratch directory (``SPARK_LOCAL_DIRS``), beside its log; it
        exists while the run does, unless ``env`` names other local directories."""
        return self.log_path.with_name(self.log_path.name + ".spark-local")

    @property
    def events_path(self) -> Path:
        """Where this driver run's fault events go (``SPARKONCE_FAULT_EVENTS``), unless
        ``env`` names another file."""
        given = self.env.get(EVENTS_ENV)
        return Path(given) if given else self.log_path.with_suffix(".events.jsonl")

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        """The events this run wrote so far (see :mod:`sparkonce.faults`); with ``event``,
        only that kind (``"crash"``, ``"pause"``, ``"drop-connection"``,
        ``"task-failure"``, ``"fenced"``)."""
        return read_events(self.events_path, event)

    def phases(self) -> dict[str, float]:
        """Seconds from this driver's start to each progress mark it recorded (the first of
        each name: ``run-started``, ``query-started``)."""
        out: dict[str, float] = {}
        for e in read_events(self.events_path, "phase"):
            name = str(e.get("name"))
            if name not in out and isinstance(e.get("at"), (int, float)):
                out[name] = round(float(e["at"]) - self.started_wall, 3)
        return out

    def full_log(self) -> str:
        """The driver's output and its Spark log, as one text."""
        parts = []
        for path in (self.log_path, self.spark_log_path):
            try:
                parts.append(path.read_text(errors="replace"))
            except FileNotFoundError:
                continue
        return "\n".join(parts)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
