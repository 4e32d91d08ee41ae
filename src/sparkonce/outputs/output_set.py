"""A pipeline's named outputs, committed as one sink: :class:`OutputSet`.

A pipeline declared with ``outputs={"totals": sink_a, "dead_letters": sink_b, ...}``
runs ONE streaming query (its transform's outputs folded together by
:func:`~sparkonce.outputs.combine.combine`), and the runner hands each micro-batch to an
``OutputSet``, which plays the part of the pipeline's sink:

Stores and transactions
    Outputs are grouped by the store that holds their sink's ledger
    (:meth:`Sink.store_key`): one SQLite file, one PostgreSQL database. Each group has
    one :class:`~sparkonce.commit.Committer`, so the outputs of one store commit in
    **one transaction with one ledger row** per batch, and the protocol's five steps are
    the committer's, unchanged. A Kafka output keeps a ledger topic of its own, so it is
    a group of its own. Groups commit one after the other, in the order the outputs are
    declared; each group takes its own epoch (``acquire`` runs in every store, in that
    order, before the query starts) and fences older runs in its store.

Stable batch output
    With ``stable=True`` (the default when the outputs live in more than one store), the
    batch's combined rows are written once to Parquet before any group commits
    (:class:`~sparkonce.outputs.stable.StableOutput`, under the checkpoint), and every
    group commits from that copy. A replay (the driver died between two groups' commits)
    reads the copy back instead of recomputing the batch, so a non-deterministic
    transform (``rand()``, ``uuid()``, ``current_timestamp()``, a lookup) gives every
    store the same rows. A copy is deleted once every group's ledger covers its batch.
    When every output's sink collects its rows on the driver anyway (the SQL sinks), the
    copy is made there: each output's rows are collected once as an Arrow table (the batch
    persisted meanwhile, so it runs once), the tables are written as Arrow IPC files, and
    every sink takes its rows from them (:meth:`OutputSet.collect_tables`,
    :meth:`OutputSet.output_arrow`). Otherwise (a Kafka or two-phase output, a late-data
    output) Spark writes the copy as Parquet and every group reads it back.
    Without stable output, each group's rows come from the same persisted DataFrame in
    one run, but a replay recomputes them: stores that commit a batch in different runs
    can then hold different values of non-deterministic columns (the runner warns).

Dead letters
    An output whose columns are exactly :data:`~sparkonce.outputs.quality.DEAD_LETTER_SCHEMA`
    (``Parsed.bad``) gets two more columns when it commits: ``pipeline`` (the pipeline's
    name) and ``batch_seq`` (the ledger entry of the batch in that output's store).

Resuming
    Each store's ledger has its own end. They differ only after a crash between two
    groups' commits; the checkpoint then replays that batch, the stores that have it
    skip it and the others commit it. With an empty checkpoint the batch cannot be
    replayed as it was, so a run whose stores disagree and whose checkpoint is gone is
    refused (:meth:`OutputSet.check_stores_agree`) instead of resuming from either end.

Everything here runs on the driver, inside ``foreachBatch``; the sinks' stagers start
Spark tasks where they do. On a Spark Connect session that "driver" is the server's Python
worker running the pickled batch function (:mod:`sparkonce.pipeline.connect`): the set
travels there as the call that built it plus the transform's layout and each store's
epoch (:meth:`OutputSet.__reduce__`), and opens every store there.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sparkonce.commit.base import Staged, Stager
from sparkonce.commit.committer import Committer
from sparkonce.config import Guarantee, OutputMode
from sparkonce.errors import CheckpointError, ConfigError
from sparkonce.faults import FaultPlan
from sparkonce.ledger.base import BatchContext, CommitResult, LedgerEntry, LedgerStore, Owner
from sparkonce.offsets import BatchRanges, Coverage, TopicPartition, classify
from sparkonce.outputs.combine import OUTPUT_TAG, OutputLayout, check_output_mode, select_output
from sparkonce.outputs.combine import check_output_name as _check_name
from sparkonce.sinks.base import Sink

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from sparkonce.files import ArrowSettings
    from sparkonce.outputs.stable import BatchKey, StableOutput

log = logging.getLogger(__name__)

SINGLE_OUTPUT = "output"
"""The output name of a single-sink pipeline run with stable output."""

DEAD_LETTER_EXTRA = ("pipeline", "batch_seq")


def is_dead_letter_schema(schema: StructType) -> bool:
    """Whether ``schema`` is exactly the dead-letter columns (``Parsed.bad``)."""
    from sparkonce.outputs.quality import DEAD_LETTER_SCHEMA

    return [(f.name, f.dataType) for f in schema.fields] == [
        (f.name, f.dataType) for f in DEAD_LETTER_SCHEMA.fields
    ]


def with_dead_letter_columns(schema: StructType) -> StructType:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    extra = [StructField("pipeline", StringType()), StructField("batch_seq", LongType())]
    return StructType([*schema.fields, *extra])


class _Group:
    """The outputs whose sinks share one store (one ledger, one transaction)."""

    def __init__(self, key: Hashable, first: str, sink: Sink) -> None:
        self.key = key
        self.names: list[str] = [first]
        self.sinks: list[Sink] = [sink]
        self.committer: Committer | None = None
        self.epoch: int | None = None

    def describe(self) -> str:
        return (
            self.sinks[0].describe()
            if len(self.sinks) == 1
            else " + ".join(s.describe() for s in self.sinks)
        )


class _GroupStager(Stager):
    """Stages and publishes every output of one group, each with its own sink's stager."""

    def __init__(self, owner: OutputSet, group: _Group) -> None:
        self.owner = owner
        self.group = group
        self.stagers: list[Stager] = [s.committer_parts()[1] for s in group.sinks]

    def prepare(self, ctx: BatchContext, df: DataFrame, seq: int) -> Staged:
        parts: list[Staged | None] = []
        rows: dict[str, int] = {}
        for name, stager in zip(self.group.names, self.stagers, strict=True):
            out = self.owner.output_rows(df, name, ctx, seq)
            staged = stager.prepare(ctx, out, seq)
            parts.append(staged)
            rows[name] = staged.rows
        return Staged(sum(rows.values()), parts, {"rows": rows})

    def prepare_from(self, ctx: BatchContext, source: _BatchRows, seq: int) -> Staged:
        """Stage the group's outputs from the batch's rows: from the Arrow copy when the
        batch was collected on the driver, else from the DataFrame (:meth:`prepare`)."""
        if not source.on_driver:
            return self.prepare(ctx, source.rows(), seq)
        tables = source.tables()
        parts: list[Staged | None] = []
        rows: dict[str, int] = {}
        for name, stager in zip(self.group.names, self.stagers, strict=True):
            out = self.owner.output_arrow(tables, name, ctx, seq)
            # The schema the DataFrame path would give (analysis only; nothing runs).
            schema = self.owner.output_rows(source.df, name, ctx, seq).schema
            staged = stager.prepare_arrow(ctx, out, schema, seq)
            parts.append(staged)
            rows[name] = staged.rows
        return Staged(sum(rows.values()), parts, {"rows": rows})

    def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        for stager, part in zip(self.stagers, staged.payload, strict=True):
            stager.publish(txn, ctx, part)

    def counted(self, staged: Staged) -> Staged:
        """The group's counts from its outputs' own, once the transaction committed: a
        Delta output's rows are counted by Delta's write, at the commit (step 5)."""
        parts = [
            stager.counted(part) for stager, part in zip(self.stagers, staged.payload, strict=True)
        ]
        rows = staged.notes.setdefault("rows", {})
        for name, part in zip(self.group.names, parts, strict=True):
            rows[name] = part.rows
        staged.rows = sum(part.rows for part in parts)
        written = [part.written for part in parts]
        if any(w is not None for w in written):
            staged.written = sum(
                p.rows if w is None else w for p, w in zip(parts, written, strict=False)
            )
        return staged

    def abort(self, ctx: BatchContext, staged: Staged | None) -> None:
        parts = staged.payload if staged is not None else [None] * len(self.stagers)
        for stager, part in zip(self.stagers, parts, strict=True):
            try:
                stager.abort(ctx, part)
            except Exception as exc:  # best effort, like every abort
                log.warning("pipeline %s: cleaning up after a failed batch: %s", ctx.pipeline, exc)

    def after_commit(self, ctx: BatchContext) -> None:
        for stager in self.stagers:
            stager.after_commit(ctx)

    def after_failed_commit(self) -> str:
        texts = dict.fromkeys(s.after_failed_commit() for s in self.stagers)
        return " ".join(texts)

    def keeps_empty_no_data_batches(self) -> bool:
        return any(s.keeps_empty_no_data_batches() for s in self.stagers)


