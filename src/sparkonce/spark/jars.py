"""The JVM jars a session needs for Delta, Spark's Kafka connector and ``s3a://``: which ones
(pinned versions and SHA-256 digests), where sparkonce finds them, and :func:`fetch_jars`, which
downloads them from Maven Central for an installed wheel (``sparkonce jars fetch``).

A checkout gets them from ``scripts/fetch-jars.sh`` (``make jars``, Maven, into ``.cache/jars``).
An installed wheel has no checkout: ``sparkonce jars fetch`` puts them in the user's cache
directory (:func:`user_jar_cache`), where the session finds them with no setting; ``--dir DIR``
with ``SPARKONCE_JAR_CACHE=DIR`` puts them elsewhere (a shared or offline copy). The digests
make a download that is not the pinned jar fail before anything is kept."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sparkonce.errors import ConfigError, JarFetchError

# Hadoop's S3A filesystem (s3a:// paths) and what it calls; jars/pom.xml pins the same
# versions. hadoop-aws must be exactly the Hadoop that pyspark ships (see s3_jars).
HADOOP_AWS_VERSION = "3.5.0"
AWS_SDK_BUNDLE_VERSION = "2.35.4"
S3_ANALYTICS_ACCELERATOR_VERSION = "1.3.1"
S3_JARS = (
    f"hadoop-aws-{HADOOP_AWS_VERSION}.jar",
    f"bundle-{AWS_SDK_BUNDLE_VERSION}.jar",
    f"analyticsaccelerator-s3-{S3_ANALYTICS_ACCELERATOR_VERSION}.jar",
)
S3_JARS_ENV = "SPARKONCE_S3_JARS"
JAR_CACHE_ENV = "SPARKONCE_JAR_CACHE"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"


@dataclass(frozen=True)
class Artifact:
    """One jar on Maven Central, pinned by version and SHA-256."""

    group: str
    name: str
    version: str
    sha256: str
    size: int

    @property
    def coordinate(self) -> str:
        return f"{self.group}:{self.name}:{self.version}"

    @property
    def file_name(self) -> str:
        return f"{self.name}-{self.version}.jar"

    def url(self, repository: str) -> str:
        group = self.group.replace(".", "/")
        return f"{repository.rstrip('/')}/{group}/{self.name}/{self.version}/{self.file_name}"


# What each kind of session needs beyond pyspark's own jars: jars/pom.xml pins the same
# versions (tests/unit/test_jar_fetch.py checks that they agree). Only these jars, not their
# Maven dependencies: the rest ships with pyspark (spark-sql-kafka 4.2.0 also declares a
# spark-token-provider 4.2.0 that Maven Central does not have, which is why the connector
# is not left to spark.jars.packages).
JAR_SETS: dict[str, tuple[Artifact, ...]] = {
    "spark-kafka": (
        Artifact(
            "org.apache.spark",
            "spark-sql-kafka-0-10_2.13",
            "4.2.0",
            "64539c45e5d39f7ddb747312c239f38f5208d08c1a0ddf7d70beb2fbd9373705",
            494879,
        ),
        Artifact(
            "org.apache.spark",
            "spark-token-provider-kafka-0-10_2.13",
            "4.0.0",
            "f2be3b76f9e6cbe63379d4e4e0dc14f59dbf056ae2ad16ff15ac108004c86767",
            64975,
        ),
        Artifact(
            "org.apache.kafka",
            "kafka-clients",
            "3.9.2",
            "014b4ef36884478a932641818b080c36a8f8e2e92dc771e800c9d2694f4f83d8",
            9220052,
        ),
        Artifact(
            "org.apache.commons",
            "commons-pool2",
            "2.13.1",
            "f77a5060d6936a9144023584232f9de3f2248f1abfe156e9d31795f18770674f",
            156457,
        ),
    ),
    "delta": (
        Artifact(
            "io.delta",
            "delta-spark_4.2_2.13",
            "4.4.0",
            "27d4fd8b1f879535c573ed1c718177d6a27f24d3e626ba02e216369725721ead",
            9515916,
        ),
        Artifact(
            "io.delta",
            "delta-storage",
            "4.4.0",
            "c46735481fa8e326b0957be02b4420cbcab4b325bb08009b7f2045a95133f1cc",
            113863,
        ),
    ),
    "s3": (
        Artifact(
            "org.apache.hadoop",
            "hadoop-aws",
            HADOOP_AWS_VERSION,
            "66bd9eefb938b1a1657487324b63c13df2d8b17164a1dd24e0ef37b905bc5baa",
            938071,
        ),
        Artifact(
            "software.amazon.awssdk",
            "bundle",
            AWS_SDK_BUNDLE_VERSION,
            "db4b55f24ad1b4e70f17eb1717a4de76a8dadc5a27d764be7c44ff67b2c1c677",
            686119507,
        ),
        Artifact(
            "software.amazon.s3.analyticsaccelerator",
            "analyticsaccelerator-s3",
            S3_ANALYTICS_ACCELERATOR_VERSION,
            "4959a9747cbb479c73c3ffbcd479bee5b014f8b2880994585a8693fb9d24675e",
            2473459,
        ),
    ),
}
# Each kind's own directory setting, looked at before the caches (see cached_jars).
KIND_ENV = {
    "spark-kafka": "SPARKONCE_SPARK_KAFKA_JARS",
    "delta": "SPARKONCE_DELTA_JARS",
    "s3": S3_JARS_ENV,
}
# The connector's jars are recognised by this prefix, so that a directory holding another
# build of it (a cluster's own) is taken as it is.
CONNECTOR_JAR_PREFIX = "spark-sql-kafka-0-10_"
# What `sparkonce jars fetch` with no kind downloads: not the S3 jars (690 MB, only for
# s3a:// paths), which are fetched by name.
DEFAULT_KINDS = ("spark-kafka", "delta")


def user_jar_cache() -> Path:
    """Where ``sparkonce jars fetch`` puts the jars by default, and where a session looks
    after ``$SPARKONCE_JAR_CACHE``: ``$XDG_CACHE_HOME/sparkonce/jars``, else
    ``~/.cache/sparkonce/jars``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparkonce" / "jars"


