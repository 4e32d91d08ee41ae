"""Files on any filesystem Spark can reach: local paths directly, the rest through Hadoop.

A pipeline's checkpoint and a Delta table's ledger files live wherever the user puts
them: a local directory, or ``s3a://``, ``hdfs://``, ``abfs://``, ``gs://`` and any
other scheme that has a Hadoop ``FileSystem`` on Spark's classpath. sparkonce reads
and writes the few small files it needs there through one small interface,
:class:`Files`, with two implementations:

* :class:`LocalFiles`, plain :mod:`pathlib`, for local paths (and ``file://`` URIs).
  It needs no Spark session, so ``sparkonce status``, ``explain`` and ``verify`` read
  a local checkpoint without starting one.
* :class:`HadoopFiles`, through the session's JVM: ``Path(url).getFileSystem(conf)``
  with the session's Hadoop configuration, which is exactly the filesystem Spark's
  own checkpoint writer and Delta use. So a location works for sparkonce if and only
  if it works for Spark, with the same credentials and settings (``spark.hadoop.*``).

Every path handed to these classes is a location string as :func:`location` returns
it: an absolute local path, or a URL with its scheme. :func:`join` builds children
with ``/``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote, urlparse

from sparkonce.errors import ConfigError, SparkOnceError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

# Schemes whose Hadoop connector sparkonce fetches with scripts/fetch-jars.sh and adds to
# the session itself (sparkonce.spark.session.filesystem_conf); any other needs its jars in
# spark.jars (or on the cluster's classpath) as Spark itself does.
FETCHED_SCHEMES = {"s3a": "s3"}
# S3A's settings for the check of a checkpoint at the start (HadoopFiles._probe): one
# attempt per request and one retry, instead of S3A's 7 retries with backoff (a minute).
PROBE_SETTINGS = {
    "fs.s3a.attempts.maximum": "1",
    "fs.s3a.retry.limit": "1",
    "fs.s3a.retry.interval": "200ms",
    "fs.s3a.retry.throttle.limit": "1",
}


def scheme(loc: str | Path) -> str:
    """The location's URL scheme, ``""`` for a local path (``file://`` included)."""
    text = str(loc)
    if "://" not in text:
        return ""
    found = urlparse(text).scheme.lower()
    return "" if found == "file" else found


def is_remote(loc: str | Path) -> bool:
    """Whether ``loc`` is on a filesystem other than this machine's (a URL with a scheme)."""
    return scheme(loc) != ""


def location(raw: str | Path, what: str = "path") -> str:
    """``raw`` as sparkonce keeps a location: an absolute local path (``file://`` and
    ``~`` resolved), or a URL with a scheme and an authority, without a trailing ``/``.

    Raises :class:`ConfigError` for an empty string, a ``file://`` URI naming another
    host, and a URL without a bucket or host (``s3a:///x``)."""
    text = str(raw).strip()
    if not text:
        raise ConfigError(
            f"the {what} is empty; give a local directory or a URL like s3a://bucket/dir"
        )
    if "://" not in text:
        return str(Path(text).expanduser().resolve())
    parsed = urlparse(text)
    if parsed.scheme.lower() == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ConfigError(
                f"the {what} {text!r} names host {parsed.netloc!r}; a file:// URI is a path on "
                "this machine: use file:///absolute/path"
            )
        return str(Path(unquote(parsed.path)).resolve())
    if not parsed.netloc:
        raise ConfigError(
            f"the {what} {text!r} has no bucket or host after {parsed.scheme}://; write it as "
            f"{parsed.scheme}://BUCKET-OR-HOST/path"
        )
    return text.rstrip("/")


def join(loc: str, *parts: str) -> str:
    """``loc/part/...`` (parts are single names or relative paths with ``/``)."""
    return "/".join([loc.rstrip("/"), *parts])


class Files(Protocol):
    """The few file operations sparkonce needs, on one filesystem."""

    def exists(self, path: str) -> bool: ...

    def is_dir(self, path: str) -> bool: ...

    def list_names(self, path: str) -> list[str]:
        """Names in directory ``path`` (``[]`` when it is missing)."""
        ...

    def read_bytes(self, path: str) -> bytes | None:
        """The file's content, None when it is missing."""
        ...

    def read_text(self, path: str) -> str | None:
        """The file as UTF-8 text, None when it is missing."""
        ...

    def write_text(self, path: str, text: str, *, overwrite: bool) -> bool:
        """Write ``text`` through a temporary file and a rename. Without ``overwrite`` a
        file already there is kept (returns False)."""
        ...

    def delete(self, path: str) -> None:
        """Remove ``path`` (a directory with its content); nothing if it is missing."""
        ...

    def check_writable_dir(self, path: str, what: str) -> None:
        """Raise :class:`ConfigError` unless ``path`` is, or can become, a directory."""
        ...


