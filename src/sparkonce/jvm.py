"""The one place that reaches into PySpark's py4j bridge: classic sessions only.

A classic ``SparkSession`` lives beside a JVM in this process, and PySpark's private
handles (``_jvm``, ``_jsparkSession``, ``_jsc``, a DataFrame's ``_jdf``, ``sparkContext``)
reach Spark's Java objects through py4j. A Spark Connect session has none of them: its
Spark runs in a server. Every other module asks here, and each function returns ``None``
when the session or DataFrame has no JVM, so that each caller must say what it does on
Connect: take a route that works in both modes, or refuse before the run takes its epoch.

Who uses what, and their Connect route:

* the plan checks (:mod:`sparkonce.pipeline.plan`): :func:`analyzed_plan`; on Connect they
  read the plan's text;
* Spark's output-mode check before the epoch (:mod:`sparkonce.pipeline.query`):
  :func:`jvm` and :func:`analyzed_plan`; on Connect the server checks when the query
  starts, before its first batch;
* the scans counted for progress (:mod:`sparkonce.observe.base`): :func:`analyzed_plan`;
* ``KafkaSink``'s task keys (:mod:`sparkonce.spark.kafka_lineage`): :func:`java_frame`; on
  Connect, stable partition numbers or a refused batch;
* quieting Spark's log of a failed query (:mod:`sparkonce.spark.session`): :func:`jvm`;
* ``sparkonce.foreach_batch`` (:mod:`sparkonce.pipeline.foreach_batch`):
  :func:`streaming_query_id` and :func:`running_query`, to find the user's query that calls
  it; on Connect it refuses (the function runs beside the server);
* the listing of a session's jars in an error message, and PySpark's accumulator server
  (:func:`spark_jars`, :func:`accumulator_server`);
* Hadoop's filesystems (:mod:`sparkonce.files`) and Delta's internals
  (:mod:`sparkonce.spark.delta`): :func:`jvm`, :func:`hadoop_conf`,
  :func:`java_session`, :func:`java_frame`.

Nothing here imports the rest of sparkonce: it sits at the bottom of the layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession


def jvm(spark: SparkSession | object) -> Any | None:
    """The py4j gateway's view of the driver JVM (``spark._jvm``); None on Connect."""
    return getattr(spark, "_jvm", None)


def java_session(spark: SparkSession) -> Any | None:
    """The JVM's ``SparkSession`` (``spark._jsparkSession``); None on Connect."""
    return getattr(spark, "_jsparkSession", None)


def hadoop_conf(spark: SparkSession) -> Any | None:
    """The session's Hadoop ``Configuration`` in the JVM; None on Connect."""
    jsc = getattr(spark, "_jsc", None)
    return None if jsc is None else jsc.hadoopConfiguration()


def java_frame(df: DataFrame) -> Any | None:
    """The JVM's ``Dataset`` behind ``df`` (``df._jdf``); None for a Connect DataFrame (and
    for the protocol simulation's stand-in frames)."""
    return getattr(df, "_jdf", None)


def analyzed_plan(df: DataFrame) -> Any | None:
    """The analyzed logical plan of ``df``, a JVM object; None without a JVM."""
    jdf = java_frame(df)
    return None if jdf is None else jdf.queryExecution().analyzed()


def spark_context(spark: SparkSession | object) -> Any | None:
    """The session's ``SparkContext`` (its Python side); None on Connect, where the
    property raises."""
    if jvm(spark) is None:
        return None
    return getattr(spark, "sparkContext", None)


def spark_jars(spark: SparkSession) -> str | None:
    """The session's ``spark.jars`` as the driver's SparkConf holds it; None on Connect
    (the server's jars are not this process's to list)."""
    context = spark_context(spark)
    return None if context is None else str(context.getConf().get("spark.jars", "") or "")


def accumulator_server(spark: SparkSession | object) -> Any | None:
    """PySpark's accumulator server of the session's context; None on Connect."""
    context = spark_context(spark)
    return None if context is None else getattr(context, "_accumulatorServer", None)


def set_log_level(spark: SparkSession, level: str) -> bool:
    """Set the driver JVM's log level; False (nothing done) on Connect, where the server's
    own logging applies."""
    context = spark_context(spark)
    if context is None:
        return False
    context.setLogLevel(level)
    return True


#: The local property Spark's stream thread sets to its query's id (``StreamExecution``),
#: which a ``foreachBatch`` function, called from that thread, reads.
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def streaming_query_id(spark: SparkSession) -> str | None:
    """The id of the streaming query whose ``foreachBatch`` function calls this, read on the
    query's own thread; None outside one (or on Connect)."""
    context = spark_context(spark)
    if context is None:
        return None
    value = context.getLocalProperty(QUERY_ID_PROPERTY)
    return str(value) if value else None


def running_query(spark: SparkSession, query_id: str) -> Any | None:
    """The driver's ``StreamExecution`` of the active query ``query_id`` (its analyzed plan,
    run id, checkpoint root and output mode), from the map every session of the JVM shares:
    a batch's DataFrame is on a clone of the user's session, whose ``streams`` lists
    nothing. None when no such query is active (or on Connect)."""
    gateway, session = jvm(spark), java_session(spark)
    if gateway is None or session is None:
        return None
    active = session.sharedState().activeStreamingQueries()
    return active.get(gateway.java.util.UUID.fromString(query_id))
