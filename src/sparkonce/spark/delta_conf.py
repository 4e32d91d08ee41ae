"""What a Spark session needs to read or write Delta Lake tables: the pinned Delta jars, its
SQL extension and catalog, and the check that they are built for the installed PySpark.

Shared by :class:`~sparkonce.sinks.delta.DeltaSink` and
:class:`~sparkonce.sources.delta.DeltaSource` (a source never imports a sink, so this lives
below both). :func:`sparkonce.build_session` applies :func:`delta_spark_conf` for a pipeline
that reads or writes Delta.
"""

from __future__ import annotations

from sparkonce.errors import ConfigError
from sparkonce.spark.jars import JAR_SETS, find_jars

DELTA_VERSION = "4.4.0"  # jars/pom.xml pins the same
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
DELTA_JARS = tuple(a.file_name for a in JAR_SETS["delta"])


#: The Spark minor version Delta DELTA_VERSION is built for (the ``_4.2`` in its artifact).
#: No Delta release for Spark 4.3 was on Maven Central (io/delta/delta-spark_4.3_2.13) on
#: 2026-11-28, so a PySpark 4.3 session is refused before the epoch.
DELTA_SPARK = "4.2"


def check_delta_supports(spark_version: str, who: str = "DeltaSink") -> None:
    """Raise :class:`ConfigError` when the Delta jars sparkonce uses are not built for
    ``spark_version`` (PySpark's ``__version__``); ``who`` names what needs them."""
    if ".".join(spark_version.split(".")[:2]) != DELTA_SPARK:
        raise ConfigError(
            f"{who}: PySpark {spark_version} is installed, but Delta {DELTA_VERSION} "
            f"(the release sparkonce uses) is built for Spark {DELTA_SPARK} and there is no "
            f"Delta release for Spark {spark_version} yet. Install pyspark~={DELTA_SPARK}.0 "
            "to read or write Delta tables, or leave Delta out with this PySpark."
        )


def delta_jars() -> list[str]:
    """The Delta jars: ``$SPARKONCE_DELTA_JARS`` (a directory), else ``delta/`` in
    ``$SPARKONCE_JAR_CACHE``, else ``.cache/jars/delta`` of the sparkonce checkout (where
    ``scripts/fetch-jars.sh`` puts them). Empty if none holds both."""
    return find_jars("delta")


def delta_spark_conf(who: str = "DeltaSink") -> dict[str, str]:
    """What a session needs for Delta: the jars (when found) and Delta's extension and
    catalog. :func:`sparkonce.build_session` applies it for a pipeline that reads or writes Delta.
    Refused (:func:`check_delta_supports`) on a PySpark those jars are not built for, before
    any session loads Delta's extension."""
    import pyspark

    check_delta_supports(pyspark.__version__, who)
    conf = {
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
    }
    jars = delta_jars()
    if jars:
        conf["spark.jars"] = ",".join(jars)
    return conf
