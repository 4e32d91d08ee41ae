"""A throwaway Spark standalone cluster on 127.0.0.1, and the Python environment it ships.

:class:`SparkCluster` runs one master and some workers (two by default, one core each) from
the Spark that pip installed with PySpark (``SPARK_HOME`` is the ``pyspark`` package
directory, whose ``bin/spark-class`` starts them). Each daemon gets free ports, a process
group of its own (a worker's executors join it) and a log file; startup waits until the
master's JSON page lists every worker ALIVE. :meth:`SparkCluster.kill_worker` takes a
worker down as a failing machine would: its JVM, its executors and their Python workers at
once. Everything lives in one directory::

    ROOT/master.log              the master's output (Spark logs to stderr)
    ROOT/worker-N.log            worker N's output; N counts up, replacements get new numbers
    ROOT/worker-N/               worker N's --work-dir: APP_ID/EXECUTOR_ID/{stdout,stderr} per
                                 executor, and the unpacked spark.archives in that directory

Tests use the cluster from driver processes of their own (``sparkonce run --master URL``):
a process has one SparkContext, so a session on the cluster cannot live beside the tests'
shared ``local[2]`` one.

**Shipping the executors' Python.** Executors run a task's Python code (UDFs, and the read
side of sparkonce's sources) in ``./environment/bin/python`` of their working directory,
where Spark unpacks ``spark.archives=ARCHIVE#environment`` before the first task. The
archive is a slim virtualenv packed by ``scripts/pack-executor-env.sh``
(:func:`executor_env_archive`). What takes the Python path to the executors is the driver
process's ``PYSPARK_PYTHON``: PySpark stores it in every Python function it sends to the
JVM, and every Python worker of that function, on an executor or on the driver, is started
with it. Spark's ``spark.pyspark.python`` and ``spark.executorEnv.PYSPARK_PYTHON`` are not
read on this path (a driver started from Python, not by ``spark-submit app.py``): with
only them, executors run the driver's interpreter. Because the path is relative, the
driver's side needs an ``environment`` too: Spark runs the planning half of a Python data
source (sparkonce's sources find their offsets and plan a batch's ranges there) in Python
workers that the *driver's* JVM starts with the same ``./environment/bin/python``,
relative to the driver's working directory. So a driver in client mode runs in a
directory where the same archive is unpacked (:func:`unpack_environment`); its own process
keeps whatever interpreter started it. tests/cluster/test_session.py shows both set-ups
that fall short. :func:`client_settings` and :func:`driver_environment` give the rest.

On a real cluster the archive works the same way as long as every node has the
interpreter its ``bin/python`` links to at the same path (see the script for
``--python-prefix`` and for shipping an interpreter too). The alternative that needs no
archive is the same virtualenv at the same absolute path on every node, and
``PYSPARK_PYTHON`` set to it.

Command line (from the repository root)::

    python -m tests.services.spark_cluster start DIR   # prints the master URL; runs until
                                                       # SIGINT or SIGTERM, then stops it all
    python -m tests.services.spark_cluster pack        # builds (or finds) the archive
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tests.services.process import HOST, free_port, log_tail

__all__ = [
    "ENV_NAME",
    "ENV_PYTHON",
    "ClusterWithS3",
    "SparkCluster",
    "client_settings",
    "cluster_with_s3",
    "driver_environment",
    "executor_env_archive",
    "spark_home",
    "unpack_environment",
]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
PACK_SCRIPT = REPO_ROOT / "scripts" / "pack-executor-env.sh"
STARTUP_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
PACK_TIMEOUT_S = 900.0
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"

# The name spark.archives unpacks the environment under, and the interpreter in it.
ENV_NAME = "environment"
ENV_PYTHON = f"./{ENV_NAME}/bin/python"

WORKER_CORES = 1
WORKER_MEMORY = "2g"
EXECUTOR_MEMORY = "512m"
# The daemons only schedule: a small heap, the C1 JIT and the serial collector (they start
# about a third faster, and leave the 2 cores to the executors).
DAEMON_MEMORY = "256m"
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# Variables of the test process that must not reach the daemons, and so the executors they
# start: executors must find Python, PySpark and sparkonce only where a driver ships them.
_DAEMON_ENV_DROPPED = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "PYSPARK_SUBMIT_ARGS",
    "SPARK_CONF_DIR",
    "SPARK_LOCAL_DIRS",  # a test driver's scratch space, gone with its test
    "SPARK_SUBMIT_OPTS",
    "VIRTUAL_ENV",
)


def spark_home() -> pathlib.Path:
    """The Spark that pip installed with PySpark: its jars, ``bin/`` and ``python/lib``."""
    import pyspark

    return pathlib.Path(pyspark.__file__).resolve().parent


def _cmdline(pid: int) -> list[str]:
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of ``pid``, or None if it is gone."""
    try:
        text = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) S ppid pgrp ...": comm may hold spaces, so split after the last ')'.
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1]), int(fields[2])