class LocalFiles:
    """:class:`Files` on this machine's filesystem."""

    def exists(self, path: str) -> bool:
        return Path(path).exists()

    def is_dir(self, path: str) -> bool:
        return Path(path).is_dir()

    def list_names(self, path: str) -> list[str]:
        p = Path(path)
        return [c.name for c in p.iterdir()] if p.is_dir() else []

    def read_bytes(self, path: str) -> bytes | None:
        try:
            return Path(path).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read_text(self, path: str) -> str | None:
        data = self.read_bytes(path)
        return None if data is None else data.decode("utf-8")

    def write_text(self, path: str, text: str, *, overwrite: bool) -> bool:
        target = Path(path)
        if not overwrite and target.exists():
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        if overwrite:
            os.replace(tmp, target)
            return True
        try:
            os.link(tmp, target)  # fails if another writer got there first
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def delete(self, path: str) -> None:
        import shutil

        p = Path(path)
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)

    def check_writable_dir(self, path: str, what: str) -> None:
        p = Path(path)
        if p.exists() and not p.is_dir():
            raise ConfigError(
                f"{what} {p} is a file, not a directory. Operator action: point it at a "
                "directory; it is created if missing"
            )
        parent = p if p.exists() else next((a for a in p.parents if a.exists()), None)
        if parent is None or not parent.is_dir():
            raise ConfigError(
                f"{what} {p}: {parent} is not a directory, so it cannot be created there. "
                "Operator action: choose a path under an existing directory"
            )
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(
                f"{what} {p}: {parent} is not writable by this user. Operator action: fix its "
                "permissions or choose another directory"
            )