def fetch_hint(kind: str) -> str:
    """How a user gets the jars of ``kind``, for an error that says they are missing."""
    kind_arg = "" if kind in DEFAULT_KINDS else f" {kind}"
    return (
        f"run `sparkonce jars fetch{kind_arg}` (it downloads them from Maven Central into "
        f"{user_jar_cache()}, where sessions find them), or `sparkonce jars fetch{kind_arg} "
        f"--dir DIR` and set {JAR_CACHE_ENV}=DIR; in a checkout, `make jars`"
    )


Progress = Callable[[Artifact, int], None]  # called with each downloaded chunk's size


def fetch_jars(
    kinds: Iterable[str] = DEFAULT_KINDS,
    dest: Path | str | None = None,
    *,
    repository: str = MAVEN_CENTRAL,
    progress: Progress | None = None,
) -> dict[str, list[Path]]:
    """Download the jars of ``kinds`` (keys of :data:`JAR_SETS`) into ``<dest>/<kind>/``
    (``dest`` defaults to :func:`user_jar_cache`) from ``repository`` (a Maven repository
    URL: Maven Central, or a mirror of it; ``file://`` works too). A jar already there with
    the pinned digest is kept; any other is downloaded to a temporary file, checked against
    its SHA-256 and size, and only then moved into place, so an interrupted or tampered
    download never looks complete. Returns each kind's jar paths.

    Raises :class:`ConfigError` for an unknown kind and :class:`JarFetchError` when a jar
    cannot be downloaded or is not the pinned one (nothing of it is kept)."""
    kinds = list(dict.fromkeys(kinds))
    unknown = [k for k in kinds if k not in JAR_SETS]
    if unknown:
        raise ConfigError(
            f"unknown jar kind {', '.join(map(repr, unknown))}: the kinds are {', '.join(JAR_SETS)}"
        )
    root = Path(dest) if dest is not None else user_jar_cache()
    out: dict[str, list[Path]] = {}
    for kind in kinds:
        directory = root / kind
        directory.mkdir(parents=True, exist_ok=True)
        out[kind] = [_fetch_one(a, directory, repository, progress) for a in JAR_SETS[kind]]
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch_one(
    artifact: Artifact, directory: Path, repository: str, progress: Progress | None
) -> Path:
    target = directory / artifact.file_name
    fetched = target.is_file() and target.stat().st_size == artifact.size
    if fetched and _sha256(target) == artifact.sha256:
        if progress is not None:
            progress(artifact, artifact.size)
        return target
    url = artifact.url(repository)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{artifact.file_name}.", dir=directory)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        size = 0
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            for block in iter(lambda: response.read(1 << 20), b""):
                out.write(block)
                digest.update(block)
                size += len(block)
                if progress is not None:
                    progress(artifact, len(block))
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != artifact.sha256 or size != artifact.size:
            raise JarFetchError(
                f"{url} is not the pinned {artifact.coordinate}: got {size} bytes with "
                f"SHA-256 {digest.hexdigest()}, expected {artifact.size} bytes with "
                f"{artifact.sha256}; nothing was kept. Check the repository (a mirror "
                "serving another build?) and try again"
            )
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)  # readable as a downloaded file is, not mkstemp's 0600
        tmp.replace(target)
        return target
    except (urllib.error.URLError, OSError) as exc:
        raise JarFetchError(
            f"could not download {artifact.coordinate} from {url}: {exc}. Check the network "
            "(or pass --repository with a reachable mirror of Maven Central) and try again"
        ) from exc
    finally:
        tmp.unlink(missing_ok=True)


