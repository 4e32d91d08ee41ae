"""What Spark's analyzed plan of a query shows (read through py4j, on the driver): its
non-deterministic expressions, what reads the clock, the Python functions, the stateful
operators, the event-time watermark and the streaming relations it reads.

A Spark Connect session has no py4j: its plan is read from the analyzed plan's text, which
the server sends (:class:`_TextPlan`). That text names each node and marks the streaming
ones; it shows the stateful operators, the Python nodes, the watermark and the streaming
relations, not which expressions are non-deterministic or read the clock.

Used by the query checks before a run (:mod:`sparkonce.pipeline.query`) and by the
explanation of a pipeline's guarantee (:mod:`sparkonce.pipeline.explain`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkonce.jvm import analyzed_plan
from sparkonce.outputs.dedup import BARRIER_COLUMN

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

# Catalyst calls these deterministic (one value per query), but they read the clock.
_CLOCK = {
    "CurrentTimestamp": "current_timestamp()",
    "Now": "now()",
    "CurrentDate": "current_date()",
    "LocalTimestamp": "localtimestamp()",
    "CurrentTimeZone": "current_timezone()",
}
# Logical plan nodes that keep state across micro-batches in a streaming query.
_STATEFUL = {
    "Aggregate": "aggregation",
    "Deduplicate": "dropDuplicates",
    "DeduplicateWithinWatermark": "dropDuplicatesWithinWatermark (dedupe)",
    "FlatMapGroupsWithState": "flatMapGroupsWithState",
    "FlatMapGroupsInPandasWithState": "applyInPandasWithState",
    "TransformWithState": "transformWithState",
    "TransformWithStateInPySpark": "transformWithStateInPandas",
    "TransformWithStateInPandas": "transformWithStateInPandas",
    "GlobalLimit": "limit",
}
_PYTHON_NODES = ("Pandas", "Python", "PySpark", "Arrow")  # mapInPandas, applyInPandas...
# Logical plan nodes that Spark plans with a shuffle (an exchange): the rows a task after it
# holds depend on the values of the rows before it. A global Sort too (range partitioning).
_SHUFFLES = {
    *_STATEFUL,
    "Join",
    "Repartition",
    "RepartitionByExpression",
    "RebalancePartitions",
    "Window",
    "Distinct",
    "Intersect",
    "Except",
    "CoGroup",
    "MapGroups",
    "FlatMapGroupsInPandas",
    "FlatMapCoGroupsInPandas",
    "FlatMapGroupsInArrow",
    "FlatMapCoGroupsInArrow",
}


@dataclass(frozen=True)
class PlanFacts:
    """What Spark's analyzed plan of one output shows."""

    nondeterministic: tuple[str, ...] = ()  # rand(), uuid(), a UDF declared so...
    clock: tuple[str, ...] = ()  # current_timestamp()...
    python_functions: tuple[str, ...] = ()  # UDFs and pandas functions, as declared
    stateful: tuple[str, ...] = ()  # stateful operators, Spark's node names
    # Those of ``nondeterministic`` and ``clock`` computed before a shuffle: they can move
    # rows between the Spark partitions after it (see Spark's plan below).
    before_shuffle: tuple[str, ...] = ()
    # What could not be checked, said as it goes into a message; empty when the plan was
    # walked whole (a classic session).
    unchecked: str = ""

    def merged(self, other: PlanFacts) -> PlanFacts:
        def join(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(dict.fromkeys(a + b))

        return PlanFacts(
            join(self.nondeterministic, other.nondeterministic),
            join(self.clock, other.clock),
            join(self.python_functions, other.python_functions),
            join(self.stateful, other.stateful),
            join(self.before_shuffle, other.before_shuffle),
            self.unchecked or other.unchecked,
        )

    @property
    def varies(self) -> tuple[str, ...]:
        """Everything that can give a re-planned batch other values."""
        return self.nondeterministic + self.clock


# -- Spark's plan ------------------------------------------------------------------------
def plan_facts(df: DataFrame) -> PlanFacts:
    """Walk the analyzed logical plan of ``df`` (through py4j) and note what it holds.

    What sparkonce adds itself is not the transform's: :func:`~sparkonce.outputs.dedupe`'s
    ``spark_partition_id()`` (named :data:`~sparkonce.outputs.dedup.BARRIER_COLUMN`) is only
    compared with 0, so it never changes a row. A non-deterministic expression (or one that
    reads the clock) in a node with a shuffle at or above it is also noted in
    ``before_shuffle``: the shuffle can then send a row to another Spark partition when the
    batch is computed again (conservatively, whatever the expression feeds).

    On a Spark Connect session the plan is read from its text (see :class:`_TextPlan`):
    non-deterministic expressions and clock reads are found by their function names, and
    ``unchecked`` says so; which of them come before a shuffle is not noted."""
    plan = analyzed_plan(df)
    if plan is None:
        return _TextPlan(df).facts()
    nondet: list[str] = []
    clock: list[str] = []
    python: list[str] = []
    stateful: list[str] = []
    shuffled: list[str] = []

    def expression(e: Any, before_shuffle: bool) -> None:
        name = e.getClass().getSimpleName()
        if name == "Alias" and e.name().lstrip("_") == BARRIER_COLUMN.lstrip("_"):
            return  # dedupe's own barrier: always true, never the transform's
        kids = _seq(e.children())
        found: str | None = None
        if name == "PythonUDF":
            label = f"Python UDF {e.name()}"
            if e.deterministic():
                python.append(label)
            else:
                found = f"{label} (declared non-deterministic)"
                nondet.append(found)
        elif name in _CLOCK:
            found = _CLOCK[name]
            clock.append(found)
        elif not e.deterministic() and all(k.deterministic() for k in kids):
            found = f"{e.prettyName()}()"
            nondet.append(found)
        if found is not None and before_shuffle:
            shuffled.append(found)
        for k in kids:
            expression(k, before_shuffle)

    def node(n: Any, before_shuffle: bool) -> None:
        name = n.nodeName()
        if name in _STATEFUL and n.isStreaming():
            stateful.append(name)
        elif name == "Join" and all(c.isStreaming() for c in _seq(n.children())):
            stateful.append("stream-stream Join")
        if any(s in name for s in _PYTHON_NODES):
            python.append(f"pandas/Python function in {name}")
        shuffles = (
            name in _SHUFFLES
            or any(s in name for s in ("Group", "Join"))
            or (name == "Sort" and bool(getattr(n, "global")()))
        )
        inner = before_shuffle or shuffles
        for e in _seq(n.expressions()):
            expression(e, inner)
        for c in _seq(n.children()):
            node(c, inner)

    node(plan, False)

    def unique(xs: list[str]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(xs))

    return PlanFacts(
        unique(nondet), unique(clock), unique(python), unique(stateful), unique(shuffled)
    )


# Logical plan nodes of an event-time watermark (withWatermark; transformWithState's).
_WATERMARK_NODES = ("EventTimeWatermark", "UpdateEventTimeWatermarkColumn")


def has_watermark(df: DataFrame) -> bool:
    """Whether the analyzed plan of ``df`` holds an event-time watermark (driver)."""

    def found(n: Any) -> bool:
        return n.nodeName() in _WATERMARK_NODES or any(found(c) for c in _seq(n.children()))

    plan = analyzed_plan(df)
    if plan is None:
        return any(n.name in _WATERMARK_NODES for n in _TextPlan(df).nodes)
    return bool(found(plan))


def _seq(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


# Options of a streaming relation that may be named in a message: where it reads, never
# how it connects (Kafka's ``kafka.*`` options can carry credentials).
_SAFE_OPTIONS = ("path", "topic", "subscribe", "subscribePattern", "assign")


@dataclass(frozen=True)
class StreamingSource:
    """A streaming leaf of Spark's analyzed plan: its format and options. Two reads of
    one source with the same options (a self-join) are equal."""

    format: str
    options: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        shown = [f"{k}={v}" for k, v in self.options if k in _SAFE_OPTIONS]
        return f"format {self.format!r}" + (f" ({', '.join(shown)})" if shown else "")


def streaming_sources(df: DataFrame) -> list[StreamingSource]:
    """The streaming relations the analyzed plan of ``df`` reads, one per leaf."""
    found: list[StreamingSource] = []
    analyzed = analyzed_plan(df)
    if analyzed is None:
        plan = _TextPlan(df)
        return [n.source() for n in plan.nodes if n.streaming and not plan.children(n)]

    def node(n: Any) -> None:
        kids = _seq(n.children())
        if not kids and n.isStreaming():
            found.append(_streaming_source(n))
        for c in kids:
            node(c)

    node(analyzed)
    return found


def _streaming_source(leaf: Any) -> StreamingSource:
    try:
        fmt = str(leaf.sourceName())
    except Exception:  # a streaming leaf of another kind: known by its node's name only
        return StreamingSource(str(leaf.nodeName()))
    try:
        options = dict(leaf.extraOptions().asCaseSensitiveMap())
    except Exception:  # Spark's v1 StreamingRelation keeps its options elsewhere
        options = {}
    return StreamingSource(fmt, tuple(sorted((str(k), str(v)) for k, v in options.items())))


def stateful_operators(facts: PlanFacts) -> str:
    """The stateful operators of ``facts``, named for a message."""
    return ", ".join(f"{_STATEFUL.get(o, o)} ({o})" for o in facts.stateful)


# -- Spark's plan as text (a Spark Connect session) ---------------------------------------
# A line of Spark's tree string: the tree's drawing, "~" for a streaming node, "'" for an
# unresolved one, then the node's name and its arguments.
_TREE_LINE = re.compile(r"^([ :|+\-]*)(~?)'?(\w+)(.*)$")
# A function call in a node's arguments, as Spark prints expressions: rand(42), uuid(...).
_CALL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\(")
# Spark's built-in functions that are non-deterministic, and those that read the clock, by
# the names its plan text prints.
_NONDETERMINISTIC_NAMES = frozenset(
    {
        "rand",
        "randn",
        "random",
        "uniform",
        "randstr",
        "uuid",
        "shuffle",
        "monotonically_increasing_id",
        "spark_partition_id",
        "input_file_name",
        "input_file_block_start",
        "input_file_block_length",
    }
)
_CLOCK_NAMES = frozenset(
    {
        "current_timestamp",
        "now",
        "current_date",
        "curdate",
        "localtimestamp",
        "current_timezone",
        "current_time",
    }
)
_TEXT_PLAN_CAVEAT = (
    "on a Spark Connect session Spark's plan arrives as text: non-deterministic built-in "
    "functions and clock reads are found by name, a Python UDF declared non-deterministic "
    "is not told apart, and what comes before a shuffle is not checked"
)


@dataclass(frozen=True)
class _TextNode:
    index: int
    depth: int  # where the node's name starts: a child's is 3 further in
    streaming: bool
    name: str
    args: str

    def source(self) -> StreamingSource:
        """A streaming leaf as :func:`streaming_sources` gives it. Spark writes a
        ``StreamingRelationV2`` as: class@id, format, table@id, [options], [columns], ..."""
        if self.name != "StreamingRelationV2":
            return StreamingSource(self.name)
        fields = self.args.strip().split(", ", 3)
        fmt = fields[1] if len(fields) > 1 else self.name
        options: dict[str, str] = {}
        rest = fields[3] if len(fields) > 3 else ""
        if rest.startswith("["):
            for item in rest[1 : rest.find("]")].split(", "):
                key, eq, value = item.partition("=")
                if eq:
                    options[key] = value
        return StreamingSource(fmt, tuple(sorted(options.items())))


class _TextPlan:
    """The analyzed logical plan of a Spark Connect DataFrame, from its explained text."""

    def __init__(self, df: DataFrame) -> None:
        text: str = df._explain_string(extended=True)  # type: ignore[operator]
        lines = text.split("== Analyzed Logical Plan ==", 1)[-1].split("\n== ", 1)[0]
        body = lines.strip("\n").splitlines()[1:]  # the first line is the output's schema
        nodes: list[_TextNode] = []
        for line in body:
            m = _TREE_LINE.match(line)
            if m:
                nodes.append(
                    _TextNode(len(nodes), len(m.group(1)), bool(m.group(2)), m.group(3), m.group(4))
                )
        self.nodes: list[_TextNode] = nodes

    def children(self, node: _TextNode) -> list[_TextNode]:
        kids = []
        for n in self.nodes[node.index + 1 :]:
            if n.depth <= node.depth:
                break
            if n.depth == node.depth + 3:
                kids.append(n)
        return kids

    def facts(self) -> PlanFacts:
        stateful: list[str] = []
        python: list[str] = []
        nondet: list[str] = []
        clock: list[str] = []
        for n in self.nodes:
            for fn in _CALL.findall(n.args):
                name = fn.lower()
                if name in _CLOCK_NAMES:
                    clock.append(f"{name}()")
                elif name in _NONDETERMINISTIC_NAMES and not (
                    name == "spark_partition_id" and BARRIER_COLUMN in n.args
                ):
                    nondet.append(f"{name}()")
            if n.name in _STATEFUL and n.streaming:
                stateful.append(n.name)
            elif n.name == "Join" and all(c.streaming for c in self.children(n)):
                stateful.append("stream-stream Join")
            if any(s in n.name for s in _PYTHON_NODES):
                python.append(f"pandas/Python function in {n.name}")
        return PlanFacts(
            nondeterministic=tuple(dict.fromkeys(nondet)),
            clock=tuple(dict.fromkeys(clock)),
            python_functions=tuple(dict.fromkeys(python)),
            stateful=tuple(dict.fromkeys(stateful)),
            unchecked=_TEXT_PLAN_CAVEAT,
        )