class OutputSet(Sink):
    """Named outputs, each with its own sink, committed per store (see the module docstring).

    Guarantee: **effectively-once** for every output whose sink is effectively-once, as
    each of those sinks states it, with these limits:

    * outputs in one store commit together (one transaction); outputs in different stores
      commit one store after the other, so a reader of two stores can, for a moment, see a
      batch in one and not yet in the other (each store alone is always consistent);
    * with stable output (the default across stores) every store gets the same rows of a
      batch even from a non-deterministic transform; without it, only deterministic
      columns are sure to agree across stores after a replay;
    * a run whose checkpoint was lost while the stores' ledgers disagree is refused.
    """

    guarantee: ClassVar[Guarantee] = "effectively-once"

    def __init__(
        self,
        outputs: Mapping[str, Sink],
        *,
        stable: bool | None = None,
        stable_root: str | Path | None = None,
        checkpoint: str | Path | None = None,
        single: bool = False,
    ) -> None:
        if not isinstance(outputs, Mapping) or not outputs:
            raise ConfigError(
                "outputs must be a non-empty mapping {name: sink}, for example "
                "outputs={'totals': PostgresSink(...), 'dead_letters': PostgresSink(...)}"
            )
        self.outputs: dict[str, Sink] = {}
        seen: dict[int, str] = {}
        for name, sink in outputs.items():
            _check_name(name)
            if not isinstance(sink, Sink) or isinstance(sink, OutputSet):
                raise ConfigError(
                    f"output {name!r}: its sink must be a sparkonce Sink (for example "
                    f"SQLiteSink), got {type(sink).__name__}"
                )
            if id(sink) in seen:
                raise ConfigError(
                    f"outputs {seen[id(sink)]!r} and {name!r} are the same sink object; give "
                    "each output a sink of its own (a table or topic each)"
                )
            seen[id(sink)] = name
            self.outputs[name] = sink
        self.single = single
        self.groups = self._group()
        self.stable = len(self.groups) > 1 if stable is None else bool(stable)
        self.stable_root = None if stable_root is None else str(stable_root)
        self.checkpoint = None if checkpoint is None else str(checkpoint)
        self.layout: OutputLayout | None = None
        self.aliases: dict[str, str] = {}
        self._warned = False
        self._stable: StableOutput | None = None
        # How a late output reads the checkpoint's offset log where there is no JVM (a
        # Spark Connect batch function sets it for a checkpoint that is not a local path).
        self.files: ArrowSettings | None = None

    # -- construction ----------------------------------------------------------------------
    def _group(self) -> list[_Group]:
        groups: dict[Hashable, _Group] = {}
        targets: dict[tuple[Hashable, str], str] = {}
        for name, sink in self.outputs.items():
            key = sink.store_key()
            if key is None:
                key = ("own", id(sink))
            target = getattr(sink, "table", None) or getattr(sink, "topic", None)
            if target is not None:
                other = targets.setdefault((key, str(target)), name)
                if other != name:
                    raise ConfigError(
                        f"outputs {other!r} and {name!r} both write {target!r} in "
                        f"{sink.describe()}; give each output its own table or topic"
                    )
            group = groups.get(key)
            if group is None:
                groups[key] = _Group(key, name, sink)
                continue
            first = group.sinks[0]
            user = getattr(getattr(first, "url", None), "user", None)
            if user != getattr(getattr(sink, "url", None), "user", None):
                raise ConfigError(
                    f"outputs {group.names[0]!r} and {name!r} write to the same database as "
                    "different users; one transaction commits both, so give them the same "
                    "user in their URLs"
                )
            group.names.append(name)
            group.sinks.append(sink)
        return list(groups.values())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.outputs)

    def use_layout(self, layout: OutputLayout, aliases: Mapping[str, str] | None = None) -> None:
        """The combined query's layout (the runner sets it before :meth:`validate`).

        ``aliases`` maps an output to the output whose rows it shares: the transform
        returned the same DataFrame object for both, so the query computes it once and
        both sinks get the same rows (the same values of non-deterministic columns).
        """
        aliases = dict(aliases or {})
        if set(layout.names) | set(aliases) != set(self.outputs) or any(
            a not in layout.names for a in aliases.values()
        ):
            raise ConfigError(
                f"the transform returned outputs {[*layout.names, *aliases]}, but the pipeline "
                f"declares {list(self.outputs)}; return exactly one DataFrame per declared output"
            )
        self.layout = layout
        self.aliases = aliases

    # -- pickling (a Spark Connect batch function carries the set to the server) -----------
    def __reduce__(self) -> tuple[Any, ...]:
        """The set pickles as the call that built it (its sinks too, each unopened:
        :meth:`Sink.__reduce__`), plus what the run added since: the transform's layout and
        aliases, and the epoch each store's group took at :meth:`acquire`. A Spark Connect
        batch function needs all three where it runs, in the server's Python worker: each
        group commits with its own store's epoch, which may differ from the first store's
        (the batch function's own); without it the copy could not be fenced in that store.
        No connection, committer or stable-output handle travels: :meth:`open` makes them
        again."""
        rebuild, args = super().__reduce__()
        state = {
            "layout": self.layout,
            "aliases": dict(self.aliases),
            "epochs": [group.epoch for group in self.groups],
        }
        return (rebuild, args, state)

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.layout = state["layout"]
        self.aliases = dict(state["aliases"])
        for group, epoch in zip(self.groups, state["epochs"], strict=True):
            group.epoch = epoch

    def use_stable_task_numbers(self, stable: bool) -> None:
        for sink in self.outputs.values():
            sink.use_stable_task_numbers(stable)

    # -- the Sink hooks the runner calls ---------------------------------------------------
    def use_faults(self, faults: FaultPlan) -> None:
        super().use_faults(faults)
        for sink in self.outputs.values():
            sink.use_faults(faults)
        for group in self.groups:
            if group.committer is not None:
                group.committer.faults = faults

    def open(self) -> None:
        for sink in self.outputs.values():
            sink.open()
        for group in self.groups:
            if group.committer is None:
                store: LedgerStore = group.sinks[0].committer_parts()[0]
                group.committer = Committer(store, _GroupStager(self, group), faults=self.faults)
        if self._warned:  # commit() opens again each batch: say it once per run
            return
        self._warned = True
        for name, sink in self.outputs.items():
            if sink.guarantee != "effectively-once":
                log.warning(
                    "output %s: sink %s is only %s; replays after a failure may write twice",
                    name,
                    sink.describe(),
                    sink.guarantee,
                )
        if len(self.groups) > 1 and not self.stable:
            log.warning(
                "outputs in %d stores without stable output: after a crash between two stores' "
                "commits the batch is recomputed for the stores that missed it, so columns a "
                "non-deterministic transform computes (rand, uuid, current_timestamp, lookups) "
                "can differ between stores; only deterministic columns agree",
                len(self.groups),
            )

    def close(self) -> None:
        for sink in self.outputs.values():
            sink.close()

    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        """Take a new epoch in every store, in declaration order; returns the first store's."""
        first: Owner | None = None
        for group in self.groups:
            owner = group.sinks[0].acquire(pipeline, source)
            for sink in group.sinks[1:]:
                sink.after_acquire(pipeline, owner)
            group.epoch = owner.epoch
            first = first or owner
        assert first is not None
        return first

    def store_ends(self, pipeline: str) -> list[tuple[str, dict[TopicPartition, int]]]:
        """Each store's ledger end for ``pipeline``, in declaration order."""
        return [(g.describe(), g.sinks[0].end_offsets(pipeline)) for g in self.groups]

    def end_offsets(self, pipeline: str) -> dict[TopicPartition, int]:
        """The point every store's ledger has reached (their common end when they agree)."""
        ends = [e for _, e in self.store_ends(pipeline)]
        lowest = {tp: min(e.get(tp, 0) for e in ends) for tp in set().union(*ends)}
        return {tp: o for tp, o in lowest.items() if o}

    def check_stores_agree(self, pipeline: str, checkpoint: str) -> None:
        """Refuse to resume from the ledgers alone when they end at different offsets."""
        ends = self.store_ends(pipeline)
        if len({BatchRanges.at(e).to_json() for _, e in ends}) <= 1:
            return
        listing = "; ".join(f"{d}: {BatchRanges.at(e) if e else 'empty'}" for d, e in ends)
        raise CheckpointError(
            f"pipeline {pipeline!r}: the checkpoint {checkpoint} is empty and the outputs' "
            f"stores end at different offsets ({listing}). The run that stopped between two "
            "stores' commits left the batch to replay in the lost checkpoint; a new query "
            "would plan other batches, which the stores that are ahead could not match. "
            "Nothing was changed (no epoch was taken). Operator action: restore the "
            "checkpoint directory, or bring the stores to the same point (delete the newer "
            "batches' rows and ledger entries in the stores that are ahead)."
        )

    def validate(self, schema: StructType, output_mode: OutputMode = "append") -> None:
        """Check every output against its sink (driver, before any epoch is taken)."""
        layout = self._layout()
        check_output_mode(layout, output_mode)
        for name, sink in self.outputs.items():
            sink.validate(self.output_schema(name), output_mode)

    def commit(self, ctx: BatchContext, df: DataFrame) -> CommitResult:
        """Commit one batch in every store, from one copy of its rows (see the module doc)."""
        self.open()
        source = _BatchRows(self, ctx, df)
        results: list[CommitResult] = []
        rows: dict[str, int] = {}
        try:
            for group in self.groups:
                assert group.committer is not None and group.epoch is not None
                gctx = dataclasses.replace(ctx, epoch=group.epoch)
                stager = group.committer.stager
                assert isinstance(stager, _GroupStager)
                staged: list[Staged] = []
                stage = functools.partial(_staged, stager, gctx, source, staged)
                result = group.committer.commit_with(gctx, stage)
                results.append(result)
                if not result.skipped:
                    # Counted after the commit (the committer's ``counted``): a Delta
                    # output's rows are known once Delta's write committed.
                    rows.update(staged[0].notes.get("rows", {}))
            if ctx.stateful and not source.executed:
                # Spark commits a batch's state stores only when its DataFrame runs in full.
                df.write.format("noop").mode("overwrite").save()
        finally:
            source.release()
        if self._stable is not None and not all(r.skipped and r.seq is None for r in results):
            self._collect(ctx)
        committed = [r for r in results if not r.skipped]
        if not committed:
            first = results[0]
            empty = all(r.empty for r in results)
            return CommitResult(True, 0, first.seq, first.reason, per_output={}, empty=empty)
        total = sum(r.row_count for r in committed)
        written = sum(r.written for r in committed)
        return CommitResult(
            False,
            total,
            committed[0].seq,
            "" if len(committed) == len(results) else "committed in the stores that missed it",
            per_output=rows,
            rows_written=None if written == total else written,
        )

    # -- reading ---------------------------------------------------------------------------
    def owner(self, pipeline: str) -> Owner | None:
        return self.groups[0].sinks[0].owner(pipeline)

    def ledger(self, pipeline: str) -> list[LedgerEntry]:
        """The ledger of the first store (every store has one; see :meth:`store_ends`)."""
        return self.groups[0].sinks[0].ledger(pipeline)

    def last_entry(self, pipeline: str) -> LedgerEntry | None:
        return self.groups[0].sinks[0].last_entry(pipeline)

    def pipelines(self) -> list[str]:
        """Every pipeline that took an epoch in any of the outputs' stores, each once."""
        names: dict[str, None] = {}
        for group in self.groups:
            names.update(dict.fromkeys(group.sinks[0].pipelines()))
        return list(names)

    def spark_conf(self) -> dict[str, str]:
        from sparkonce.spark.session import merge_spark_conf

        return merge_spark_conf(*(sink.spark_conf() for sink in self.outputs.values()))

    def describe(self) -> str:
        inner = ", ".join(f"{n}={s.describe()}" for n, s in self.outputs.items())
        stable = ", stable output" if self.stable else ""
        return f"outputs({inner}{stable})"

    def __repr__(self) -> str:
        return self.describe()

    # -- per batch -------------------------------------------------------------------------
    def _layout(self) -> OutputLayout:
        if self.layout is None:
            raise ConfigError(
                "OutputSet: no layout yet; the runner sets it from the transform's outputs "
                "before validating (use Pipeline(outputs=...), not OutputSet directly)"
            )
        return self.layout

    def output_schema(self, name: str) -> StructType:
        """The columns output ``name`` commits (a dead-letter output's two extra included,
        a late output's helper column replaced by its three)."""
        from pyspark.sql.types import IntegerType, StructField, StructType, TimestampType

        from sparkonce.outputs import late

        schema = self._layout().schemas[self.aliases.get(name, name)]
        if is_dead_letter_schema(schema):
            return with_dead_letter_columns(schema)
        if late.is_late_branch(schema):
            kept = [f for f in schema.fields if f.name != late.LATE_COLUMN]
            extra = [
                StructField(late.WATERMARK_COLUMN, TimestampType()),
                StructField(late.WINDOWS_COLUMN, IntegerType()),
                StructField(late.LATE_WINDOWS_COLUMN, IntegerType()),
            ]
            return StructType([*kept, *extra])
        return schema

    def output_rows(self, batch: DataFrame, name: str, ctx: BatchContext, seq: int) -> DataFrame:
        """Output ``name``'s rows of a combined batch, as its sink commits them."""
        from pyspark.sql import functions as F

        from sparkonce.outputs import late

        layout = self._layout()
        branch = self.aliases.get(name, name)
        out = select_output(batch, layout, branch)
        if is_dead_letter_schema(layout.schemas[branch]):
            out = out.withColumn("pipeline", F.lit(ctx.pipeline)).withColumn(
                "batch_seq", F.lit(seq).cast("bigint")
            )
        elif late.is_late_branch(layout.schemas[branch]):
            # The records Spark's aggregation dropped in this batch: behind the watermark
            # the batch ran with (from the offset log's previous entry; fixed on replay).
            if self.checkpoint is None:
                raise ConfigError("OutputSet: a late output needs the pipeline's checkpoint")
            watermark = late.batch_watermark_ms(
                self.checkpoint, ctx.spark_batch_id, settings=self.files
            )
            out = late.filter_late(out, watermark)
        return out

    def output_arrow(
        self, tables: Mapping[str, pa.Table], name: str, ctx: BatchContext, seq: int
    ) -> pa.Table:
        """Output ``name``'s rows, from the batch's outputs collected as Arrow tables (one
        per branch): the same rows and columns :meth:`output_rows` gives."""
        import pyarrow as pa

        branch = self.aliases.get(name, name)
        out = tables[branch]
        if is_dead_letter_schema(self._layout().schemas[branch]):
            n = out.num_rows
            out = out.append_column("pipeline", pa.array([ctx.pipeline] * n, pa.string()))
            out = out.append_column("batch_seq", pa.array([seq] * n, pa.int64()))
        return out

    def collect_tables(self, batch: DataFrame) -> dict[str, pa.Table]:
        """Each branch's rows of a combined ``batch``, collected on the driver as Arrow.

        The batch is persisted for the collection, so it runs once."""
        layout = self._layout()
        cached = batch.persist()
        try:
            return {b: select_output(cached, layout, b).toArrow() for b in layout.names}
        finally:
            cached.unpersist()

    def combined_from_tables(self, batch: DataFrame, tables: Mapping[str, pa.Table]) -> DataFrame:
        """A combined DataFrame holding the branches' collected rows (for sinks that stage in
        Spark, given a copy an earlier run wrote on the driver)."""
        from sparkonce.outputs.combine import combine, nullable_type

        layout = self._layout()
        spark = batch.sparkSession
        frames = {
            b: spark.createDataFrame(
                tables[b],  # type: ignore[call-overload]  # pyarrow Tables are accepted
                schema=nullable_type(layout.schemas[b]),
            )
            for b in layout.names
        }
        combined, _ = combine(frames)
        return combined

    def uses_driver_copy(self) -> bool:
        """Whether stable copies are collected and written on the driver (pyarrow): every
        sink collects its rows on the driver anyway and no output needs Spark to select
        its rows (a late-data output does)."""
        from sparkonce.outputs import late

        layout = self._layout()
        return (
            self.stable
            and all(s.committer_parts()[1].stages_on_driver for s in self.outputs.values())
            and not any(late.is_late_branch(schema) for schema in layout.schemas.values())
        )

    def stable_output(self) -> StableOutput:
        if self._stable is None:
            from sparkonce.outputs.stable import StableOutput

            if self.stable_root is None:
                raise ConfigError("OutputSet: stable output needs a directory (stable_root)")
            self._stable = StableOutput(self.stable_root)
        return self._stable

    def _collect(self, ctx: BatchContext) -> None:
        """Delete the copies every store's ledger now covers (this batch's and older)."""
        assert self._stable is not None
        ends = self.end_offsets(ctx.pipeline)

        def covered(key: Any) -> bool:
            if key.checkpoint_id == (ctx.checkpoint_id or "") and key.spark_batch_id <= (
                ctx.spark_batch_id
            ):
                return True
            ranges = BatchRanges.from_json(key.ranges_json)
            return not ranges.empty and classify(ranges, ends) is Coverage.COMMITTED

        try:
            self._stable.collect(covered)
        except Exception as exc:  # the copies are only disk space: never fail a commit here
            log.warning("pipeline %s: collecting stable copies failed: %s", ctx.pipeline, exc)


