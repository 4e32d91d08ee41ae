"""Building a SparkSession suited to sparkonce pipelines (used by the CLI and tests), and the
session settings that parts of a pipeline need (:func:`merge_spark_conf`,
:func:`filesystem_conf`).

Library code never creates a session by itself: ``Pipeline.run`` takes one.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sparkonce.files import FETCHED_SCHEMES, scheme
from sparkonce.jvm import jvm as java_gateway
from sparkonce.jvm import set_log_level
from sparkonce.spark.jars import S3_JARS, S3_JARS_ENV, cached_jars

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# For short-lived drivers (verify trials, crash tests, demos): the C1 JIT only and the
# serial collector. A failure-free run of a small stateful pipeline then costs about a
# quarter less CPU (55 -> 40 CPU-seconds on 2 cores). Long-running jobs should keep the
# default C2 JIT, which pays off after warm-up.
QUICK_START_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def build_session(
    master: str = "local[2]",
    app_name: str = "sparkonce",
    shuffle_partitions: int = 2,
    jars: list[str] | None = None,
    quick_start: bool = False,
    log_file: str | Path | None = None,
    conf: Mapping[str, str] | None = None,
    remote: str | None = None,
) -> SparkSession:
    """A session with RocksDB state (changelog checkpointing) and few shuffle partitions.

    Sets ``PYSPARK_PYTHON`` to this interpreter first, so Python workers use the
    same virtualenv as the driver. ``jars`` go to ``spark.jars`` (for example Spark's
    own Kafka connector, fetched by ``scripts/fetch-jars.sh``); they only take
    effect when this call creates the session. ``quick_start`` starts the driver's
    JVM with :data:`QUICK_START_JAVA_OPTIONS`, for short runs; it changes timing
    only, never results. ``log_file`` sends the JVM's own log (Spark's warnings and
    errors, with their Java stacks) to that file instead of the terminal. ``conf``
    adds settings, such as :meth:`Pipeline.spark_conf` (a Delta Lake sink's jars,
    extension and catalog); its ``spark.jars`` is joined with ``jars``, and its
    ``spark.driver.extraJavaOptions`` follows the ones set here. The driver's JVM maps the
    machine's class-data archive when there is one (:mod:`sparkonce.spark.classdata`).

    ``remote`` (``sc://HOST:PORT``) makes a Spark Connect session instead, as
    ``SparkSession.builder.remote`` does: no JVM here, and the server's own settings and
    jars apply (``master``, ``jars``, ``quick_start``, ``log_file`` and the JVM settings of
    ``conf`` are the server's business, so they are not sent). ``remote="local[N]"`` starts
    that server here first (:func:`_local_connect_server`): the session above, with every
    setting given, serves Spark Connect, and the session returned is its client.
    """
    if remote is not None and not remote.startswith("local"):
        return connect_session(remote, app_name, shuffle_partitions)
    if remote is not None:
        master = "local[2]" if remote == "local" else remote
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    java_options = "-Dlog4j2.level=warn"
    if log_file is not None:
        java_options += f" -Dlog4j2.configurationFile={_log4j_config(Path(log_file))}"
    if quick_start:
        java_options += " " + QUICK_START_JAVA_OPTIONS
    from sparkonce.faults import worker_fault_conf
    from sparkonce.spark import classdata

    java_options = " ".join(filter(None, [java_options, classdata.java_options()]))
    builder = SparkSession.builder
    extra = {**worker_fault_conf(), **(conf or {})}
    # The caller's own driver options come last, so that they win where they conflict.
    java_options = " ".join(
        filter(None, [java_options, extra.pop("spark.driver.extraJavaOptions", "")])
    )
    all_jars = list(jars or []) + [j for j in extra.pop("spark.jars", "").split(",") if j]
    if all_jars:
        # The session's spark.jars replaces the one of spark-defaults.conf (a cluster's
        # connectors, say): keep those too, first.
        all_jars = [*defaults_jars(), *all_jars]
        builder = builder.config("spark.jars", ",".join(dict.fromkeys(all_jars)))
    if "DeltaSparkSessionExtension" in extra.get("spark.sql.extensions", ""):
        # Delta rebuilds a table's state (at checkpoints, and for MERGE's txn check) in
        # 50 partitions by default, sized for clusters; a few-core session wants few.
        extra.setdefault("spark.databricks.delta.snapshotPartitions", str(shuffle_partitions))
    server_port = None
    if remote is not None:
        server_port, server_conf = _local_server_conf()
        extra.update(server_conf)
    for key, value in extra.items():
        builder = builder.config(key, value)
    spark = (
        builder.master(master)
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", java_options)
        .getOrCreate()
    )
    set_log_level(spark, "ERROR")
    if server_port is not None:
        return _local_connect_client(server_port, app_name, shuffle_partitions)
    return spark


def _local_server_conf() -> tuple[int, dict[str, str]]:
    """A free port, and the settings that make the session about to start a Spark Connect
    server on it (Spark's plugin, from the installed PySpark's jars).

    PySpark's own ``SparkSession.builder.remote("local[N]")`` serves on the fixed port
    15002 and passes on none of sparkonce's settings (a sink's jars, quick start, the log
    file). Two such runs on one machine (a paused zombie and the newer run of
    ``sparkonce verify``, say) would meet on that port, the second as a client of the first
    one's server. Here each run gets its own server, bound to the loopback interface only and
    asking for a token that only this process knows (``SPARK_CONNECT_AUTHENTICATE_TOKEN``,
    which PySpark's client reads)."""
    import socket
    import uuid

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    os.environ.setdefault("SPARK_CONNECT_AUTHENTICATE_TOKEN", str(uuid.uuid4()))
    return port, {
        "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
    }


def _local_connect_client(port: int, app_name: str, shuffle_partitions: int) -> SparkSession:
    """The Connect client of the server :func:`_local_server_conf` set up in this process.

    PySpark's classic builder refuses a remote session once a SparkContext exists here, so
    the Connect builder is used directly; ``SPARK_CONNECT_MODE_ENABLED`` (set as PySpark
    sets it for its own local server) makes ``pyspark.sql.functions`` build Connect
    columns, as a pipeline's transform on this session needs."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    builder: Any = ConnectSession.builder
    spark: Any = (
        builder.remote(f"sc://localhost:{port}")
        .appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .getOrCreate()
    )
    _bound_retries(spark)
    return cast("SparkSession", spark)


def connect_session(remote: str, app_name: str, shuffle_partitions: int = 2) -> SparkSession:
    """A Spark Connect session of the server at ``remote`` (see :func:`build_session`),
    with the session settings sparkonce's pipelines expect (UTC times, few shuffle
    partitions for a ``local`` server)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(remote).appName(app_name)
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    if remote.startswith("local"):
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    spark = builder.getOrCreate()
    _bound_retries(spark)
    return spark


#: How long (about) ``sparkonce run --remote`` keeps retrying a Spark Connect server that
#: stopped answering before it stops with exit 4. PySpark's own default tolerates at least
#: 10 minutes, which serves a batch job waiting out a server restart; a streaming query
#: does not survive its server, so a run has nothing to wait for.
SERVER_RETRY_S = 30


def _bound_retries(spark: SparkSession) -> None:
    """Give the session's client a retry policy that gives up after about
    :data:`SERVER_RETRY_S` of an unreachable server (sessions sparkonce builds only; a
    user's own session keeps its own policy)."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    client: Any = getattr(spark, "client", None)
    if client is None or not hasattr(client, "set_retry_policies"):
        return
    # Waits of 0.25, 0.5, 1, 2, 4, 8 and 8 s (plus jitter): about 24 s, then one more try.
    client.set_retry_policies(
        [
            DefaultPolicy(
                max_retries=7, backoff_multiplier=2.0, initial_backoff=250, max_backoff=8000
            )
        ]
    )


def is_connect(spark: object) -> bool:
    """Whether ``spark`` is a Spark Connect session (``SparkSession.builder.remote(...)``,
    ``spark.api.mode=connect``, the thin ``pyspark-client``): a client of a Spark server,
    with no JVM in this process (none of the py4j handles :mod:`sparkonce.jvm` reads).
    Decided by the session's class, so it imports nothing of Connect."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def defaults_jars(env: Mapping[str, str] | None = None) -> list[str]:
    """The ``spark.jars`` of the ``spark-defaults.conf`` that ``spark-submit`` reads when
    PySpark starts the driver's JVM (in ``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``, else
    the conf directory of the installed PySpark). Empty when there is none."""
    env = os.environ if env is None else env
    if env.get("SPARK_CONF_DIR"):
        conf_dir = Path(env["SPARK_CONF_DIR"])
    elif env.get("SPARK_HOME"):
        conf_dir = Path(env["SPARK_HOME"]) / "conf"
    else:
        import pyspark

        conf_dir = Path(pyspark.__file__).parent / "conf"
    try:
        text = (conf_dir / "spark-defaults.conf").read_text()
    except OSError:
        return []
    value = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        # A Java properties line: the key ends at whitespace, "=" or ":".
        found = re.match(r"([^\s=:]+)\s*[=:]?\s*(.*)$", line)
        if found and found.group(1) == "spark.jars":
            value = found.group(2)  # the last one wins
    return [j.strip() for j in value.split(",") if j.strip()]


def _log4j_config(log_file: Path) -> Path:
    """A log4j2 configuration that writes the JVM's log to ``log_file`` and nothing else."""
    log_file = log_file.resolve()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    config = log_file.with_name(log_file.name + ".log4j2.properties")
    config.write_text(
        "status = error\n"
        "appender.file.type = File\n"
        "appender.file.name = file\n"
        f"appender.file.fileName = {log_file}\n"
        "appender.file.append = true\n"
        "appender.file.layout.type = PatternLayout\n"
        "appender.file.layout.pattern = %d{ISO8601} %p %c: %m%n%ex\n"
        "rootLogger.level = warn\n"
        "rootLogger.appenderRef.file.ref = file\n"
    )
    return config


def merge_spark_conf(*confs: Mapping[str, str]) -> dict[str, str]:
    """Settings from several parts of a pipeline in one: ``spark.jars`` lists are joined
    (each jar once), any other key takes the last value."""
    out: dict[str, str] = {}
    for conf in confs:
        for key, value in conf.items():
            if key == "spark.jars" and out.get(key):
                value = ",".join(dict.fromkeys(out[key].split(",") + value.split(",")))
            out[key] = value
    return out


def filesystem_conf(loc: str) -> dict[str, str]:
    """Session settings that reaching ``loc`` needs: for ``s3a://``, the ``hadoop-aws``
    jars ``scripts/fetch-jars.sh`` fetched (when found; ``$SPARKONCE_S3_JARS`` names another
    directory). Nothing for other locations: their connector is the cluster's business,
    as it is Spark's."""
    kind = FETCHED_SCHEMES.get(scheme(loc))
    if kind is None:
        return {}
    jars = cached_jars(kind, S3_JARS_ENV, names=S3_JARS)
    return {"spark.jars": ",".join(jars)} if jars else {}


# The loggers under which Spark's streaming query logs "Query ... terminated with error",
# with the whole Java stack (the class of the query's execution; Spark 4 moved it).
QUERY_ERROR_LOGGERS = (
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
    "org.apache.spark.sql.execution.streaming.MicroBatchExecution",
)


@contextmanager
def quiet_query_errors(spark: SparkSession) -> Iterator[None]:
    """While the block runs, keep the query's "terminated with error" record, and its Java
    stack, off a session that logs to the console with Spark's default log4j profile (a
    session of the user's own, in library use): the run raises the error itself, as one
    sparkonce error that names the cause (a fenced run: ``FencedError``; a failed batch:
    an error whose ``__cause__`` is Spark's exception, Java stack included).

    A JVM whose log4j configuration was chosen (``log4j2.configurationFile``: ``sparkonce
    run``'s log file, or the user's own set-up) is left alone, as is everything else Spark
    logs. The loggers' levels are restored when the block ends.
    """
    try:
        jvm: Any = java_gateway(spark)
        chosen = jvm.java.lang.System.getProperty("log4j2.configurationFile")
    except Exception:  # no JVM to look at: nothing to quiet
        chosen = "unknown"
    if chosen:
        yield
        return
    log4j = jvm.org.apache.logging.log4j
    context = log4j.LogManager.getContext(False)
    config = context.getConfiguration()
    before = {}
    for name in QUERY_ERROR_LOGGERS:
        own = config.getLoggers().get(name)
        before[name] = None if own is None else own.getLevel()
        log4j.core.config.Configurator.setLevel(name, log4j.Level.OFF)
    try:
        yield
    finally:
        config = context.getConfiguration()
        for name, level in before.items():
            if level is None:
                config.removeLogger(name)
            else:
                config.getLoggerConfig(name).setLevel(level)
        context.updateLoggers()
