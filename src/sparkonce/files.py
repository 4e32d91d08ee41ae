"""Files on any filesystem Spark can reach: local paths directly, the rest through Hadoop
(or pyarrow, where there is no JVM).

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
* :class:`ArrowFiles`, through :mod:`pyarrow.fs`, for where there is no JVM: a Spark
  Connect client (:mod:`sparkonce.jvm` answers None there) and the Spark server's Python
  worker that runs a Connect pipeline's batch function. It reaches ``s3a://`` and
  ``s3://`` (pyarrow's S3 client) and ``hdfs://`` (pyarrow's libhdfs binding), with the
  S3A settings the user gave Spark, carried as plain values (:class:`ArrowSettings`), so
  that a process without a session can rebuild it. It reads a checkpoint on S3 about 2-3x
  faster than :class:`HadoopFiles` (``benchmarks/connect_files.py``); classic sessions
  keep :class:`HadoopFiles` all the same, for its parity with Spark: every Hadoop scheme
  and S3A credential provider that Spark's own checkpoint writer uses.

Every path handed to these classes is a location string as :func:`location` returns
it: an absolute local path, or a URL with its scheme. :func:`join` builds children
with ``/``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote, urlparse

from sparkonce.errors import ConfigError, SparkOnceError
from sparkonce.jvm import hadoop_conf, jvm

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
        """Write ``text`` so that readers see the old file or the whole new one: through a
        temporary file and a rename, or on S3 through pyarrow as one object. Without
        ``overwrite`` a file already there is kept (returns False)."""
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
        gateway, conf = jvm(spark), hadoop_conf(spark)
        if gateway is None or conf is None:
            raise ConfigError("HadoopFiles needs a classic Spark session (a JVM in this process)")
        self.jvm: Any = gateway
        self.conf = conf
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


# --- without a JVM: pyarrow.fs ------------------------------------------------------------

#: The schemes :class:`ArrowFiles` reaches; on a Spark Connect session a checkpoint elsewhere
#: is refused (:func:`arrow_scheme_error`).
ARROW_SCHEMES = ("s3a", "s3", "hdfs")
# The S3A settings ArrowSettings reads (Hadoop names; Spark's are "spark.hadoop." + these).
S3A_KEYS = (
    "fs.s3a.endpoint",
    "fs.s3a.endpoint.region",
    "fs.s3a.path.style.access",
    "fs.s3a.connection.ssl.enabled",
    "fs.s3a.aws.credentials.provider",
    "fs.s3a.access.key",
    "fs.s3a.secret.key",
    "fs.s3a.session.token",
    "fs.s3a.connection.establish.timeout",
    "fs.s3a.connection.timeout",
    "fs.s3a.attempts.maximum",
)
_SPARK_HADOOP = "spark.hadoop."
# Hadoop's time suffixes (Configuration.getTimeDuration), in seconds; S3A's timeouts without
# one are milliseconds.
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h|d)?\s*$", re.IGNORECASE)
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# The endpoint S3A uses when none is set: AWS itself, for which pyarrow needs no override.
_AWS_GLOBAL_ENDPOINTS = {"", "s3.amazonaws.com"}


@dataclass(frozen=True, repr=False)
class ArrowSettings:
    """How :class:`ArrowFiles` reaches S3: the S3A settings the user gave Spark
    (``spark.hadoop.fs.s3a.*``), as plain values.

    Plain and picklable on purpose: a Spark Connect pipeline's batch function runs in the
    Spark server's Python worker, where there is no session to ask, so the user's process
    builds these (:meth:`of`) and the function carries them. The keys are secrets: they
    appear in no repr, str or log line (``credentials=`` says only where they come from);
    the pickled function carries them as it carries the sink's store URL.

    Without ``access_key`` (and not ``anonymous``) pyarrow's AWS client finds credentials
    itself: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
    ``~/.aws``, then the EC2 instance's role, in the process that reads (on Connect,
    the server's Python worker too). On a Spark Connect session that is always the way:
    the server hands out no secret setting (measured on PySpark 4.2's Connect server:
    ``spark.conf.get`` of ``spark.hadoop.fs.s3a.access.key``, ``.secret.key`` and
    ``.aws.credentials.provider`` raises ``SQL_CONF_NOT_FOUND``, and ``getAll`` leaves
    them and any ``...token...`` key out, though they were set), so keys the server's S3A
    uses from its configuration are not the client's to carry; give both processes the
    AWS environment (or an instance role), or build the settings with the keys
    (``dataclasses.replace(settings, access_key=..., secret_key=...)``).
    """

    endpoint: str | None = None  # host[:port] (fs.s3a.endpoint without its scheme)
    scheme: str = "https"  # http when fs.s3a.connection.ssl.enabled is false
    region: str | None = None  # fs.s3a.endpoint.region
    path_style: bool = False  # fs.s3a.path.style.access
    anonymous: bool = False  # an AnonymousAWSCredentialsProvider in the provider list
    access_key: str | None = None
    secret_key: str | None = None
    session_token: str | None = None
    connect_timeout_s: float | None = None  # fs.s3a.connection.establish.timeout
    request_timeout_s: float | None = None  # fs.s3a.connection.timeout
    max_attempts: int | None = None  # fs.s3a.attempts.maximum

    @property
    def credentials(self) -> str:
        """Where the S3 credentials come from, for messages (never the keys)."""
        if self.anonymous:
            return "anonymous"
        if self.access_key:
            return "session keys" if self.session_token else "keys"
        return "default AWS chain"

    def __repr__(self) -> str:
        shown = [f"endpoint={self.endpoint!r}", f"scheme={self.scheme!r}"]
        if self.region:
            shown.append(f"region={self.region!r}")
        if self.path_style:
            shown.append("path_style=True")
        shown.append(f"credentials={self.credentials!r}")
        return f"ArrowSettings({', '.join(shown)})"

    @classmethod
    def from_hadoop(cls, conf: Mapping[str, str | None]) -> ArrowSettings:
        """Settings from S3A's Hadoop names (``fs.s3a.endpoint``...); missing or empty
        values keep pyarrow's defaults. Raises :class:`ConfigError` naming the setting (never
        a secret's value) for one S3A would refuse too."""

        def get(key: str) -> str | None:
            value = conf.get(key)
            return value.strip() if value is not None and value.strip() else None

        endpoint = get("fs.s3a.endpoint")
        scheme = "https" if _hadoop_bool(get("fs.s3a.connection.ssl.enabled"), True) else "http"
        if endpoint is not None and "://" in endpoint:
            parsed = urlparse(endpoint)
            scheme, endpoint = parsed.scheme.lower(), parsed.netloc + parsed.path.rstrip("/")
        if endpoint is not None and endpoint.lower() in _AWS_GLOBAL_ENDPOINTS:
            endpoint = None
        access, secret = get("fs.s3a.access.key"), get("fs.s3a.secret.key")
        if (access is None) != (secret is None):
            given, missing = ("access", "secret") if secret is None else ("secret", "access")
            raise ConfigError(
                f"spark.hadoop.fs.s3a.{given}.key is set without spark.hadoop.fs.s3a.{missing}"
                ".key; set both, or neither to use the AWS credential chain (environment, "
                "~/.aws, the instance's role)"
            )
        attempts = get("fs.s3a.attempts.maximum")
        if attempts is not None and (not attempts.isdigit() or int(attempts) < 1):
            raise ConfigError(
                f"spark.hadoop.fs.s3a.attempts.maximum is {attempts!r}; give a whole number of "
                "attempts, 1 or more"
            )
        return cls(
            endpoint=endpoint,
            scheme=scheme,
            region=get("fs.s3a.endpoint.region"),
            path_style=_hadoop_bool(get("fs.s3a.path.style.access"), False),
            anonymous="anonymous" in (get("fs.s3a.aws.credentials.provider") or "").lower(),
            access_key=access,
            secret_key=secret,
            session_token=get("fs.s3a.session.token") if access else None,
            connect_timeout_s=_hadoop_seconds(conf, "fs.s3a.connection.establish.timeout"),
            request_timeout_s=_hadoop_seconds(conf, "fs.s3a.connection.timeout"),
            max_attempts=int(attempts) if attempts is not None else None,
        )

    @classmethod
    def of(cls, spark: SparkSession) -> ArrowSettings:
        """The settings of ``spark``'s S3A configuration, on a classic or a Connect session.

        On Connect the session's configuration is all there is (``spark.conf``: the
        ``spark.hadoop.fs.s3a.*`` the server was started with and any set on the session,
        in one round trip), without its secrets, which the server keeps to itself: the
        credentials then come from the AWS chain of the process that reads (see the class's
        docstring). On a classic session the Hadoop configuration of its
        SparkContext comes first, as it is what :class:`HadoopFiles` and Spark's checkpoint
        writer use (settings put there directly, not through ``spark.hadoop.*``, count);
        ``spark.conf`` fills what it lacks."""
        conf: dict[str, str | None] = {}
        hadoop = hadoop_conf(spark)  # None on Connect
        if hadoop is not None:
            for key in S3A_KEYS:
                value = hadoop.get(key)
                if value is not None:
                    conf[key] = str(value)
        for key, value in spark.conf.getAll.items():
            if key.startswith(_SPARK_HADOOP + "fs.s3a."):
                conf.setdefault(key[len(_SPARK_HADOOP) :], value)
        return cls.from_hadoop(conf)

    def s3_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`pyarrow.fs.S3FileSystem` for these settings."""
        options: dict[str, Any] = {"scheme": self.scheme, "anonymous": self.anonymous}
        if self.access_key and not self.anonymous:
            options.update(access_key=self.access_key, secret_key=self.secret_key)
            if self.session_token:
                options["session_token"] = self.session_token
        if self.region:
            options["region"] = self.region
        if self.endpoint:
            options["endpoint_override"] = self.endpoint
            # pyarrow addresses buckets by path once an endpoint is given; S3A by host name
            # unless path.style.access is set.
            options["force_virtual_addressing"] = not self.path_style
        if self.connect_timeout_s is not None:
            options["connect_timeout"] = self.connect_timeout_s
        if self.request_timeout_s is not None:
            options["request_timeout"] = self.request_timeout_s
        if self.max_attempts is not None:
            from pyarrow.fs import AwsStandardS3RetryStrategy

            options["retry_strategy"] = AwsStandardS3RetryStrategy(max_attempts=self.max_attempts)
        return options


def _hadoop_bool(value: str | None, default: bool) -> bool:
    """As Hadoop's ``Configuration.getBoolean``: ``true``/``false`` in any case, else the
    default."""
    if value is not None and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return default


def _hadoop_seconds(conf: Mapping[str, str | None], key: str) -> float | None:
    """A Hadoop time setting in seconds (``15s``, ``200ms``, ``1m``; a bare number is
    milliseconds, as S3A reads its timeouts); None when unset."""
    value = conf.get(key)
    if value is None or not value.strip():
        return None
    found = _DURATION.match(value)
    if found is None:
        raise ConfigError(
            f"spark.hadoop.{key} is {value!r}, not a duration; write it as S3A does, such as "
            "15s, 200ms or 15000 (milliseconds)"
        )
    return float(found.group(1)) * _UNIT_S[(found.group(2) or "ms").lower()]


def arrow_scheme_error(path: str) -> ConfigError:
    """The error for a location :class:`ArrowFiles` cannot reach (a Connect session)."""
    s = scheme(path)
    return ConfigError(
        f"{path}: on a Spark Connect session sparkonce reads the checkpoint without Spark's "
        f"JVM, through pyarrow, which it does for {', '.join(f'{x}://' for x in ARROW_SCHEMES)} "
        f"only, not {s}://. Use one of those, a local path that this process and the Spark "
        "server both see, or a classic Spark session (SparkSession.builder.master(...)), which "
        f"reads {s}:// through Spark's own Hadoop filesystem"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


class ArrowFiles:
    """:class:`Files` through :mod:`pyarrow.fs`, for a process with no JVM to ask.

    One pyarrow filesystem per scheme and bucket (or name node), made on first use, so
    building one costs nothing and a location it cannot reach fails where it is first
    used (``check_usable`` at the start of a run) with a :class:`ConfigError`.

    Writes: on S3 an object appears whole or not at all (one PUT, or a multipart upload
    completed in one request), so a file is written in place, with no temporary object to
    leave behind; on HDFS through a temporary file and a rename. ``write_text`` with
    ``overwrite=False`` checks that the file is missing and then writes: another writer
    between the two wins or loses unseen, as with :class:`HadoopFiles` on ``s3a://``
    (its check and rename, a copy on S3, are two requests too), and unlike HDFS through
    the JVM, whose rename refuses an existing target (pyarrow's replaces it). sparkonce's
    checkpoint readers only read; one writer per location is the pipeline's job, and the
    sinks' epoch fencing keeps a second driver's output out.
    """

    def __init__(self, settings: ArrowSettings | None = None) -> None:
        self.settings = settings if settings is not None else ArrowSettings()
        self._fs: dict[tuple[str, str], Any] = {}

    def __repr__(self) -> str:
        return f"ArrowFiles({self.settings!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings, "_fs": {}}  # filesystems are made again where used

    def _path(self, path: str) -> tuple[Any, str]:
        parsed = urlparse(path)
        s = parsed.scheme.lower()
        if s not in ARROW_SCHEMES:
            raise arrow_scheme_error(path)
        key = (s, parsed.netloc)
        fs = self._fs.get(key)
        if fs is None:
            fs = self._hdfs(path, parsed.netloc) if s == "hdfs" else self._s3(path)
            self._fs[key] = fs
        if s == "hdfs":
            return fs, parsed.path or "/"
        return fs, (parsed.netloc + parsed.path).rstrip("/")

    def _s3(self, path: str) -> Any:
        from pyarrow.fs import S3FileSystem

        options = self.settings.s3_options()
        try:
            try:
                # One PUT per small file instead of a multipart upload's three requests.
                return S3FileSystem(**options, allow_delayed_open=True)
            except TypeError:  # an older pyarrow: a multipart upload, as atomic
                return S3FileSystem(**options)
        except (OSError, ValueError) as exc:
            raise arrow_error(path, exc, self.settings) from None

    def _hdfs(self, path: str, netloc: str) -> Any:
        from pyarrow.fs import HadoopFileSystem

        try:
            return HadoopFileSystem.from_uri(f"hdfs://{netloc}/")
        except OSError as exc:
            if "Unable to load lib" in str(exc):  # libjvm or libhdfs
                raise ConfigError(
                    f"{path}: without Spark's JVM sparkonce reads hdfs:// through pyarrow's "
                    "HadoopFileSystem, which loads libhdfs and a Java runtime into the process "
                    f"that reads (on Spark Connect also the server's Python worker): "
                    f"{_first_line(exc)}. Set JAVA_HOME, ARROW_LIBHDFS_DIR (the directory of "
                    "libhdfs.so; or HADOOP_HOME with lib/native) and CLASSPATH (the output of "
                    "`hadoop classpath --glob`) there, or use a classic Spark session, which "
                    "reads hdfs:// through its own JVM"
                ) from None
            raise arrow_error(path, exc, self.settings) from None

    def _type(self, path: str) -> Any:
        fs, p = self._path(path)
        return fs.get_file_info(p).type

    def exists(self, path: str) -> bool:
        from pyarrow.fs import FileType

        return bool(self._type(path) != FileType.NotFound)

    def is_dir(self, path: str) -> bool:
        from pyarrow.fs import FileType

        return bool(self._type(path) == FileType.Directory)

    def list_names(self, path: str) -> list[str]:
        from pyarrow.fs import FileSelector

        fs, p = self._path(path)
        try:
            infos = fs.get_file_info(FileSelector(p, allow_not_found=True))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [str(i.base_name) for i in infos]

    def read_bytes(self, path: str) -> bytes | None:
        fs, p = self._path(path)
        try:
            with fs.open_input_stream(p) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            return None

    def read_text(self, path: str) -> str | None:
        data = self.read_bytes(path)
        return None if data is None else data.decode("utf-8")

    def write_text(self, path: str, text: str, *, overwrite: bool) -> bool:
        from pyarrow.fs import FileType

        fs, p = self._path(path)
        if not overwrite and fs.get_file_info(p).type != FileType.NotFound:
            return False
        data = text.encode("utf-8")
        if scheme(path) != "hdfs":  # S3: the object appears whole, in place
            with fs.open_output_stream(p) as out:
                out.write(data)
            return True
        tmp = f"{p}.{os.getpid()}.tmp"
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        try:
            fs.move(tmp, p)
        except OSError:
            fs.delete_file(tmp)
            raise
        return True

    def delete(self, path: str) -> None:
        from pyarrow.fs import FileType

        fs, p = self._path(path)
        kind = fs.get_file_info(p).type
        if kind == FileType.NotFound:
            return
        if kind == FileType.Directory and scheme(path) != "hdfs" and "/" not in p:
            raise ConfigError(f"{path} is a whole bucket; sparkonce deletes only paths inside one")
        try:
            if kind == FileType.Directory:
                fs.delete_dir(p)
            else:
                fs.delete_file(p)
        except FileNotFoundError:  # another process deleted it meanwhile
            pass

    def check_writable_dir(self, path: str, what: str) -> None:
        from pyarrow.fs import FileType

        fs, p = self._path(path)  # raises for a scheme it cannot reach
        try:
            kind = fs.get_file_info(p).type
        except OSError as exc:
            raise arrow_error(path, exc, self.settings) from None
        if kind == FileType.File:
            raise ConfigError(
                f"{what} {path} is a file, not a directory. Operator action: point it at a "
                "directory; it is created if missing"
            )


def arrow_error(path: str, exc: BaseException, settings: ArrowSettings) -> ConfigError:
    """A clear error for a location pyarrow cannot reach, naming its first line and where
    the credentials came from (never the keys)."""
    where = f"endpoint {settings.endpoint}" if settings.endpoint else "AWS"
    what = "pyarrow's HDFS client" if scheme(path) == "hdfs" else f"pyarrow's S3 client ({where})"
    return ConfigError(
        f"{path} cannot be reached through {what}: {_first_line(exc)}. Check the location, the "
        f"credentials ({settings.credentials}) and the spark.hadoop.fs.s3a.* settings of the "
        "session"
    )


def files_for(
    loc: str, spark: SparkSession | None = None, *, settings: ArrowSettings | None = None
) -> Files:
    """The :class:`Files` that reach ``loc``.

    Local paths need no session (:class:`LocalFiles`). With ``settings``, any other location
    is read through pyarrow (:class:`ArrowFiles`), with no session at all: the way of a
    process that has none, such as the Spark server's Python worker running a Connect
    pipeline's batch function. Otherwise ``spark`` (or the active session) decides: a
    classic session reads through its JVM (:class:`HadoopFiles`), a Spark Connect session,
    which has none, through pyarrow with its S3A settings (:meth:`ArrowSettings.of`)."""
    if not is_remote(loc):
        return LocalFiles()
    if settings is not None:
        return ArrowFiles(settings)
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    if spark is None:
        raise ConfigError(
            f"{loc} is read through Spark's Hadoop filesystem, and this process has no Spark "
            "session; start one first (sparkonce.build_session) or use a local path"
        )
    if jvm(spark) is None:  # a Spark Connect session
        return ArrowFiles(ArrowSettings.of(spark))
    return HadoopFiles(spark)
