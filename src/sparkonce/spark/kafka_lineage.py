"""Task keys of a Kafka sink's batch: a walk down Spark's RDD lineage, in the JVM.

:class:`~sparkonce.sinks.kafka.KafkaSink` recognises, on a replay, the tasks that already
committed by their task key, which must name the same input in the run that replays a
batch as in the run that planned it (see :mod:`sparkonce.sinks.kafka`). :func:`task_keys`
finds them on the driver, through py4j, from the batch DataFrame's RDD lineage. It is a JVM
adapter: it reads Spark's (and Spark's Kafka connector's) internal classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkonce.errors import SinkError
from sparkonce.jvm import java_frame

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

KAFKA_INPUT_PARTITION = "org.apache.spark.sql.kafka010.KafkaBatchInputPartition"


def task_keys(df: DataFrame, *, numbers_stable: bool = False) -> tuple[str, ...] | None:
    """The task key of each Spark partition of ``df``'s action, or None where the partition
    number is one (see the module docstring).

    A Spark Connect DataFrame has no JVM plan to walk. Its partition numbers serve as keys
    only when the caller knows they are stable (``numbers_stable``: the batch reads one of
    sparkonce's own sources, which plan their partitions in order); otherwise the batch is
    refused with :class:`SinkError` before anything is written, never keyed by numbers
    that a replay may change.

    Walks ``df``'s RDD lineage from the action's RDD along one-to-one dependencies. If it
    reaches the input of Spark's Kafka connector, task ``i`` reads that input's partition
    ``i``, and is keyed by its Kafka range: ``topic-partition``, with ``.k`` added when the
    connector split one Kafka partition into several ranges (``minPartitions``; ``k`` in
    offset order). If it reaches a shuffle or another source first, the numbers are stable.
    A lineage that merges or reorders the connector's partitions without a shuffle has no
    stable key, and is refused with :class:`SinkError`.
    """
    jdf = java_frame(df)
    if jdf is None and type(df).__module__.startswith("pyspark.sql.connect"):
        if numbers_stable:
            return None
        raise SinkError(
            "KafkaSink cannot name this batch's tasks on a Spark Connect session: the batch "
            "does not read one of sparkonce's own sources (the embedded log or KafkaSource), "
            "whose task numbers are stable, and a Connect DataFrame has no plan to walk for "
            "the input of Spark's Kafka connector. Read with KafkaSource, or run on a classic "
            "session. Nothing of this batch was written."
        )
    if jdf is None:  # no JVM plan: the protocol simulation's frames number tasks as given
        return None
    rdd = jdf.queryExecution().toRdd()
    while True:
        if rdd.getClass().getName().endswith(".DataSourceRDD"):
            return _kafka_range_keys(rdd)
        deps = rdd.dependencies()
        if deps.size() != 1 or not deps.head().getClass().getName().endswith(".OneToOneDependency"):
            break
        rdd = deps.head().rdd()
    # Not one-to-one: the numbers are stable unless the connector's input is reached
    # through narrow dependencies (a shuffle in between renumbers by hash buckets).
    if _reaches_connector_without_shuffle(rdd):
        raise SinkError(
            "KafkaSink cannot recognise this batch's tasks on a replay: its transform merges "
            "or reorders the partitions of Spark's Kafka connector (SparkKafkaSource) without "
            f"a shuffle ({rdd.getClass().getSimpleName()}: coalesce or union, say), and the "
            "connector can number them differently when it replays the batch. Use "
            "repartition(N) instead of coalesce(N), or read with KafkaSource, whose task "
            "numbers are stable. Nothing of this batch was written."
        )
    return None


def _kafka_range_keys(rdd: Any) -> tuple[str, ...] | None:
    # Spark 4.2's classes (pyspark is pinned): a DataSourceRDDPartition holds an
    # Option[InputPartition]; the connector's is a KafkaBatchInputPartition with its
    # KafkaOffsetRange. tests/kafka/test_spark_kafka_source.py checks the keys against the
    # rows each task holds, so a Spark that changes them fails there.
    ranges: list[tuple[str, int, int]] = []
    for part in rdd.partitions():
        found = part.inputPartition()
        ip = found.get() if found.getClass().getName() == "scala.Some" else None
        if ip is None or ip.getClass().getName() != KAFKA_INPUT_PARTITION:
            return None  # another source (sparkonce's own plan their partitions in order)
        r = ip.offsetRange()
        tp = r.topicPartition()
        ranges.append((tp.topic(), int(tp.partition()), int(r.fromOffset())))
    split: dict[tuple[str, int], list[int]] = {}
    for topic, partition, start in ranges:
        split.setdefault((topic, partition), []).append(start)
    keys = []
    for topic, partition, start in ranges:
        starts = sorted(split[(topic, partition)])
        suffix = f".{starts.index(start)}" if len(starts) > 1 else ""
        keys.append(f"{topic}-{partition}{suffix}")
    return tuple(keys)


def _reaches_connector_without_shuffle(rdd: Any) -> bool:
    todo, seen = [rdd], set()
    while todo:
        node = todo.pop()
        if int(node.id()) in seen:
            continue
        seen.add(int(node.id()))
        if node.getClass().getName().endswith(".DataSourceRDD"):
            if _kafka_range_keys(node) is not None:
                return True
            continue
        deps = node.dependencies()
        for i in range(deps.size()):
            dep = deps.apply(i)
            if not dep.getClass().getName().endswith(".ShuffleDependency"):
                todo.append(dep.rdd())
    return False
