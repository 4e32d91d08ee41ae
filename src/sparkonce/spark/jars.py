"""Where sparkonce finds the jars ``scripts/fetch-jars.sh`` fetches (the connectors a session
needs for Delta, Kafka and ``s3a://``), and the versions it pins."""

from __future__ import annotations

import os
from pathlib import Path

from sparkonce.errors import ConfigError

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


def cached_jars(
    kind: str, env: str, *, names: tuple[str, ...] = (), required_prefix: str = ""
) -> list[str]:
    """The jars of one kind that ``scripts/fetch-jars.sh`` fetches: from the directory
    ``$<env>``, else ``<kind>/`` in ``$SPARKONCE_JAR_CACHE``, else ``.cache/jars/<kind>`` of
    the sparkonce checkout (or of the working directory). The first directory that holds
    every one of ``names`` (or, without names, some jar whose name starts with
    ``required_prefix``) gives all its jars; empty if none does."""
    candidates: list[Path] = []
    if os.environ.get(env):
        candidates.append(Path(os.environ[env]))
    if os.environ.get("SPARKONCE_JAR_CACHE"):
        candidates.append(Path(os.environ["SPARKONCE_JAR_CACHE"]) / kind)
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
            f"the s3a jars ({', '.join(S3_JARS)}) were not found: run scripts/fetch-jars.sh "
            f"(make jars), or set {S3_JARS_ENV} to a directory holding them"
        )
    return jars
