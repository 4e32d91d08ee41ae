"""A throwaway PostgreSQL server for the tests (and for ``make pg-start`` / ``make pg-stop``).

``start(DIR)`` initialises a cluster in DIR (first time only), starts it on 127.0.0.1 on a free
port with trust authentication, and waits until it accepts connections. ``stop(DIR)`` stops it.
Nothing listens on a public interface and no unix socket is created.

PostgreSQL refuses to run as root. When the tests run as root, ``initdb`` and ``pg_ctl`` run as
the ``postgres`` system user (created by Debian's ``postgresql`` package) through ``runuser``;
DIR is chowned to that user, and temporary-directory parents that it cannot traverse (pytest's
``/tmp/pytest-of-root`` is mode 0700) get the others-execute bit. If DIR lies somewhere else the
``postgres`` user cannot reach, the cluster lives in a fresh directory under the temp dir instead
and DIR only records where (``DIR/cluster-location``).

Command line (from the repository root)::

    python -m tests.services.postgres start DIR [--port N]   # prints the URL
    python -m tests.services.postgres stop DIR

If ``SPARKONCE_TEST_PG_URL`` is set, :func:`session_server` uses that server instead of starting
one.
"""

from __future__ import annotations

import dataclasses
import grp
import os
import pathlib
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Sequence

import psycopg
from psycopg import sql

from tests.services.process import HOST, command_line, free_port, log_tail

__all__ = ["PostgresServer", "session_server", "start", "stop"]

USER = "sparkonce"
DBNAME = "postgres"
ENV_URL = "SPARKONCE_TEST_PG_URL"
STARTUP_TIMEOUT_S = 30.0
POSTGRES_SYSTEM_USER = "postgres"
LOCATION_FILE = "cluster-location"
LOG_NAME = "server.log"
_SETTINGS_MARKER = "# --- sparkonce test settings ---"
_SETTINGS = f"""
{_SETTINGS_MARKER}
listen_addresses = '{HOST}'
unix_socket_directories = ''
max_connections = 300
fsync = off
synchronous_commit = off
full_page_writes = off
"""