def cached_jars(
    kind: str, env: str, *, names: tuple[str, ...] = (), required_prefix: str = ""
) -> list[str]:
    """The jars of one kind that ``scripts/fetch-jars.sh`` or ``sparkonce jars fetch``
    fetches: from the directory ``$<env>``, else ``<kind>/`` in ``$SPARKONCE_JAR_CACHE``,
    else in :func:`user_jar_cache`, else ``.cache/jars/<kind>`` of the sparkonce checkout (or
    of the working directory). The first directory that holds every one of ``names`` (or,
    without names, some jar whose name starts with ``required_prefix``) gives all its jars;
    empty if none does."""
    candidates: list[Path] = []
    if os.environ.get(env):
        candidates.append(Path(os.environ[env]))
    if os.environ.get(JAR_CACHE_ENV):
        candidates.append(Path(os.environ[JAR_CACHE_ENV]) / kind)
    candidates.append(user_jar_cache() / kind)
    here = Path(__file__).resolve()
    candidates += [p / ".cache" / "jars" / kind for p in here.parents]
    candidates.append(Path.cwd() / ".cache" / "jars" / kind)
    for d in candidates:
        if names:
            jars = [d / name for name in names]
            if all(j.is_file() for j in jars):
                return [str(j) for j in jars]
        elif d.is_dir():
            jars = sorted(d.glob("*.jar"))
            if any(j.name.startswith(required_prefix) for j in jars):
                return [str(j) for j in jars]
    return []


def find_jars(kind: str) -> list[str]:
    """The jars of ``kind`` (a key of :data:`JAR_SETS`) where :func:`cached_jars` finds them;
    empty when none are found."""
    if kind == "spark-kafka":
        return cached_jars(kind, KIND_ENV[kind], required_prefix=CONNECTOR_JAR_PREFIX)
    return cached_jars(kind, KIND_ENV[kind], names=tuple(a.file_name for a in JAR_SETS[kind]))


def pyspark_hadoop_version() -> str | None:
    """The Hadoop version of pyspark's own jars (from ``hadoop-client-api-<version>.jar``),
    or None if pyspark's jar directory has no such jar."""
    import pyspark

    for jar in (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"):
        return jar.name[len("hadoop-client-api-") : -len(".jar")]
    return None


def s3_jars() -> list[str]:
    """The jars that give Spark the ``s3a://`` filesystem: hadoop-aws, the AWS SDK v2 bundle
    and the S3 analytics accelerator, from ``$SPARKONCE_S3_JARS`` (a directory), else ``s3/``
    in ``$SPARKONCE_JAR_CACHE``, else ``.cache/jars/s3`` of the sparkonce checkout (where
    ``scripts/fetch-jars.sh`` puts them). They go on ``spark.jars`` when the session is
    created.

    Unlike the Delta and Kafka connector jars, a missing set is an error here rather than an
    empty list: s3a:// paths are named in settings (a checkpoint location), and without
    these jars Spark only fails later, deep in a query, with "No FileSystem for scheme s3a".
    Raises :class:`ConfigError` when they are missing, or when pyspark ships another Hadoop
    than hadoop-aws's (S3A calls Hadoop internals that change between releases, so a
    mismatch fails at class-loading time, far from its cause).
    """
    shipped = pyspark_hadoop_version()
    if shipped is not None and shipped != HADOOP_AWS_VERSION:
        raise ConfigError(
            f"pyspark ships Hadoop {shipped}, but sparkonce's s3a jars are for Hadoop "
            f"{HADOOP_AWS_VERSION} (hadoop-aws must match it exactly): set hadoop-aws.version "
            "and the AWS SDK bundle version hadoop-aws declares in jars/pom.xml and "
            "HADOOP_AWS_VERSION in sparkonce/spark/jars.py, then run scripts/fetch-jars.sh"
        )
    jars = cached_jars("s3", S3_JARS_ENV, names=S3_JARS)
    if not jars:
        raise ConfigError(
            f"the s3a jars ({', '.join(S3_JARS)}) were not found: {fetch_hint('s3')}; or set "
            f"{S3_JARS_ENV} to a directory holding them"
        )
    return jars
