"""Several named sources read by one pipeline, as one source: :class:`SourceSet`.

A pipeline declared with ``sources={"orders": src_a, "payments": src_b}`` runs ONE
streaming query whose transform takes ``{name: streaming DataFrame}`` (a stream-stream
join, typically). The runner keeps its one path: it treats the set as the pipeline's
source, and the set answers each call of the :class:`~sparkonce.sources.base.Source`
contract by asking each member about its own part.

A batch's identity
    The offsets of all the sources together. Each member keeps its topics to itself (the
    set refuses two members that name one topic), so the union of the members' ranges is
    one :class:`~sparkonce.offsets.BatchRanges` in which every range says whose it is by
    its topic. That union is what the ledger records and what step 2 of the commit
    protocol compares: a batch is a replay when all its ranges are committed, new when
    they all start at the ledger's end (a member with nothing new sits there with an
    empty range), and anything else is refused as today.

Spark's offset log
    Spark writes one line per source into ``offsets/<batch>``, in the order its plan
    lists the sources (for a join: the left side's first; measured in
    tests/kafka/test_source_set.py). The set does not rely on that order: each line is
    given to the member whose topics it names (:meth:`SourceSet.offset_from_log`), and a
    line that names no member's topics, or several members', or two different lines for
    one member, is a :class:`~sparkonce.errors.CheckpointError`. The set's own offset is
    a JSON object ``{name: that member's line}``, which :meth:`SourceSet.batch_ranges`
    takes apart again, so a member's no-data batch (its line the same as the batch
    before's) is an empty range at its previous end, as for one source.

Members
    Sources whose offsets are whole per-partition ranges keyed by topic:
    :class:`~sparkonce.sources.KafkaSource` and
    :class:`~sparkonce.sources.EmbeddedLogSource`. Not yet: ``SparkKafkaSource`` (its
    batch 0 starts at offsets the connector keeps per source in the checkpoint) and
    ``DeltaSource`` (its offsets name no topic); both are refused when the set is built.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sparkonce.errors import CheckpointError, ConfigError, SparkOnceError
from sparkonce.offsets import BatchRanges, OffsetRange, TopicPartition
from sparkonce.sources.base import Source

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from sparkonce.spark.checkpoint import Checkpoint

#: The URI scheme of a set of sources (the owner row's ``source``, for status and lag).
URI_SCHEME = "sources"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def check_source_name(name: object) -> str:
    """A source's name in ``sources={...}``: 1-64 letters, digits and ``_``."""
    if not isinstance(name, str) or not 1 <= len(name) <= 64 or not set(name) <= _NAME_CHARS:
        raise ConfigError(f"source name {name!r} must be 1-64 letters, digits and _")
    return name


def source_topics(source: Source) -> frozenset[str] | None:
    """The topics whose names key ``source``'s offsets, or None for a source whose offsets
    cannot be told apart by topic (it cannot be a member of a set)."""
    from sparkonce.sources.embedded import EmbeddedLogSource
    from sparkonce.sources.kafka import KafkaSource
    from sparkonce.sources.spark_kafka import SparkKafkaSource

    if isinstance(source, SparkKafkaSource):
        return None
    if isinstance(source, (KafkaSource, EmbeddedLogSource)):
        return frozenset({source.topic})
    return None


