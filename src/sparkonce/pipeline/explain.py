"""What a pipeline guarantees as configured, and why: :meth:`Pipeline.explain` and
``sparkonce explain``.

The answer comes from two places, neither of which runs the pipeline or touches a store:

- the pipeline object: its source, each output's sink (a sink class declares its
  guarantee in ``Sink.guarantee``), stable output, the checkpoint's location;
- Spark's analyzed plan of the transform's output over the source: the
  non-deterministic expressions it holds (``rand``, ``uuid``, non-deterministic UDFs,
  ``monotonically_increasing_id``...), what reads the clock (``current_timestamp``), the
  Python functions Spark cannot see into, and the stateful operators (aggregations,
  ``dropDuplicates``, ``dedupe``, stream-stream joins, ``limit``,
  ``applyInPandasWithState``, ``transformWithStateInPandas``) and where their state lives.

The guarantee words are DESIGN.md section 1's, ordered from strongest to weakest in
:data:`GUARANTEES`; the pipeline as a whole gets the weakest of its source's and outputs'.
What a transform does inside a Python function is beyond the plan: such a function is
taken as deterministic as declared (``asNondeterministic()`` declares it otherwise), and
the explanation says so. ``sparkonce verify`` is the check that runs the pipeline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkonce.outputs.output_set import SINGLE_OUTPUT
from sparkonce.pipeline.plan import PlanFacts, plan_facts, stateful_operators

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

    from sparkonce.pipeline.spec import PipelineSpec
    from sparkonce.sinks.base import Sink
    from sparkonce.sources.base import Source
    from sparkonce.sources.spark_query import SparkSource

EFFECTIVELY_ONCE = "effectively-once"
EFFECTIVELY_ONCE_READ_COMMITTED = "effectively-once for read_committed consumers"
EFFECTIVELY_ONCE_PER_OUTPUT = "effectively-once per output"
AT_LEAST_ONCE = "at-least-once"
NO_GUARANTEE = "no guarantee"
REPLAYABLE = "replayable input"
# Strongest first; a pipeline gets the weakest of its parts.
GUARANTEES = (
    EFFECTIVELY_ONCE,
    EFFECTIVELY_ONCE_READ_COMMITTED,
    EFFECTIVELY_ONCE_PER_OUTPUT,
    AT_LEAST_ONCE,
    NO_GUARANTEE,
)

_SHARED_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "glusterfs", "ceph", "lustre", "gpfs")
_STATE_STORES = {
    "RocksDBStateStoreProvider": "RocksDB on the executors' local disks, its files "
    "uploaded to the checkpoint's state/ directory at each commit",
    "HDFSBackedStateStoreProvider": "executor memory, with snapshots and deltas in the "
    "checkpoint's state/ directory",
}


@dataclass(frozen=True)
class Part:
    """One line of an explanation: a part of the pipeline, its guarantee or status, why,
    and what to change for a stronger guarantee (None: nothing)."""

    part: str  # "source", "transform", "state", "checkpoint", "records", "output NAME"...
    what: str
    verdict: str
    why: str
    to_strengthen: str | None = None
    counts: bool = False  # whether its verdict is a guarantee that bounds the pipeline's


@dataclass(frozen=True)
class Explanation:
    """The guarantee of a pipeline as configured, with the reason for each part."""

    pipeline: str
    guarantee: str
    why: str
    parts: tuple[Part, ...]
    facts: PlanFacts
    checkpoint: dict[str, str] = field(default_factory=dict)
    kafka_outputs: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "pipeline": self.pipeline,
            "guarantee": self.guarantee,
            "why": self.why,
            "parts": [asdict(p) for p in self.parts],
            "nondeterministic": list(self.facts.nondeterministic),
            "clock": list(self.facts.clock),
            "python_functions": list(self.facts.python_functions),
            "stateful_operators": list(self.facts.stateful),
            "unchecked": self.facts.unchecked,
            "checkpoint": dict(self.checkpoint),
            "kafka_outputs": list(self.kafka_outputs),
        }


def explain(pipeline: PipelineSpec, spark: SparkSession) -> Explanation:
    """The guarantee of ``pipeline`` as configured (see the module docstring). Builds the
    transform's query over the source to read Spark's analyzed plan; starts nothing."""
    from sparkonce.pipeline.query import aligned_reads, aligned_source, transform_outputs

    frames = transform_outputs(pipeline, spark)
    per_output = {name: plan_facts(df) for name, df in frames.items()}
    facts = PlanFacts()
    for f in per_output.values():
        facts = facts.merged(f)
    sinks = _sinks(pipeline)
    parts: list[Part] = [*_source_parts(pipeline), _transform_part(facts)]
    if aligned_source(pipeline.source, frames.values()) is not None:
        limits = ", ".join(f"{k}={v}" for k, v in pipeline.source.read_limits().items())
        parts.append(
            Part(
                "read limits",
                limits,
                "shared out by backlog",
                aligned_reads(pipeline.source),
                "drop the read limits, or keep each partition's records spread evenly in "
                "event time",
            )
        )
    parts.append(_state_part(pipeline, spark, facts))
    checkpoint = checkpoint_storage(pipeline.checkpoint_location)
    parts.append(_checkpoint_part(checkpoint, bool(facts.stateful)))
    parts.append(_records_part(pipeline, facts))
    stable = pipeline.output_set.stable if pipeline.output_set is not None else False
    for name, sink in sinks.items():
        parts.append(_output_part(name, sink, per_output.get(name, facts), stable))
    for name, sink in sinks.items():
        if _is_kafka(sink) and _ours(sink):
            parts.append(_kafka_ledger_part(name, sink))
    stores = pipeline.output_set.groups if pipeline.output_set is not None else []
    if len(stores) > 1:
        parts.append(_stores_part(len(stores), stable, per_output, sinks))
    kafka = tuple(n for n, s in sinks.items() if _is_kafka(s))
    counted = [p for p in parts if p.counts]
    weakest = max(counted, key=lambda p: _rank(p.verdict))
    guarantee = GUARANTEES[_rank(weakest.verdict)]
    if guarantee == EFFECTIVELY_ONCE:
        why = "every output is effectively-once and the source replays each batch exactly"
    else:
        why = f"set by {weakest.part}: {weakest.why}"
    return Explanation(
        pipeline=pipeline.name,
        guarantee=guarantee,
        why=why,
        parts=tuple(parts),
        facts=facts,
        checkpoint=checkpoint,
        kafka_outputs=kafka,
    )


# -- checkpoint storage --------------------------------------------------------------------
def checkpoint_storage(path: str | Path, mounts: str | None = None) -> dict[str, str]:
    """Where ``path`` lives: ``{"path", "mount", "fstype", "storage"}``, storage being
    ``"shared"`` (a network filesystem, or a URL such as ``s3a://`` or ``hdfs://``),
    ``"memory"`` (tmpfs) or ``"local"``. ``mounts`` is the text of /proc/mounts (read when
    None; unknown without it)."""
    from sparkonce.files import scheme

    if scheme(path):
        return {"path": str(path), "mount": "", "fstype": scheme(path), "storage": "shared"}
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return {"path": str(path), "mount": "", "fstype": "", "storage": "local"}
    best = ("", "")
    target = str(path)
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[0]):
            best = (mount, fields[2])
    fstype = best[1]
    if fstype in _SHARED_FS or fstype.startswith("fuse."):
        storage = "shared"
    elif fstype in ("tmpfs", "ramfs"):
        storage = "memory"
    else:
        storage = "local"
    return {"path": str(path), "mount": best[0], "fstype": fstype, "storage": storage}


# -- the parts -------------------------------------------------------------------------------
def _rank(verdict: str) -> int:
    if verdict == REPLAYABLE:
        return 0
    return GUARANTEES.index(verdict) if verdict in GUARANTEES else len(GUARANTEES) - 1


def _sinks(pipeline: PipelineSpec) -> dict[str, Sink]:
    outputs = pipeline.output_set
    if outputs is None:
        return {SINGLE_OUTPUT: pipeline.sink}
    return dict(outputs.outputs)


def _is_kafka(sink: Sink) -> bool:
    from sparkonce.sinks.kafka import KafkaSink

    return isinstance(sink, KafkaSink)


def _ours(obj: object) -> bool:
    return type(obj).__module__.startswith("sparkonce.")


def _source_parts(pipeline: PipelineSpec) -> list[Part]:
    """One part per source: ``source`` for a pipeline with one, ``source NAME`` for each of
    several (:class:`~sparkonce.sources.source_set.SourceSet`), whose batch is all their
    offsets together."""
    from sparkonce.sources.source_set import SourceSet
    from sparkonce.sources.spark_query import SparkSource

    src = pipeline.source
    if isinstance(src, SparkSource):
        return _spark_source_parts(src)
    if not isinstance(src, SourceSet):
        return [_source_part(src)]
    together = (
        f"; a batch is the offsets of all {len(src.sources)} sources together "
        f"({', '.join(src.sources)}), one line each in Spark's offset log, and the ledger "
        "records them in one entry"
    )
    parts = []
    for name, member in src.sources.items():
        one = _source_part(member)
        parts.append(dataclasses.replace(one, part=f"source {name}", why=one.why + together))
    return parts


#: The verdict of a source whose replay returns the same rows only under a condition.
REPLAY_CONDITIONAL = "deterministic replay only if"


def _spark_source_parts(src: SparkSource) -> list[Part]:
    """The user's own query (:class:`~sparkonce.sources.spark_query.SparkSource`): replayable
    as its kind is, and a second part that flags a replay that is deterministic only under a
    condition Spark does not check (a file source's directory), with that condition."""
    rel = src.relation
    kind = "its" if rel is None else f"the {rel.kind}"
    why = (
        f"each batch is the line Spark writes for {kind} read into the checkpoint's offset "
        "log before the batch runs, kept in the ledger as ranges; a replay reads the same "
        "offsets again"
    )
    note = src.read_note()
    if note is not None:
        why += f"; {note}"
    fix = "set kafka.isolation.level=read_committed on the read" if note else None
    parts = [Part("source", src.describe(), REPLAYABLE, why, fix, counts=True)]
    condition = src.replay_condition()
    if condition is not None:
        parts.append(
            Part(
                "source replay",
                src.describe(),
                REPLAY_CONDITIONAL,
                condition,
                "keep to the condition, or read the data through a source whose offsets "
                "name stored records (Kafka, Delta)",
            )
        )
    return parts


def _source_part(src: Source) -> Part:
    from sparkonce.sources.delta import DeltaSource
    from sparkonce.sources.embedded import EmbeddedLogSource
    from sparkonce.sources.kafka import KafkaSource

    if isinstance(src, KafkaSource) and _ours(src):
        why = (
            "each batch is a set of per-partition Kafka offset ranges, written to Spark's "
            "checkpoint before the batch runs and read at read_committed, so a replay reads "
            "the same records and never an aborted transaction's; records deleted by "
            "retention before they are read stop the batch with an error"
        )
        return Part("source", src.describe(), REPLAYABLE, why, counts=True)
    if isinstance(src, DeltaSource) and _ours(src):
        why = (
            "each batch is a range of the table's versions and data files (Delta's offset, "
            "version and file index, written to Spark's checkpoint before the batch runs); a "
            "replay reads the same files again. OPTIMIZE is not read again; an UPDATE, DELETE "
            "or MERGE upstream stops the run"
            + (
                ", except that skip_change_commits=True skips such commits: their rows are "
                "not delivered"
                if src.skip_change_commits
                else ""
            )
            + "; data files VACUUM removed before a batch read them stop it with an error. A "
            "new checkpoint resumes from the ledger only at a version's start"
        )
        return Part("source", src.describe(), REPLAYABLE, why, counts=True)
    if isinstance(src, EmbeddedLogSource) and _ours(src):
        why = (
            "each batch is a set of per-partition offset ranges of the log, written to Spark's "
            "checkpoint before the batch runs; re-reading a range returns the same records"
        )
        return Part("source", src.describe(), REPLAYABLE, why, counts=True)
    return Part(
        "source",
        src.describe(),
        NO_GUARANTEE,
        f"{type(src).__name__} is not one of sparkonce's sources; nothing shows that it "
        "returns the same records when a batch is replayed",
        "read through EmbeddedLogSource, KafkaSource or DeltaSource, and run `sparkonce verify`",
        counts=True,
    )


def _transform_part(facts: PlanFacts) -> Part:
    trusted = (
        f"; {len(facts.python_functions)} Python function(s) taken as deterministic as "
        f"declared ({', '.join(facts.python_functions)}): the plan cannot see inside them"
        if facts.python_functions
        else ""
    )
    if facts.unchecked:
        trusted += f"; {facts.unchecked}"
    if not facts.varies:
        return Part(
            "transform",
            "Spark's analyzed plan",
            "deterministic",
            "no non-deterministic "
            "expression and nothing that reads the clock in the plan" + trusted,
        )
    clock = (
        f"; {', '.join(facts.clock)} reads the clock: Spark fixes it per batch in the "
        "checkpoint's offset log, so a replay from the same checkpoint sees the same value, "
        "but a batch planned again after the checkpoint is lost does not"
        if facts.clock
        else ""
    )
    nondet = ", ".join(facts.nondeterministic) or "none"
    return Part(
        "transform",
        "Spark's analyzed plan",
        "non-deterministic",
        f"non-deterministic expressions: {nondet}{clock}{trusted}. A retried or replayed "
        "batch can compute other rows; what this means for each output is on its line",
    )


def _state_part(pipeline: PipelineSpec, spark: SparkSession, facts: PlanFacts) -> Part:
    if not facts.stateful:
        declared = " (declared stateful=True)" if pipeline.stateful else ""
        return Part(
            "state",
            "none in the plan" + declared,
            "stateless" if not pipeline.stateful else "stateful",
            "no stateful operator: a lost checkpoint resumes from the ledger alone",
        )
    provider = spark.conf.get("spark.sql.streaming.stateStore.providerClass", "") or ""
    short = provider.rsplit(".", 1)[-1]
    where = _STATE_STORES.get(short, f"the state store {short or 'default'}")
    ops = stateful_operators(facts)
    return Part(
        "state",
        f"{ops}; state in {where}",
        "stateful",
        "the state lives in the checkpoint; sparkonce refuses to resume a stateful pipeline "
        "whose checkpoint is lost (CheckpointLostError) rather than restart its state empty",
    )


def _checkpoint_part(info: dict[str, str], stateful: bool) -> Part:
    where = f"{info['path']} ({info['storage']}"
    if info["fstype"] and info["mount"]:
        where += f", {info['fstype']} at {info['mount']})"
    elif info["fstype"]:
        where += f", {info['fstype']}://, through Spark's Hadoop filesystem)"
    else:
        where += ")"
    if info["storage"] == "shared":
        return Part(
            "checkpoint",
            where,
            "shared",
            "on shared storage: it outlives this machine, and a cluster's driver and "
            "executors all reach it",
        )
    lost = (
        "the pipeline refuses to resume (its state cannot be rebuilt) until the checkpoint is "
        "restored"
        if stateful
        else "the pipeline resumes from the ledger, with nothing lost or repeated"
    )
    kind = "memory (tmpfs): lost on reboot" if info["storage"] == "memory" else "local disk"
    return Part(
        "checkpoint",
        where,
        kind.split(":")[0],
        f"{kind}; the ledger, not the checkpoint, is the truth. If it is lost, {lost}",
        "to resume after this machine is lost, put the checkpoint on storage that outlives it"
        if stateful
        else None,
    )


def _records_part(pipeline: PipelineSpec, facts: PlanFacts) -> Part:
    if "DeduplicateWithinWatermark" in facts.stateful:
        return Part(
            "records",
            "dedupe()",
            "deduplicated",
            "copies of a record re-sent under the same record id are dropped within the "
            "dedupe bound; records with a NULL id are not deduplicated",
        )
    return Part(
        "records",
        "each record in the log",
        "counted per copy",
        "every record in the log counts once; a record a producer re-sent under a new "
        "offset is a second record to the pipeline",
        "if producers may re-send records (no idempotent producer), use "
        "dedupe(df, 'record_id', within=..., event_time=...)",
    )


def _kafka_ledger_part(name: str, sink: Sink) -> Part:
    """How a Kafka sink's ledger topic is replicated: the rule, and the start-up warning
    (:meth:`KafkaLedgerStore.replication_warning`) once the sink has opened in this process
    (explain itself connects to nothing)."""
    store = getattr(sink, "store", None)
    label = "ledger" if name == SINGLE_OUTPUT else f"ledger {name}"
    what = f"Kafka topic {getattr(store, 'ledger_topic', '?')!r}"
    note = getattr(store, "replication_note", None)
    if note:
        return Part(
            label,
            what,
            "replicated less than the cluster allows",
            note,
            "give the ledger topic more replicas (kafka-reassign-partitions), e.g. 3 with "
            "min.insync.replicas=2",
        )
    return Part(
        label,
        what,
        "replicated as the cluster says",
        "created with the cluster's default.replication.factor (or the sink's "
        "ledger_replication_factor) and min.insync.replicas 2 with 3 or more replicas, and "
        "written with acks=all; a start warns when it has fewer replicas than "
        "min.insync.replicas + 1 on a cluster with more brokers (explain connects to "
        "nothing: the warning shows here once the sink has started in this process)",
    )


def _output_part(name: str, sink: Sink, facts: PlanFacts, stable: bool) -> Part:
    label = "output" if name == SINGLE_OUTPUT else f"output {name}"
    what = sink.describe()
    declared = getattr(sink, "guarantee", None)
    if declared != EFFECTIVELY_ONCE:
        return Part(
            label,
            what,
            AT_LEAST_ONCE,
            f"{type(sink).__name__} declares itself {declared or 'without a guarantee'}: "
            "a batch replayed after a crash can be written again",
            "write through an effectively-once sink (SQLiteSink, PostgresSink, "
            "PostgresTwoPhaseSink, DeltaSink, IcebergSink, KafkaSink), or make this sink commit "
            "its rows and its ledger entry in one transaction",
            counts=True,
        )
    if _is_kafka(sink):
        topic = getattr(sink, "topic", "the topic")
        if facts.before_shuffle and not stable:
            return Part(
                label,
                what,
                NO_GUARANTEE,
                f"a replay rewrites only the Spark partitions without a marker, and "
                f"{', '.join(facts.before_shuffle)}, computed before a shuffle, can change "
                "which rows a recomputed partition holds: rows can be lost or repeated",
                "set stable_output=True on the Pipeline (the replay then reads the batch's "
                "first computed rows back), or compute the non-deterministic values after "
                "the last shuffle",
                counts=True,
            )
        values = (
            f"; with no shuffle after {', '.join(facts.varies)}, a rewritten partition reads "
            "the same offset ranges and holds the same records, so only the values can differ "
            "from another attempt's, and each partition's are those of the one attempt that "
            "committed it"
            if facts.varies and not stable
            else ""
        )
        return Part(
            label,
            what,
            EFFECTIVELY_ONCE_READ_COMMITTED,
            "each Spark task writes its part and its ledger marker in one Kafka transaction; "
            "aborted and zombie attempts stay in the topic, invisible only to read_committed "
            f"readers{values}",
            f"every reader of {topic!r} must read with isolation.level=read_committed "
            "(Spark's Kafka source: kafka.isolation.level=read_committed; Java clients and "
            "librdkafka: isolation.level=read_committed)",
            counts=True,
        )
    if not _ours(sink):
        return Part(
            label,
            what,
            EFFECTIVELY_ONCE,
            f"{type(sink).__name__} declares itself effectively-once; sparkonce does not check "
            "a sink of another package",
            "run `sparkonce verify` on this pipeline",
            counts=True,
        )
    why = (
        "the batch's rows, the epoch check and the ledger entry commit in one transaction of "
        "the store: a replay is skipped and a zombie run is fenced"
    )
    if facts.varies:
        why += "; only one attempt of a batch ever commits, so the non-deterministic values "
        why += "are those of one attempt"
    return Part(label, what, EFFECTIVELY_ONCE, why, counts=True)


def _stores_part(
    stores: int, stable: bool, per_output: Mapping[str, PlanFacts], sinks: Mapping[str, Sink]
) -> Part:
    varies = sorted({v for f in per_output.values() for v in f.varies})
    what = f"{len(sinks)} outputs in {stores} stores"
    if stable:
        return Part(
            "outputs",
            what + ", stable output",
            EFFECTIVELY_ONCE,
            "each batch's rows are written once under the checkpoint before any store "
            "commits, and every store commits from that copy; stores commit one after "
            "another, so a reader can see a batch in one store a moment before another",
            counts=True,
        )
    if not varies:
        return Part(
            "outputs",
            what + ", no stable output",
            EFFECTIVELY_ONCE,
            "a batch replayed for a store that missed it is recomputed, and the plan shows "
            "nothing non-deterministic, so the stores get the same rows",
            counts=True,
        )
    return Part(
        "outputs",
        what + ", no stable output",
        EFFECTIVELY_ONCE_PER_OUTPUT,
        f"a batch replayed after a crash between two stores' commits is recomputed for the "
        f"stores that missed it, and {', '.join(varies)} then gives them other values than "
        "the stores that committed first",
        "set stable_output=True (the default for outputs in several stores)",
        counts=True,
    )