class HadoopFiles:
    """:class:`Files` through Hadoop's ``FileSystem`` in the session's JVM (driver only).

    One ``FileSystem`` object per scheme and authority, from the session's Hadoop
    configuration: the same one Spark's checkpoint writer and Delta get.
    """

    def __init__(self, spark: SparkSession) -> None:
        jvm = spark._jvm
        assert jvm is not None
        self.jvm: Any = jvm
        self.conf = spark._jsc.hadoopConfiguration()
        self._fs: dict[tuple[str, str], Any] = {}

    def _path(self, path: str) -> tuple[Any, Any]:
        parsed = urlparse(path)
        key = (parsed.scheme, parsed.netloc)
        jpath = self.jvm.org.apache.hadoop.fs.Path(path)
        fs = self._fs.get(key)
        if fs is None:
            try:
                fs = jpath.getFileSystem(self.conf)
            except Exception as exc:
                raise filesystem_error(path, exc) from None
            self._fs[key] = fs
        return fs, jpath

    def _probe(self, jpath: Any) -> Any:
        """A new S3A filesystem for the start's check, with S3A's retries cut down
        (:data:`PROBE_SETTINGS`): missing credentials or an unreachable endpoint then fail
        in seconds, not after a minute of backoff. The session's own stays as configured."""
        conf = self.jvm.org.apache.hadoop.conf.Configuration(self.conf)
        for key, value in PROBE_SETTINGS.items():
            conf.set(key, value)
        try:
            return self.jvm.org.apache.hadoop.fs.FileSystem.newInstance(jpath.toUri(), conf)
        except Exception as exc:
            raise filesystem_error(str(jpath), exc) from None

    def exists(self, path: str) -> bool:
        fs, p = self._path(path)
        return bool(fs.exists(p))

    def is_dir(self, path: str) -> bool:
        fs, p = self._path(path)
        return bool(fs.exists(p) and fs.getFileStatus(p).isDirectory())

    def list_names(self, path: str) -> list[str]:
        fs, p = self._path(path)
        try:
            statuses = fs.listStatus(p)
        except Exception as exc:
            if "FileNotFoundException" in str(exc):
                return []
            raise
        return [str(s.getPath().getName()) for s in statuses]

    def read_bytes(self, path: str) -> bytes | None:
        fs, p = self._path(path)
        try:
            stream = fs.open(p)
        except Exception as exc:
            if "FileNotFoundException" in str(exc):
                return None
            raise
        try:
            out = self.jvm.java.io.ByteArrayOutputStream()
            self.jvm.org.apache.hadoop.io.IOUtils.copyBytes(stream, out, 65536, False)
            return bytes(out.toByteArray())
        finally:
            stream.close()

    def read_text(self, path: str) -> str | None:
        data = self.read_bytes(path)
        return None if data is None else data.decode("utf-8")

    def write_text(self, path: str, text: str, *, overwrite: bool) -> bool:
        fs, target = self._path(path)
        if not overwrite and fs.exists(target):
            return False
        tmp = self.jvm.org.apache.hadoop.fs.Path(f"{path}.{os.getpid()}.tmp")
        out = fs.create(tmp, True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        if overwrite and fs.exists(target):
            fs.delete(target, False)
        if not fs.rename(tmp, target):
            fs.delete(tmp, False)
            if not overwrite and fs.exists(target):
                return False  # another writer of the same file got there first
            raise SparkOnceError(f"could not move {tmp} to {path} on its filesystem")
        return True

    def delete(self, path: str) -> None:
        fs, p = self._path(path)
        if fs.exists(p):
            fs.delete(p, True)

    def check_writable_dir(self, path: str, what: str) -> None:
        fs, p = self._path(path)  # raises for a scheme without a FileSystem
        probe = scheme(path) == "s3a"
        if probe:
            fs = self._probe(p)
        try:
            if fs.exists(p) and not fs.getFileStatus(p).isDirectory():
                raise ConfigError(
                    f"{what} {path} is a file, not a directory. Operator action: point it at a "
                    "directory; it is created if missing"
                )
        except ConfigError:
            raise
        except Exception as exc:
            raise filesystem_error(path, exc) from None
        finally:
            if probe:
                fs.close()


def java_causes(exc: BaseException) -> list[str]:
    """The Java exception behind ``exc`` (a ``Py4JJavaError``) and each of its causes, as
    ``class: message``, outermost first; from the text (``: ...`` and ``Caused by: ...``
    lines) when there is no Java object to ask. Empty when ``exc`` names none."""
    found: list[str] = []
    java = getattr(exc, "java_exception", None)
    try:
        while java is not None and len(found) < 10:
            found.append(" ".join(str(java.toString()).split()))
            java = java.getCause()
    except Exception:  # the JVM went away: what the text says will do
        pass
    if found:
        return found
    return _JAVA_CAUSE_LINE.findall(str(exc))


# In a Py4JJavaError's text: ": java.io.X: message" (the exception), "Caused by: ..." (causes).
_JAVA_CAUSE_LINE = re.compile(
    r"^(?::|Caused by:) ((?:[a-z]\w*\.)+[A-Z]\w*(?:Exception|Error)(?:: [^\n]*)?)$", re.MULTILINE
)


def _cause_text(exc: BaseException) -> str:
    """One line for ``exc``: its first line, and the innermost cause a Java exception names
    (``An error occurred while calling o47.exists.`` alone says nothing)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    causes = java_causes(exc)
    if not causes:
        return first[:300]
    outer, inner = causes[0], causes[-1]
    line = outer if len(outer) <= 400 else outer[:397] + "..."
    if inner != outer and inner.split(": ", 1)[-1] not in outer:
        line += f"; caused by {inner[:300]}"
    return line


def filesystem_error(path: str, exc: BaseException) -> ConfigError:
    """A clear error for a location Spark's Hadoop cannot reach: names the innermost
    cause of a Java exception (such as missing credentials)."""
    text = str(exc)
    first = _cause_text(exc)
    s = scheme(path)
    if "No FileSystem for scheme" in text or "UnsupportedFileSystemException" in text:
        fetched = FETCHED_SCHEMES.get(s)
        how = (
            f"sparkonce adds the {s}:// connector itself when its jars are fetched: run "
            f"scripts/fetch-jars.sh (they go to .cache/jars/{fetched}), or set "
            f"SPARKONCE_{fetched.upper()}_JARS to a directory holding them"
            if fetched
            else f"add the Hadoop connector jars for {s}:// to spark.jars (or to the cluster's "
            "classpath), as Spark itself needs them"
        )
        return ConfigError(f"{path}: Spark has no Hadoop filesystem for {s}://. {how}")
    return ConfigError(
        f"{path} cannot be reached through Spark's Hadoop filesystem: {first}. Check the "
        "location, the credentials and the spark.hadoop.* settings of the session"
    )


def files_for(loc: str, spark: SparkSession | None = None) -> Files:
    """The :class:`Files` that reach ``loc``: local paths need no session; any other
    location needs ``spark`` (or an active session)."""
    if not is_remote(loc):
        return LocalFiles()
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    if spark is None:
        raise ConfigError(
            f"{loc} is read through Spark's Hadoop filesystem, and this process has no Spark "
            "session; start one first (sparkonce.build_session) or use a local path"
        )
    return HadoopFiles(spark)