def _staged(
    stager: _GroupStager, ctx: BatchContext, source: _BatchRows, staged: list[Staged], seq: int
) -> Staged:
    made = stager.prepare_from(ctx, source, seq)
    staged[:] = [made]
    return made


class _BatchRows:
    """The batch's combined rows for the groups that commit it: made once, on first use."""

    def __init__(self, owner: OutputSet, ctx: BatchContext, df: DataFrame) -> None:
        self.owner = owner
        self.ctx = ctx
        self.df = df
        self.executed = False
        self.on_driver = owner.uses_driver_copy()
        self._rows: DataFrame | None = None
        self._tables: dict[str, pa.Table] | None = None
        self._persisted = False

    def _key(self) -> BatchKey:
        from sparkonce.outputs.stable import BatchKey

        return BatchKey(
            self.ctx.checkpoint_id or "", self.ctx.spark_batch_id, self.ctx.ranges.to_json()
        )

    def tables(self) -> dict[str, pa.Table]:
        """Each branch's rows collected on the driver, from the batch's stable copy (written
        now, or read back on a replay)."""
        if self._tables is None:
            stable = self.owner.stable_output()
            key = self._key()
            if stable.copy_writer(key) == "spark":  # an earlier run's copy, by Spark's writer
                copy = stable.get(self.df.sparkSession, key)
                assert copy is not None
                self._tables = self.owner.collect_tables(copy)
            else:
                self._tables = stable.put_tables(key, self.df.schema, self._collect_once)
        return self._tables

    def _collect_once(self) -> dict[str, pa.Table]:
        self.executed = True
        return self.owner.collect_tables(self.df)

    def rows(self) -> DataFrame:
        if self._rows is not None:
            return self._rows
        if self.owner.stable:
            stable = self.owner.stable_output()
            key = self._key()
            if stable.copy_writer(key) == "arrow":  # an earlier run's copy, from the driver
                self._rows = self.owner.combined_from_tables(self.df, self.tables())
                return self._rows
            copy = stable.get(self.df.sparkSession, key)
            if copy is None:
                copy = stable.put(self.df, key, partition_by=OUTPUT_TAG)
                self.executed = True
            self._rows = copy
        else:
            self._rows = self.df.persist()
            self._persisted = True
            self.executed = True  # the groups' stagers run it
        return self._rows

    def release(self) -> None:
        self._tables = None
        if self._persisted and self._rows is not None:
            self._rows.unpersist()
