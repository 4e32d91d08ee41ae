"""What the tests' throwaway services share: free ports, their logs' tails, the processes they
start in process groups of their own (a pid file in the work directory, found again by another
interpreter through ``/proc``), and their ``start DIR`` / ``stop DIR`` command line.

Used by :mod:`tests.services.kafka`, :mod:`tests.services.s3`, :mod:`tests.services.postgres`
and :mod:`tests.services.spark_cluster`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on :data:`HOST` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def log_tail(log: pathlib.Path, since: int = 0, lines: int = 40, missing: str = "") -> str:
    """The last ``lines`` lines of ``log`` from byte ``since`` on; ``missing`` (default
    ``(no <name>)``) when there is no such file."""
    try:
        with log.open("rb") as f:
            f.seek(since)
            text = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return missing or f"(no {log.name})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class ProcFacts:
    """What ``/proc`` says of a process: its arguments, state letter and working directory."""

    cmdline: list[bytes]
    state: str
    cwd: pathlib.Path | None

    @property
    def alive(self) -> bool:
        return self.state != "Z"


def proc_facts(pid: int) -> ProcFacts | None:
    """``/proc``'s facts of ``pid``, or None when it is gone (or unreadable)."""
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    try:
        cwd: pathlib.Path | None = pathlib.Path(f"/proc/{pid}/cwd").resolve()
    except OSError:
        cwd = None
    return ProcFacts(cmdline, state, cwd)


@dataclass
class ServiceProcesses:
    """The processes of one kind of service, each started in a process group of its own
    (its pid is the group's) for a work directory that holds its pid file.

    ``ours(facts, workdir)`` says whether a process that another interpreter started is this
    kind's for ``workdir``; the ones this interpreter started are kept in ``children``."""

    pid_name: str
    ours: Callable[[ProcFacts, pathlib.Path], bool]
    children: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def is_ours(self, pid: int, workdir: pathlib.Path) -> bool:
        """Whether ``pid`` is a live (not zombie) process of this kind for ``workdir``."""
        child = self.children.get(pid)
        if child is not None:
            return child.poll() is None
        facts = proc_facts(pid)
        return facts is not None and facts.alive and self.ours(facts, workdir)

    def running_pid(self, workdir: pathlib.Path) -> int | None:
        """The pid in ``workdir``'s pid file, if that process still runs as ours."""
        try:
            pid = int((workdir / self.pid_name).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if self.is_ours(pid, workdir) else None

    def wait_exit(self, pid: int, workdir: pathlib.Path, timeout: float) -> bool:
        """Whether ``pid`` exited within ``timeout`` seconds."""
        child = self.children.get(pid)
        if child is not None:
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout
        while self.is_ours(pid, workdir):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def stop(self, workdir: pathlib.Path, timeout: float, files: Sequence[str] = ()) -> None:
        """Stop the process running for ``workdir``: SIGTERM, then after ``timeout`` s SIGKILL
        to its process group (``timeout=0`` kills at once); then remove its pid file and
        ``files``. Does nothing to processes when none runs there."""
        pid = self.running_pid(workdir)
        if pid is not None:
            if timeout > 0:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)
            if timeout <= 0 or not self.wait_exit(pid, workdir, timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self.wait_exit(pid, workdir, 10.0)
            self.children.pop(pid, None)
        for name in (self.pid_name, *files):
            with contextlib.suppress(FileNotFoundError):
                (workdir / name).unlink()


def command_line(
    argv: Sequence[str] | None,
    *,
    module: str,
    description: str,
    noun: str,
    start: Callable[[pathlib.Path, int | None], str],
    stop: Callable[[pathlib.Path], None],
    node_commands: Mapping[str, tuple[str, Callable[[pathlib.Path], object]]] = {},
) -> int:
    """``python -m MODULE start DIR [--port N]`` (prints what ``start`` returns: the address
    to connect to) and ``stop DIR``; ``node_commands`` adds ``NAME DIR N`` commands that act
    on ``DIR/nodeN`` of a cluster. Exit code 1 with one line for a :class:`RuntimeError`."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help=f"start (or reuse) the {noun} in DIR; print its address")
    p_start.add_argument("workdir", metavar="DIR", type=pathlib.Path)
    p_start.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    p_stop = sub.add_parser("stop", help=f"stop the {noun} in DIR, if it is running")
    p_stop.add_argument("workdir", metavar="DIR", type=pathlib.Path)
    for name, (what, _run) in node_commands.items():
        p_node = sub.add_parser(name, help=f"{what} node N of the cluster in DIR")
        p_node.add_argument("workdir", metavar="DIR", type=pathlib.Path)
        p_node.add_argument("node", metavar="N", type=int)
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            print(start(args.workdir, args.port))
        elif args.command == "stop":
            stop(args.workdir)
        else:
            node_commands[args.command][1](args.workdir / f"node{args.node}")
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