class SourceSet(Source):
    """Several named sources as one source (see the module docstring).

    Guarantee: a replayable input, as each member is: a batch is the members' offset
    ranges together, written to Spark's checkpoint (one line per member) before the batch
    runs, and a replay re-reads every member's ranges.
    """

    def __init__(self, sources: Mapping[str, Source]) -> None:
        if not isinstance(sources, Mapping) or not sources:
            raise ConfigError(
                "sources must be a non-empty mapping {name: source}, got "
                f"{type(sources).__name__ if not isinstance(sources, Mapping) else 'an empty one'}"
            )
        members: dict[str, Source] = {}
        owner_of: dict[str, str] = {}
        for name, source in sources.items():
            check_source_name(name)
            if isinstance(source, SourceSet) or not isinstance(source, Source):
                raise ConfigError(
                    f"source {name!r} must be a sparkonce Source (for example KafkaSource), "
                    f"got {type(source).__name__}"
                )
            if type(source).__name__ == "SparkSource":
                raise ConfigError(
                    f"source {name!r} ({source.describe()}) cannot be one of several sources: "
                    "a SparkSource is a whole query of the user's own. Give it a pipeline of "
                    "its own, or read the streams through KafkaSource to join them"
                )
            topics = source_topics(source)
            if topics is None:
                raise ConfigError(
                    f"source {name!r} ({source.describe()}) cannot be one of several sources "
                    "yet: sparkonce joins KafkaSource and EmbeddedLogSource streams, whose "
                    "offsets name their topic. Read it through KafkaSource, or give it a "
                    "pipeline of its own"
                )
            for topic in sorted(topics):
                if topic in owner_of:
                    raise ConfigError(
                        f"sources {owner_of[topic]!r} and {name!r} both read topic {topic!r}: "
                        "a batch's ranges are told apart by topic, so each topic belongs to "
                        "one source. To join a stream with itself, give it once and join "
                        "its DataFrame with itself in the transform"
                    )
                owner_of[topic] = name
            members[name] = source
        self.sources = members
        self._owner_of = owner_of

    # -- what the runner reads ------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.sources)

    def streams(
        self, spark: SparkSession, start: Mapping[TopicPartition, int] | None
    ) -> dict[str, DataFrame]:
        """Each member's streaming DataFrame by name, each starting at its own part of
        ``start`` (the ledger's end offsets) when the checkpoint is new."""
        return {n: s.stream(spark, self._part(n, start)) for n, s in self.sources.items()}

    def stream(self, spark: SparkSession, start: Mapping[TopicPartition, int] | None) -> DataFrame:
        raise ConfigError(
            f"{self.describe()} is several streams, not one: the transform gets them as "
            "{name: DataFrame} (SourceSet.streams)"
        )

    def _part(
        self, name: str, positions: Mapping[TopicPartition, int] | None
    ) -> dict[TopicPartition, int] | None:
        """The part of ``positions`` on member ``name``'s topics (None when it has none:
        the member then starts at its own ``starting_offsets``)."""
        if not positions:
            return None
        mine = {tp: o for tp, o in positions.items() if self._owner_of.get(tp[0]) == name}
        return mine or None

    def offset_from_log(self, lines: list[str], where: str) -> str:
        """This set's offset from the source lines of one offset log file ``where``: each
        line goes to the member whose topics it names; the result is ``{name: line}``."""
        found: dict[str, str] = {}
        for line in lines:
            name = self._member_of(line, where)
            text = _canonical(line)
            if name in found and found[name] != text:
                raise CheckpointError(
                    f"{where}: two offset lines with different offsets name source {name!r}'s "
                    f"topics ({self._topics_of(name)}). Each source of the pipeline is read by "
                    "one streaming relation (a self-join of one source's DataFrame is fine). "
                    "Check that the checkpoint belongs to this pipeline"
                )
            found[name] = text
        missing = [n for n in self.sources if n not in found]
        if missing:
            raise CheckpointError(
                f"{where}: no offset line names the topics of source(s) {missing}; the "
                "checkpoint was written by a query that did not read them. Use this "
                "pipeline's own checkpoint"
            )
        return json.dumps({n: found[n] for n in self.sources}, separators=(",", ":"))

    def _member_of(self, line: str, where: str) -> str:
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        keys = set(obj) if isinstance(obj, dict) else set()
        owners = {self._owner_of.get(k) for k in keys}
        if not keys or None in owners or len(owners) != 1:
            named = sorted({o for o in owners if o is not None})
            problem = (
                f"names topics of several sources ({', '.join(named)})"
                if len(named) > 1
                else "names no topic of this pipeline's sources"
            )
            raise CheckpointError(
                f"{where}: the offset line {line[:200]!r} {problem} "
                f"({'; '.join(f'{n}: {self._topics_of(n)}' for n in self.sources)}). "
                "The checkpoint belongs to another query: use this pipeline's own checkpoint"
            )
        (name,) = owners
        assert name is not None
        return name

    def _topics_of(self, name: str) -> str:
        return ", ".join(sorted(t for t, n in self._owner_of.items() if n == name))

    def _split(self, offset: str) -> dict[str, str]:
        try:
            obj = json.loads(offset)
        except ValueError:
            obj = None
        if not isinstance(obj, dict) or set(obj) != set(self.sources):
            raise CheckpointError(
                f"offset {offset[:200]!r} is not one of {self.describe()}'s (an object with "
                f"one offset per source: {list(self.sources)})"
            )
        return {n: str(obj[n]) for n in self.sources}

    def batch_ranges(self, previous: str | None, current: str) -> BatchRanges:
        """Every member's ranges of the batch, together: a member whose offset did not move
        (it had nothing new) covers an empty range at its previous end."""
        now = self._split(current)
        before = None if previous is None else self._split(previous)
        ranges: list[OffsetRange] = []
        for name, source in self.sources.items():
            prev = None if before is None else before[name]
            ranges.extend(source.batch_ranges(prev, now[name]).ranges)
        return BatchRanges(tuple(ranges))

    def initial_offset(self, checkpoint: Checkpoint) -> str | None:
        return None  # every member's offsets are whole ranges (SparkKafkaSource is refused)

    def aligned(self) -> SourceSet | None:
        """The set with each member as a query with an event-time watermark must read it
        (:meth:`Source.aligned`), or None when no member changes."""
        twins = {n: s.aligned() for n, s in self.sources.items()}
        if all(t is None for t in twins.values()):
            return None
        return SourceSet({n: twins[n] or s for n, s in self.sources.items()})

    def read_limits(self) -> dict[str, int]:
        return {f"{n}.{k}": v for n, s in self.sources.items() for k, v in s.read_limits().items()}

    def spark_conf(self) -> dict[str, str]:
        from sparkonce.spark.session import merge_spark_conf

        return merge_spark_conf(*(s.spark_conf() for s in self.sources.values()))

    def latest_offsets(self) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        for s in self.sources.values():
            out.update(s.latest_offsets())
        return out

    def committed(self, pipeline: str, ranges: BatchRanges) -> None:
        for name, source in self.sources.items():
            mine = tuple(r for r in ranges.ranges if self._owner_of.get(r.topic) == name)
            source.committed(pipeline, BatchRanges(mine))

    def check_ledger_start(self, start: Mapping[TopicPartition, int]) -> None:
        for name, source in self.sources.items():
            part = self._part(name, start)
            if part:
                source.check_ledger_start(part)

    def read_failure(self, text: str, ranges: BatchRanges | None) -> SparkOnceError | None:
        for source in self.sources.values():
            own = source.read_failure(text, ranges)
            if own is not None:
                return own
        return None

    def relocated(self, uri: str) -> Source:
        raise ConfigError(
            f"--source: {self.describe()} is several sources; --source moves a pipeline's "
            "one source. Edit the pipeline file to move one of several"
        )

    def topics_read(self) -> frozenset[str]:
        return frozenset(self._owner_of)

    def uri(self) -> str:
        """``sources:{"name": "<member URI>", ...}``: reopened by
        :func:`sparkonce.sources.source_from_uri` (status reads each member's lag)."""
        members = {n: s.uri() for n, s in self.sources.items()}
        return f"{URI_SCHEME}:" + json.dumps(members, separators=(",", ":"))

    @classmethod
    def from_uri(cls, uri: str) -> SourceSet:
        from sparkonce.sources import source_from_uri

        try:
            members = json.loads(uri[len(URI_SCHEME) + 1 :])
            if not isinstance(members, dict):
                raise TypeError("not an object")
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"{uri[:200]!r} is not a set of sources ({URI_SCHEME}:{{name: uri}})"
            ) from exc
        return cls({str(n): source_from_uri(str(u)) for n, u in members.items()})

    def describe(self) -> str:
        inner = ", ".join(f"{n}: {s.describe()}" for n, s in self.sources.items())
        return f"SourceSet({inner})"

    def __repr__(self) -> str:
        return f"SourceSet({', '.join(f'{n}={s!r}' for n, s in self.sources.items())})"


def _canonical(offset: str) -> str:
    try:
        return json.dumps(json.loads(offset), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return offset
