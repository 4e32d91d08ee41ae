"""A class-data archive for the driver's JVM: Spark's classes loaded from one mapped file.

Starting a driver's JVM spends most of its time loading and verifying Spark's classes (about
9 s to a session here, and 4.5 s more for the first job). A dynamic class-data-sharing
archive (JDK 13+, ``-XX:ArchiveClassesAtExit`` then ``-XX:SharedArchiveFile``) holds those
classes already parsed and verified; with it, the same session started in 5 s and its first
job ran in 2 s. It changes start-up time only, never results.

:func:`build_session` uses the archive when it exists. It is built once per machine, by
:func:`ensure_archive` (``sparkonce verify`` calls it before its trials, the tests before
their first driver), because dumping one costs a run of its own (about a minute here) that
a single short-lived driver would not win back. The archive's name is a digest of what it depends
on: the ``java`` binary, PySpark's jars and this module's JVM options. A JVM that finds the
archive stale anyway (a jar changed in place) ignores it and loads classes as usual.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from sparkonce.errors import ConfigError

log = logging.getLogger(__name__)

CACHE_ENV = "SPARKONCE_CACHE_DIR"
# Off: the archive is neither used nor built (for comparing start-up times, say).
DISABLE_ENV = "SPARKONCE_NO_CLASS_DATA"
# Mismatch reports (an archive from another JDK build) would go to the driver's stdout.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
BUILD_TIMEOUT_S = 300.0


def cache_dir() -> Path:
    """``$SPARKONCE_CACHE_DIR``, else ``$XDG_CACHE_HOME/sparkonce``, else
    ``~/.cache/sparkonce``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparkonce"


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_path(jars: Path | None = None) -> Path | None:
    """Where this machine's archive is, or would be, for the JVM classpath ``jars`` (default:
    PySpark's jar directory); None when no ``java`` is found."""
    import pyspark

    java = _java()
    if java is None:
        return None
    digest = hashlib.sha256()
    digest.update(f"{java}:{java.stat().st_mtime_ns}\n".encode())
    jars = jars or Path(pyspark.__file__).parent / "jars"
    for jar in sorted(jars.glob("*.jar")):
        stat = jar.stat()
        digest.update(f"{jar}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    digest.update(QUIET.encode())
    return cache_dir() / "spark-class-data" / f"{pyspark.__version__}-{digest.hexdigest()[:16]}.jsa"


def java_options() -> str:
    """The JVM options that use the archive, or ``""`` when there is none (or it is off)."""
    if os.environ.get(DISABLE_ENV):
        return ""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def ensure_archive(
    timeout: float = BUILD_TIMEOUT_S, on_build: Callable[[str], None] | None = None
) -> Path | None:
    """This machine's archive, built first if it is missing (a Spark run of its own, about
    a minute here; ``on_build`` is told before it starts). None when it is off or no
    ``java`` is found.

    Safe to call from several processes at once (``make test``'s two pytest workers, say):
    they take turns on a lock file beside the archive, so one builds it and the others, once
    it is in place, use it; the build writes a file of its own (named after its pid) and
    renames it into place, so no JVM maps a half-written archive. Raises
    :class:`ConfigError` naming the build's log if the build fails.
    """
    if os.environ.get(DISABLE_ENV):
        return None
    path = archive_path()
    if path is None or path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if path.is_file():  # built by another process while this one waited
            return path
        return _build(path, timeout, on_build)


def _build(path: Path, timeout: float, on_build: Callable[[str], None] | None) -> Path:
    tmp = path.with_name(f".building-{os.getpid()}.jsa")  # the JVM writes it at exit
    build_log = path.parent / "build.log"
    log.info("building the JVM class-data archive %s (once per machine)", path)
    if on_build is not None:
        on_build(f"building the JVM class-data archive for faster driver starts, once: {path}")
    env = {**os.environ, DISABLE_ENV: "1"}  # the build itself must not map an archive
    try:
        with build_log.open("w") as out:
            proc = subprocess.run(
                [sys.executable, "-m", "sparkonce.spark.classdata_dump", str(tmp)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout,
                check=False,
            )
        if proc.returncode != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
            raise ConfigError(
                f"could not build the JVM class-data archive (exit code {proc.returncode}); "
                f"see {build_log}, or set {DISABLE_ENV}=1 to start drivers without one"
            )
        os.replace(tmp, path)
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"building the JVM class-data archive took more than {timeout:.0f} s; see "
            f"{build_log}, or set {DISABLE_ENV}=1 to start drivers without one"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    log.info("built the JVM class-data archive %s", path)
    return path