def _cwd(pid: int) -> pathlib.Path | None:
    try:
        return pathlib.Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def _describe(pid: int) -> str:
    """A process's command line, short: a JVM by its main class and what follows."""
    args = _cmdline(pid)
    main = next((i for i, a in enumerate(args) if a.startswith("org.apache.spark.")), None)
    if main is not None:
        args = ["java", *args[main:]]
    return " ".join(args)[:200]


def _pids() -> Iterator[int]:
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def _option(args: Sequence[str], name: str) -> str | None:
    with contextlib.suppress(ValueError, IndexError):
        return args[args.index(name) + 1]
    return None


@dataclasses.dataclass
class Worker:
    """One worker daemon: ``index`` names its log and work dir; ``pid`` is its JVM, and
    also its process group (its executors and their Python workers are in it)."""

    index: int
    port: int
    webui_port: int
    workdir: pathlib.Path
    log: pathlib.Path
    proc: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        """How executors name their worker (``--worker-url``)."""
        return f"spark://Worker@{HOST}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclasses.dataclass(frozen=True)
class Executor:
    """An executor JVM of some application, found by its command line."""

    pid: int
    app_id: str
    executor_id: str
    worker_url: str


class SparkCluster:
    """A standalone master and ``workers`` workers on 127.0.0.1 (see the module docstring).

    Use it as a context manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(self, root: pathlib.Path, workers: int = 2, cores: int = WORKER_CORES) -> None:
        """``cores`` per worker: each application takes one per worker (``client_settings``),
        so with 2, two applications run at a time (a zombie driver beside its successor)."""
        self.root = pathlib.Path(root).absolute()
        self.initial_workers = workers
        self.cores = cores
        self.workers: list[Worker] = []
        self.master: subprocess.Popen[bytes] | None = None
        self.master_port = 0
        self.master_webui_port = 0
        self._groups: set[int] = set()
        self._killed: set[int] = set()  # indexes of workers kill_worker() took down

    # -- life cycle ----------------------------------------------------------------------------

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    @property
    def master_log(self) -> pathlib.Path:
        return self.root / "master.log"

    def start(self) -> SparkCluster:
        """Start the master and the workers; return once the master lists them ALIVE."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self._start_master()
            for _ in range(self.initial_workers):
                self._launch_worker()
            self.wait_for_workers()
        except BaseException:
            self.close()
            raise
        return self

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _DAEMON_ENV_DROPPED}
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP=HOST,
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            SPARK_DAEMON_JAVA_OPTS=QUICK_JVM,
            # A taken port fails the start (and it is retried with fresh ones) instead of
            # Spark moving to the next port, which this class would not know about.
            # No REST submission server: it binds the fixed port 6066, so a second cluster
            # on this machine (a test beside a campaign) never came up.
            SPARK_MASTER_OPTS="-Dspark.port.maxRetries=0 -Dspark.worker.timeout=15 "
            "-Dspark.master.rest.enabled=false",
            # Each application's work dir holds the unpacked archive (about 370 MB per
            # executor): a finished application's goes a minute after its last file.
            SPARK_WORKER_OPTS="-Dspark.port.maxRetries=0 -Dspark.worker.cleanup.enabled=true "
            "-Dspark.worker.cleanup.interval=60 -Dspark.worker.cleanup.appDataTtl=60",
        )
        return env

    def _spawn(self, args: list[str], log: pathlib.Path) -> subprocess.Popen[bytes]:
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=self.root,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: its executors die with it
            )
        self._groups.add(proc.pid)
        return proc

    def _start_master(self) -> None:
        for attempt in range(3):  # a free port can be taken before the master binds it
            self.master_port, self.master_webui_port = free_port(), free_port()
            since = self.master_log.stat().st_size if self.master_log.exists() else 0
            self.master = self._spawn(
                [
                    MASTER_CLASS,
                    "--host",
                    HOST,
                    "--port",
                    str(self.master_port),
                    "--webui-port",
                    str(self.master_webui_port),
                ],
                self.master_log,
            )
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while time.monotonic() < deadline:
                if self.master.poll() is not None:
                    break
                with contextlib.suppress(OSError, ValueError):
                    if self.state().get("status") == "ALIVE":
                        return
                time.sleep(0.2)
            else:
                raise RuntimeError(
                    f"Spark master not up within {STARTUP_TIMEOUT_S:.0f} s; tail of "
                    f"{self.master_log}:\n{log_tail(self.master_log, lines=30)}"
                )
            with self.master_log.open("rb") as f:
                f.seek(since)
                bind_error = b"BindException" in f.read()
            if not bind_error or attempt == 2:
                raise RuntimeError(
                    f"Spark master exited with code {self.master.returncode} during startup; "
                    f"tail of {self.master_log}:\n{log_tail(self.master_log, lines=30)}"
                )

    def _launch_worker(self) -> Worker:
        index = len(self.workers)
        workdir = self.root / f"worker-{index}"
        workdir.mkdir(exist_ok=True)
        port, webui_port = free_port(), free_port()
        log = self.root / f"worker-{index}.log"
        proc = self._spawn(
            [
                WORKER_CLASS,
                self.master_url,
                "--host",
                HOST,
                "--port",
                str(port),
                "--webui-port",
                str(webui_port),
                "--cores",
                str(self.cores),
                "--memory",
                WORKER_MEMORY,
                "--work-dir",
                str(workdir),
            ],
            log,
        )
        worker = Worker(index, port, webui_port, workdir, log, proc)
        self.workers.append(worker)
        return worker

    def start_worker(self) -> Worker:
        """Start one more worker (a replacement, say) and wait until the master lists it."""
        worker = self._launch_worker()
        self.wait_for_workers()
        return worker

    def wait_for_workers(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Wait until the master lists every live worker of ours as ALIVE."""
        deadline = time.monotonic() + timeout
        wanted: set[int] = set()
        while True:
            wanted = {w.port for w in self.workers if w.alive}
            exited = [w for w in self.workers if not w.alive and w.index not in self._killed]
            if exited or (self.master is not None and self.master.poll() is not None):
                raise RuntimeError("a Spark daemon exited during startup:\n" + self._tails())
            with contextlib.suppress(OSError, ValueError):
                if wanted <= self.alive_worker_ports():
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Spark master did not list workers on ports {sorted(wanted)} as ALIVE "
                    f"within {timeout:.0f} s:\n{self._tails()}"
                )
            time.sleep(0.25)

    def _tails(self) -> str:
        parts = [f"--- {self.master_log}\n{log_tail(self.master_log, lines=30)}"]
        parts += [f"--- {w.log}\n{log_tail(w.log, lines=30)}" for w in self.workers]
        return "\n".join(parts)

    def close(self) -> None:
        """Stop every worker and the master (SIGTERM to each process group: a worker stops
        its executors), then SIGKILL whatever of the cluster is left after
        :data:`STOP_TIMEOUT_S` (see :meth:`processes`)."""
        procs = [w.proc for w in self.workers]
        if self.master is not None:
            procs.append(self.master)
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        # Whatever is left (an executor slow to stop, a Python daemon that has not yet seen
        # its executor go) goes now.
        deadline = time.monotonic() + 10
        while (left := self._members(self.root, self._groups)) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    # -- state -----------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The master's JSON page (``http://127.0.0.1:WEBUI/json/``): workers, applications."""
        url = f"http://{HOST}:{self.master_webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            data: dict[str, Any] = json.load(response)
        return data

    def alive_worker_ports(self) -> set[int]:
        return {int(w["port"]) for w in self.state().get("workers", []) if w["state"] == "ALIVE"}

    def apps(self) -> list[dict[str, Any]]:
        """The master's running applications (id, name, cores, state...)."""
        apps: list[dict[str, Any]] = self.state().get("activeapps", [])
        return apps

    def executors(self, app_id: str | None = None) -> list[Executor]:
        """Executor JVMs running on this cluster's workers (of ``app_id`` only, if given),
        found by their command lines (``ps`` would show the same)."""
        ours = {w.url for w in self.workers}
        found = []
        for pid in _pids():
            args = _cmdline(pid)
            if EXECUTOR_CLASS not in args:
                continue
            worker_url = _option(args, "--worker-url") or ""
            app = _option(args, "--app-id") or ""
            state = _stat(pid)
            if worker_url not in ours or state is None or state[0] == "Z":
                continue
            if app_id is None or app == app_id:
                found.append(Executor(pid, app, _option(args, "--executor-id") or "", worker_url))
        return found

    def executor_pids(self, app_id: str | None = None) -> dict[int, list[int]]:
        """Executor JVM pids per worker index (see :meth:`executors`)."""
        by_url = {w.url: w.index for w in self.workers}
        out: dict[int, list[int]] = {}
        for e in self.executors(app_id):
            out.setdefault(by_url[e.worker_url], []).append(e.pid)
        return out

    def worker_of(self, pid: int) -> Worker | None:
        """The worker that ``pid`` (an executor, or one of its Python workers) runs under,
        from its working directory (executors and their Python workers run in
        ``WORKDIR/APP_ID/EXECUTOR_ID``)."""
        cwd = _cwd(pid)
        if cwd is None:
            return None
        return next((w for w in self.workers if cwd.is_relative_to(w.workdir)), None)

    def processes(self) -> list[tuple[int, str]]:
        """Every live process this cluster started (daemons, executors, their Python
        workers), as (pid, command line): empty once :meth:`close` is done."""
        return [(pid, _describe(pid)) for pid in self._members(self.root, self._groups)]

    def _members(self, root: pathlib.Path, groups: set[int]) -> list[int]:
        """Live processes in ``groups``, their descendants, and any process working under
        ``root``. PySpark's daemon (an executor's Python workers' parent) moves itself
        into a process group of its own, and outlives its executor for a moment when
        that dies: the tree and the working directory find it either way."""
        table = {pid: st for pid in _pids() if (st := _stat(pid)) is not None and st[0] != "Z"}
        found = {pid for pid, (_, _, group) in table.items() if group in groups}
        found |= {pid for pid in table if (cwd := _cwd(pid)) and cwd.is_relative_to(root)}
        children: dict[int, list[int]] = {}
        for pid, (_, parent, _) in table.items():
            children.setdefault(parent, []).append(pid)
        todo = list(found)
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        return sorted(found)

    # -- faults ----------------------------------------------------------------------------------

    def kill_worker(self, index: int) -> list[int]:
        """SIGKILL worker ``index`` like a machine that dies: its JVM, its executors and
        their Python workers, all at once. Returns the pids killed."""
        worker = self.workers[index]
        self._killed.add(index)
        killed = self._members(worker.workdir, {worker.pid})
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        worker.proc.wait(30)
        deadline = time.monotonic() + 30
        while left := self._members(worker.workdir, {worker.pid}):
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {index}'s processes outlived SIGKILL: {left}")
            for pid in left:  # anything forked meanwhile
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        return killed


# --- the executors' Python environment ----------------------------------------------------------


def executor_env_archive(out_dir: pathlib.Path | None = None) -> pathlib.Path:
    """The packed executor environment (``scripts/pack-executor-env.sh``): built on the first
    call and whenever pyproject.toml or src/ changed, else taken from ``.cache/executor-env``."""
    cmd = ["bash", str(PACK_SCRIPT)]
    if out_dir is not None:
        cmd.append(str(out_dir))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=PACK_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{PACK_SCRIPT} failed (exit code {proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    archive = pathlib.Path(proc.stdout.strip().splitlines()[-1])
    if not archive.is_file():
        raise RuntimeError(f"{PACK_SCRIPT} printed {archive}, which is no file:\n{proc.stderr}")
    return archive


def unpack_environment(archive: pathlib.Path, directory: pathlib.Path) -> pathlib.Path:
    """Unpack ``archive`` as ``directory/environment`` (what Spark does in each executor's
    working directory), so that a driver running in ``directory`` finds ``./environment``
    too. Returns ``directory``."""
    target = directory / ENV_NAME
    if not (target / "bin" / "python").exists():
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(target, filter="tar")
    return directory


def client_settings(cluster: SparkCluster, archive: pathlib.Path) -> dict[str, str]:
    """Spark settings for a driver on ``cluster`` whose executors run ``archive``'s Python.

    One executor per worker (1 core each, ``spark.cores.max`` = the workers' cores), and the
    first job waits until all of them registered, so that tasks can land on every worker.
    """
    cores = WORKER_CORES * cluster.initial_workers
    return {
        "spark.master": cluster.master_url,
        "spark.archives": f"{archive}#{ENV_NAME}",
        "spark.driver.host": HOST,
        "spark.driver.bindAddress": HOST,
        "spark.cores.max": str(cores),
        "spark.executor.cores": str(WORKER_CORES),
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.executor.extraJavaOptions": QUICK_JVM,
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
    }


def driver_environment(
    conf_dir: pathlib.Path, settings: Mapping[str, str], python: str | None = ENV_PYTHON
) -> dict[str, str]:
    """The environment of a driver process (``sparkonce run``, or any PySpark program) using
    ``settings``: they go to ``conf_dir/spark-defaults.conf``, which ``spark-submit`` reads
    through ``SPARK_CONF_DIR`` (as a cluster's own ``conf/`` would hold them), and
    ``PYSPARK_PYTHON`` is the executors' interpreter (see the module docstring; None leaves
    it unset, and :func:`sparkonce.build_session` then sets it to the driver's own)."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "spark-defaults.conf").write_text(
        "".join(f"{key} {value}\n" for key, value in settings.items())
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYSPARK_SUBMIT_ARGS", "PYSPARK_PYTHON")
    }
    env.update(SPARK_CONF_DIR=str(conf_dir), SPARK_LOCAL_IP=HOST)
    if python is not None:
        env["PYSPARK_PYTHON"] = python
    return env


@dataclasses.dataclass
class ClusterWithS3:
    """A running cluster and S3 server, and what a driver on them needs: its working
    directory (the executor environment unpacked) and its environment (see
    :func:`cluster_with_s3`)."""

    cluster: SparkCluster
    s3: Any  # tests.services.s3.S3Server
    driver_dir: pathlib.Path
    env: dict[str, str]


@contextlib.contextmanager
def cluster_with_s3(
    work: pathlib.Path, *, buckets: Sequence[str] = (), workers: int = 2, cores: int = WORKER_CORES
) -> Iterator[ClusterWithS3]:
    """A moto S3 server (with ``buckets``) and a cluster in ``work``, for scripts that run
    drivers on them (``scripts/cluster-campaign.py``, ``benchmarks/cluster_checkpoint.py``).

    Drivers run in ``driver_dir`` with ``env``: the cluster's client settings and the S3A
    settings in a ``spark-defaults.conf`` of their own, and ``PYTHONPATH`` on this
    checkout's ``src`` (the archive is built from it). Both services stop on leaving."""
    from tests.services import s3

    # An archive of its own: the pack script removes the other archives in its directory
    # when src/ changes, and a long campaign must not lose the one its drivers ship.
    archive = executor_env_archive(work / "executor-env")
    driver_dir = unpack_environment(archive, work / "driver")
    server = s3.start(work / "s3")
    try:
        for bucket in buckets:
            server.create_bucket(bucket)
        with SparkCluster(work / "cluster", workers=workers, cores=cores) as cluster:
            settings = {**client_settings(cluster, archive), **s3.s3a_settings(server)}
            env = driver_environment(work / "conf", settings)
            env["PYTHONPATH"] = str(REPO_ROOT / "src")
            yield ClusterWithS3(cluster, server, driver_dir, env)
    finally:
        s3.stop(work / "s3")


# --- command line ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.services.spark_cluster",
        description="A throwaway Spark standalone cluster, and the executors' environment.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="run a master and workers in DIR until Ctrl-C")
    p_start.add_argument("root", metavar="DIR", type=pathlib.Path)
    p_start.add_argument("--workers", type=int, default=2)
    sub.add_parser("pack", help="build (or find) the executors' environment; print its path")
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            print(executor_env_archive())
            return 0

        # SIGTERM too (a shell's background job ignores SIGINT): either stops the cluster.
        def stop(_signum: int, _frame: object) -> None:
            raise KeyboardInterrupt

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, stop)
        with SparkCluster(args.root, args.workers) as cluster:
            print(cluster.master_url, flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
