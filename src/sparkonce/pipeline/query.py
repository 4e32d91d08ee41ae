"""Building a pipeline's query: the transform's outputs over the source, checked before
anything starts (the pipeline's own streaming source or sources, no other; Spark's own checks of the
output mode; ``stateful=False`` against the plan), and several outputs folded into one
DataFrame.

Used by the runner (:mod:`sparkonce.pipeline.runner`) and by :meth:`Pipeline.explain`
(:mod:`sparkonce.pipeline.explain`); it starts nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sparkonce.errors import ConfigError, SparkOnceError
from sparkonce.jvm import analyzed_plan, jvm
from sparkonce.outputs.output_set import SINGLE_OUTPUT, OutputSet
from sparkonce.pipeline.failure import short_error
from sparkonce.pipeline.plan import has_watermark, plan_facts, stateful_operators, streaming_sources

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from sparkonce.offsets import TopicPartition
    from sparkonce.pipeline.spec import PipelineSpec
    from sparkonce.sources.base import Source

log = logging.getLogger("sparkonce.run")


def output_query(
    pipeline: PipelineSpec, spark: SparkSession, start: dict[TopicPartition, int]
) -> DataFrame:
    """The transform's streaming output over the source, starting at ``start`` (or fresh),
    as the one DataFrame the query runs (several outputs folded into one)."""
    outs = transform_outputs(pipeline, spark, start)
    outputs = pipeline.output_set
    if outputs is None:
        return outs[SINGLE_OUTPUT]
    return _combined(outputs, outs)


def transform_outputs(
    pipeline: PipelineSpec, spark: SparkSession, start: Mapping[TopicPartition, int] | None = None
) -> dict[str, DataFrame]:
    """The transform's streaming DataFrames by output name over the source (a pipeline with
    one sink: ``{"output": df}``), checked against the pipeline's outputs. Starts nothing.

    A plan with an event-time watermark reads a source with read limits through
    :meth:`~sparkonce.sources.base.Source.aligned` (the limits then cap each batch as a
    whole, shared out in proportion to each partition's backlog), and says so in a warning.
    """
    outs = _transform_over(pipeline, pipeline.source, spark, start)
    aligned = aligned_source(pipeline.source, outs.values())
    if aligned is not None:
        log.warning("pipeline %s: %s", pipeline.name, aligned_reads(pipeline.source))
        outs = _transform_over(pipeline, aligned, spark, start)
    return outs


def aligned_source(source: Source, frames: Iterable[DataFrame]) -> Source | None:
    """The source a query over ``frames`` (the transform's outputs over ``source``) must read
    instead of ``source``: its :meth:`~sparkonce.sources.base.Source.aligned` twin when the
    plan has an event-time watermark, else None (read ``source`` as it is). Driver.

    The one rule for how a query's input is cut into batches: the runner applies it, and so
    does verify's reference run (:func:`sparkonce.verify.reference.record`), since a
    watermarked stateful query's output depends on where batch boundaries fall.
    """
    aligned = source.aligned()
    if aligned is None or not any(has_watermark(df) for df in frames):
        return None
    return aligned


def aligned_reads(source: Source) -> str:
    """What the read limits of ``source`` do in a query with an event-time watermark (with
    several sources, each source's limits cap that source's part of the batch)."""
    from sparkonce.sources.source_set import SourceSet

    limits = source.read_limits()
    shown = ", ".join(f"{k}={v}" for k, v in limits.items())
    if isinstance(source, SourceSet):
        budget = "; ".join(
            f"{name}: {_budget(member.read_limits())}"
            for name, member in source.sources.items()
            if member.read_limits()
        )
        budget = f"per source ({budget})"
    else:
        budget = _budget(limits)
    return (
        f"the plan has an event-time watermark and the source has read limits ({shown}): a "
        "limit per partition would let a partition with little unread run ahead in event "
        "time of another's unread records, and the watermark would pass them (on-time "
        "records dropped or routed as late). Each batch reads instead at most "
        f"{budget} records in all (plus one per partition), shared out in proportion to "
        "each partition's unread backlog, so every partition reads the same fraction of it. "
        "This aligns partitions on offsets, not on event times: a partition whose records "
        "bunch in event time can still fall behind"
    )


def _budget(limits: Mapping[str, int]) -> str:
    per = limits.get("max_records_per_partition")
    total = limits.get("max_records_per_batch")
    if per and total:
        return f"the smaller of {per} times the number of partitions and {total}"
    return f"{per} times the number of partitions" if per else str(total)


def _transform_over(
    pipeline: PipelineSpec,
    source: Source,
    spark: SparkSession,
    start: Mapping[TopicPartition, int] | None,
) -> dict[str, DataFrame]:
    from pyspark.sql import DataFrame

    from sparkonce.sources.source_set import SourceSet

    inputs: dict[str, DataFrame] | None = None
    if isinstance(source, SourceSet):
        inputs = source.streams(spark, start or None)
        own = list(inputs.values())
        arg: Any = inputs
    else:
        stream = source.stream(spark, start or None)
        own, arg = [stream], stream
    try:
        out = pipeline.transform(arg)
    except SparkOnceError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"pipeline {pipeline.name!r}: the transform failed while building the query: "
            f"{short_error(exc)}. Fix the transform; nothing was changed (no epoch was taken)."
        ) from exc
    outputs = pipeline.output_set
    if outputs is None:
        if isinstance(out, Mapping):
            raise ConfigError(
                f"pipeline {pipeline.name!r}: the transform returned several outputs "
                f"({list(out)}) but the pipeline has one sink; declare them with "
                "Pipeline(outputs={name: sink, ...})"
            )
        if not isinstance(out, DataFrame) or not out.isStreaming:
            raise ConfigError(
                f"pipeline {pipeline.name!r}: transform must return the streaming DataFrame "
                f"derived from its input, got {type(out).__name__}"
            )
        _check_sources(pipeline, own, {SINGLE_OUTPUT: out}, inputs)
        return {SINGLE_OUTPUT: out}
    if outputs.single and isinstance(out, DataFrame):
        out = {outputs.names[0]: out}
    if not isinstance(out, Mapping):
        raise ConfigError(
            f"pipeline {pipeline.name!r}: with outputs={list(outputs.names)} the transform must "
            f"return {{name: DataFrame}} with one streaming DataFrame per output, got "
            f"{type(out).__name__}"
        )
    missing = [n for n in outputs.names if n not in out]
    extra = [n for n in out if n not in outputs.outputs]
    if missing or extra:
        raise ConfigError(
            f"pipeline {pipeline.name!r}: the transform returned outputs {list(out)}, but the "
            f"pipeline declares {list(outputs.names)}"
            + (f"; missing: {missing}" if missing else "")
            + (f"; not declared: {extra}" if extra else "")
        )
    for name in outputs.names:
        df = out[name]
        if not isinstance(df, DataFrame) or not df.isStreaming:
            raise ConfigError(
                f"pipeline {pipeline.name!r}: output {name!r} must be a streaming DataFrame "
                f"derived from the transform's input, got {type(df).__name__}"
            )
    frames = {name: out[name] for name in outputs.names}
    _check_sources(pipeline, own, frames, inputs)
    return frames


def _check_sources(
    pipeline: PipelineSpec,
    streams: list[DataFrame],
    frames: Mapping[str, DataFrame],
    inputs: Mapping[str, DataFrame] | None = None,
) -> None:
    """Refuse a transform whose query reads another streaming source than the pipeline's:
    each batch must be one set of the source's offset ranges, recorded in the ledger. With
    several sources (``inputs``, by name), refuse one the query does not read: Spark would
    log no offsets for it, and its name in the pipeline would promise what is not done."""
    own = {s for stream in streams for s in streaming_sources(stream)}
    if inputs is not None:
        read = {s for df in frames.values() for s in streaming_sources(df)}
        unread = [n for n, df in inputs.items() if not set(streaming_sources(df)) & read]
        if unread:
            raise ConfigError(
                f"pipeline {pipeline.name!r}: the transform's query does not read source(s) "
                f"{unread} of sources={list(inputs)}. Use every source the pipeline declares "
                "(a join of them, say), or leave the unused one out. Nothing was changed (no "
                "epoch was taken)."
            )
    for name, df in frames.items():
        found = streaming_sources(df)
        extra = list(dict.fromkeys(s for s in found if s not in own))
        if not extra and found:
            continue
        where = "" if name == SINGLE_OUTPUT else f" (output {name!r})"
        mine = ", ".join(s.describe() for s in own) or pipeline.source.describe()
        if extra:
            what = (
                f"reads {len(extra)} streaming source(s) besides the pipeline's own "
                f"({mine}): {'; '.join(s.describe() for s in extra)}"
            )
        else:
            what = f"does not read the pipeline's source ({mine})"
        raise ConfigError(
            f"pipeline {pipeline.name!r}: the transform's query{where} {what}. A sparkonce "
            "pipeline reads only its own streaming sources, so that each batch is one set of "
            "their offset ranges, recorded in the ledger. Operator action: join other data "
            "as a static table (spark.read instead of spark.readStream), declare the other "
            "stream in Pipeline(sources={name: source, ...}), or give it a pipeline of its "
            "own. Nothing was changed (no epoch was taken)."
        )


def check_query(pipeline: PipelineSpec, spark: SparkSession, out: DataFrame) -> None:
    """Spark's checks of the query that would otherwise run only when it starts (after the
    epoch), and ``stateful=False`` against the plan's state operators."""
    # A Spark Connect session has no JVM here: its server makes these checks when the query
    # starts, and a query it refuses fails before its first batch (nothing is written).
    checked = str(spark.conf.get("spark.sql.streaming.unsupportedOperationCheck", "true"))
    gateway, plan = jvm(spark), analyzed_plan(out)
    if checked != "false" and gateway is not None and plan is not None:
        modes = gateway.org.apache.spark.sql.streaming.OutputMode
        mode = {"append": modes.Append, "update": modes.Update, "complete": modes.Complete}
        checker = gateway.org.apache.spark.sql.catalyst.analysis.UnsupportedOperationChecker
        try:
            checker.checkForStreaming(plan, mode[pipeline.output_mode]())
        except Exception as exc:
            raise ConfigError(
                f"pipeline {pipeline.name!r}: Spark does not support this query with "
                f"output_mode={pipeline.output_mode!r}: {short_error(exc)}. Fix the transform or "
                "the output mode; nothing was changed (no epoch was taken)."
            ) from None
    check_state_messages(pipeline, out)
    if pipeline.stateful is False:
        facts = plan_facts(out)
        if facts.stateful:
            raise ConfigError(
                f"pipeline {pipeline.name!r}: stateful=False, but the query keeps state across "
                f"batches in Spark's checkpoint: {stateful_operators(facts)}. Started without "
                "that state (an empty checkpoint), it would silently restart it: "
                "deduplication would let duplicates through and aggregates would start again "
                "from zero. Operator action: remove stateful=False; if the checkpoint was "
                "lost, restore it. Nothing was changed (no epoch was taken)."
            )


# Spark's transformWithStateInPandas operators and the protobuf messages their Python
# workers exchange with the state server, generated into pyspark by protoc.
_STATE_SERVER_NODES = ("TransformWithStateInPySpark", "TransformWithStateInPandas")
_STATE_MESSAGES = "pyspark.sql.streaming.proto.StateMessage_pb2"


def check_state_messages(pipeline: PipelineSpec, out: DataFrame) -> None:
    """Refuse, before the epoch, a query whose ``transformWithStateInPandas`` workers could
    not load PySpark's state-server messages: with a protobuf runtime older than the code
    PySpark generated, each worker dies at its first batch with no word of why."""
    import importlib

    try:
        importlib.import_module(_STATE_MESSAGES)
        return
    except Exception as exc:  # protobuf's VersionError, or an ImportError
        why = short_error(exc)
    used = [n for n in plan_facts(out).stateful if n in _STATE_SERVER_NODES]
    if used:
        raise ConfigError(
            f"pipeline {pipeline.name!r}: the query uses transformWithStateInPandas "
            f"({', '.join(used)}), whose Python workers cannot load PySpark's state "
            f"messages here ({why.rstrip('.')}). Install a protobuf that PySpark accepts: "
            'pip install "protobuf>=6.33.5,<7". Nothing was changed (no epoch was taken).'
        )


def _combined(outputs: OutputSet, out: Mapping[str, DataFrame]) -> DataFrame:
    """The transform's named outputs folded into one streaming DataFrame (one query)."""
    from sparkonce.outputs.combine import combine

    # Outputs given the same DataFrame object share one branch of the query: Spark would
    # otherwise evaluate it once per branch, with other values of rand(), uuid()...
    branches: dict[str, DataFrame] = {}
    aliases: dict[str, str] = {}
    for name in outputs.names:
        same = next((b for b, df in branches.items() if df is out[name]), None)
        if same is None:
            branches[name] = out[name]
        else:
            aliases[name] = same
    combined, layout = combine(branches)
    outputs.use_layout(layout, aliases)
    return combined