@dataclasses.dataclass(frozen=True)
class PostgresServer:
    """Where a running PostgreSQL server is; ``datadir`` is None for an external server."""

    host: str
    port: int
    user: str
    dbname: str
    datadir: pathlib.Path | None
    password: str | None = dataclasses.field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self._url_for(self.dbname)

    def _url_for(self, dbname: str) -> str:
        auth = urllib.parse.quote(self.user, safe="")
        if self.password is not None:
            auth += ":" + urllib.parse.quote(self.password, safe="")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"postgresql://{auth}@{host}:{self.port}/{urllib.parse.quote(dbname, safe='')}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` (dropping any old one of that name); return its URL."""
        self.drop_database(name)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self._url_for(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` if it exists, closing its connections."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    @classmethod
    def from_url(cls, url: str) -> PostgresServer:
        """Describe an already-running server from a ``postgresql://`` URL."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError(f"not a postgresql:// URL: {url!r}")
        dbname = urllib.parse.unquote(parts.path.lstrip("/")) or DBNAME
        return cls(
            host=parts.hostname or HOST,
            port=parts.port or 5432,
            user=urllib.parse.unquote(parts.username) if parts.username else USER,
            dbname=dbname,
            datadir=None,
            password=urllib.parse.unquote(parts.password) if parts.password is not None else None,
        )


# --- binaries and users ------------------------------------------------------------------------


def _bindir() -> pathlib.Path:
    """Server binaries of the highest installed PostgreSQL major version."""
    candidates: list[tuple[int, pathlib.Path]] = []
    for initdb in pathlib.Path("/usr/lib/postgresql").glob("*/bin/initdb"):
        version = initdb.parent.parent.name
        if version.isdigit() and (initdb.parent / "pg_ctl").exists():
            candidates.append((int(version), initdb.parent))
    if not candidates:
        raise RuntimeError(
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin; "
            "run `bash scripts/ensure-postgres.sh` to install them"
        )
    return max(candidates)[1]


def _is_root() -> bool:
    return os.geteuid() == 0


def _postgres_account() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(POSTGRES_SYSTEM_USER)
    except KeyError:
        raise RuntimeError(
            f"running as root, but there is no {POSTGRES_SYSTEM_USER!r} system user to run the "
            "server as; run `bash scripts/ensure-postgres.sh` (installs Debian's postgresql) "
            "or run the tests as an ordinary user"
        ) from None


def _run(
    argv: Sequence[str], cwd: pathlib.Path, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a server tool, as the postgres system user when we are root."""
    cmd = list(argv)
    if _is_root():
        runuser = shutil.which("runuser") or "/usr/sbin/runuser"
        cmd = [runuser, "-u", POSTGRES_SYSTEM_USER, "--", *cmd]
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    env.pop("PGDATA", None)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed with exit code {proc.returncode}:\n"
            f"{proc.stdout}{proc.stderr}".rstrip()
        )
    return proc


# --- where the cluster lives -------------------------------------------------------------------


def _blocked_ancestors(path: pathlib.Path, account: pwd.struct_passwd) -> list[pathlib.Path]:
    """Existing ancestors of ``path`` that ``account`` may not traverse."""
    gids = {account.pw_gid} | {g.gr_gid for g in grp.getgrall() if account.pw_name in g.gr_mem}
    blocked: list[pathlib.Path] = []
    for ancestor in reversed(path.parents):
        try:
            st = ancestor.stat()
        except FileNotFoundError:
            break
        if st.st_uid == account.pw_uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid in gids:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            blocked.append(ancestor)
    return blocked


def _is_under(path: pathlib.Path, root: pathlib.Path) -> bool:
    return path == root or root in path.parents


def _mode_reset_by_others(path: pathlib.Path) -> bool:
    """Whether other processes put ``path``'s mode back: pytest's per-user temp root
    (``/tmp/pytest-of-<user>``), which every pytest session that starts makes 0700 again, so
    that the postgres user loses its way into a cluster under it (seen: the checkpointer's
    PANIC "could not open file .../global/pg_control: Permission denied" while a mutation
    run's pytest sessions started beside a campaign's server)."""
    return path.name.startswith("pytest-of-")


def _cluster_dir(datadir: pathlib.Path, create: bool) -> pathlib.Path:
    """The directory that holds (or will hold) the cluster for ``datadir``.

    Normally that is ``datadir`` itself. As root, it is made reachable for the postgres user,
    or, if that would mean loosening permissions outside the temp dir or on a directory whose
    mode others reset, relocated under the temp dir (:func:`remove` deletes it).
    """
    datadir = datadir.absolute()
    pointer = datadir / LOCATION_FILE
    if pointer.is_file():
        return pathlib.Path(pointer.read_text().strip())
    if not create:
        return datadir
    datadir.mkdir(parents=True, exist_ok=True)
    if not _is_root():
        return datadir
    account = _postgres_account()
    cluster = datadir.resolve()
    blocked = _blocked_ancestors(cluster, account)
    tmp = pathlib.Path(tempfile.gettempdir()).resolve()
    if all(
        _is_under(b, tmp)
        and b != tmp
        and b.stat().st_uid == os.geteuid()
        and not _mode_reset_by_others(b)
        for b in blocked
    ):
        for b in blocked:  # e.g. /tmp/pytest-of-root (0700): allow traversal, not listing
            b.chmod(stat.S_IMODE(b.stat().st_mode) | stat.S_IXOTH)
    else:
        parent = pathlib.Path(tempfile.mkdtemp(prefix="sparkonce-pg-"))
        parent.chmod(0o755)
        cluster = parent / "data"
        pointer.write_text(f"{cluster}\n")
        cluster.mkdir()
    if cluster.stat().st_uid != account.pw_uid:
        os.chown(cluster, account.pw_uid, account.pw_gid)
    return cluster


# --- start / stop ------------------------------------------------------------------------------


def _initdb(bindir: pathlib.Path, cluster: pathlib.Path) -> None:
    if (cluster / "PG_VERSION").exists():
        return
    if any(cluster.iterdir()):
        raise RuntimeError(f"{cluster} is neither empty nor a PostgreSQL data directory")
    _run(
        [
            str(bindir / "initdb"),
            "-D",
            str(cluster),
            "-A",
            "trust",
            "-U",
            USER,
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ],
        cwd=cluster,
    )
    conf = cluster / "postgresql.conf"
    if _SETTINGS_MARKER not in conf.read_text():
        with conf.open("a") as f:  # appending keeps the file's owner (postgres)
            f.write(_SETTINGS)


def _running_port(bindir: pathlib.Path, cluster: pathlib.Path) -> int | None:
    """Port of the postmaster running in ``cluster``, or None if none is running."""
    pidfile = cluster / "postmaster.pid"
    if not pidfile.exists():
        return None
    if _run(
        [str(bindir / "pg_ctl"), "status", "-D", str(cluster)], cwd=cluster, check=False
    ).returncode:
        return None
    lines = pidfile.read_text().splitlines()
    return int(lines[3]) if len(lines) > 3 and lines[3].strip().isdigit() else None


def _log_tail(log: pathlib.Path, since: int = 0) -> str:
    return log_tail(log, since, lines=30, missing="(no server log)")


def _wait_ready(server: PostgresServer, log: pathlib.Path, deadline: float) -> None:
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(server.url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError as exc:
            last = exc
            time.sleep(0.1)
    raise RuntimeError(
        f"PostgreSQL at {server.url} did not accept connections within {STARTUP_TIMEOUT_S:.0f} s "
        f"({last}); tail of {log}:\n{_log_tail(log)}"
    )


def start(datadir: pathlib.Path, port: int | None = None) -> PostgresServer:
    """Start (initialising if needed) a throwaway cluster in ``datadir``; reuse a running one."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    bindir = _bindir()
    cluster = _cluster_dir(pathlib.Path(datadir), create=True)
    log = cluster / LOG_NAME

    running = _running_port(bindir, cluster)
    if running is not None:
        server = PostgresServer(HOST, running, USER, DBNAME, cluster)
        _wait_ready(server, log, deadline)
        return server

    _initdb(bindir, cluster)
    attempts = 1 if port is not None else 3  # a free port can be taken before we bind it
    for attempt in range(attempts):
        chosen = port if port is not None else free_port()
        offset = log.stat().st_size if log.exists() else 0
        remaining = max(1, int(deadline - time.monotonic()))
        proc = _run(
            [
                str(bindir / "pg_ctl"),
                "start",
                "-D",
                str(cluster),
                "-l",
                str(log),
                "-w",
                "-t",
                str(remaining),
                "-o",
                f"-p {chosen}",
            ],
            cwd=cluster,
            check=False,
        )
        if proc.returncode == 0:
            server = PostgresServer(HOST, chosen, USER, DBNAME, cluster)
            _wait_ready(server, log, deadline)
            return server
        tail = _log_tail(log, since=offset)
        if attempt + 1 < attempts and re.search(r"could not bind|already in use", tail):
            continue
        raise RuntimeError(
            f"pg_ctl start failed (exit code {proc.returncode}): {proc.stdout}{proc.stderr}"
            f"\ntail of {log}:\n{tail}"
        )
    raise AssertionError("unreachable")


def stop(datadir: pathlib.Path) -> None:
    """Stop the cluster in ``datadir`` (fast shutdown); do nothing if it is not running."""
    cluster = _cluster_dir(pathlib.Path(datadir), create=False)
    if not (cluster / "PG_VERSION").exists():
        return
    bindir = _bindir()
    if _running_port(bindir, cluster) is None:
        return
    _run([str(bindir / "pg_ctl"), "stop", "-D", str(cluster), "-m", "fast", "-w"], cwd=cluster)


def remove(datadir: pathlib.Path) -> None:
    """Stop the cluster in ``datadir`` and delete it, with the directory it was relocated to,
    if it was (:func:`_cluster_dir`)."""
    datadir = pathlib.Path(datadir).absolute()
    stop(datadir)
    pointer = datadir / LOCATION_FILE
    if pointer.is_file():
        shutil.rmtree(pathlib.Path(pointer.read_text().strip()).parent, ignore_errors=True)
    shutil.rmtree(datadir, ignore_errors=True)


def kill(datadir: pathlib.Path) -> None:
    """Crash the cluster in ``datadir``: immediate shutdown, no checkpoint, every session cut
    off at once (as a killed server; the next start recovers from the WAL)."""
    # create=True makes the path reachable for the postgres user again: another pytest
    # session may have reset its temp root's mode to 0700 since the server started.
    cluster = _cluster_dir(pathlib.Path(datadir), create=True)
    bindir = _bindir()
    _run([str(bindir / "pg_ctl"), "stop", "-D", str(cluster), "-m", "immediate", "-w"], cwd=cluster)


def session_server(tmp_root: pathlib.Path) -> Iterator[PostgresServer]:
    """Generator for a session fixture: a server with its cluster in ``tmp_root/pgdata``.

    With ``SPARKONCE_TEST_PG_URL`` set, yields that server and starts/stops nothing.
    """
    external = os.environ.get(ENV_URL)
    if external:
        yield PostgresServer.from_url(external)
        return
    datadir = pathlib.Path(tmp_root) / "pgdata"
    try:
        yield start(datadir)
    finally:
        stop(datadir)


# --- command line ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    return command_line(
        argv,
        module="tests.services.postgres",
        description="Start or stop a throwaway PostgreSQL server for the sparkonce tests.",
        noun="server",
        start=lambda datadir, port: start(datadir, port=port).url,
        stop=stop,
    )


if __name__ == "__main__":
    sys.exit(main())
