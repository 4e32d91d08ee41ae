"""The reference run: the pipeline's transform through Spark alone, as a second oracle.

The campaign's oracle is a failure-free *sparkonce* run, so a bug in sparkonce's
own commit logic (a batch wrongly skipped as a replay, say) loses the same rows
in the oracle and in every trial, and the trials pass. An oracle must not share
the code it checks. So before the trials, the campaign runs the pipeline once
more without any of it:

- the source's plain stream (``source.stream(spark, None)``: the input, not the
  code under test; for several sources, each member's, as ``{name: DataFrame}``)
  goes through ``pipeline.transform``, with the pipeline's output mode,
  ``availableNow`` and a fresh checkpoint of its own. A plan with an event-time
  watermark reads the source's aligned twin instead, by the runner's own rule
  (:func:`sparkonce.pipeline.query.aligned_source`): such a query's output depends
  on where batch boundaries fall (a late record is dropped or kept by the
  watermark of the batch it lands in), so the reference must cut the input into
  the batches the runner plans. The rule is how the input is read, not commit code;
- ``writeStream.foreachBatch`` appends each micro-batch's rows (``toArrow``, in
  canonical form, see :mod:`sparkonce.verify.compare`) as one JSON line
  ``{"batch": ID, "rows": [...]}`` to a file: no sink, no ledger, no runner;
- this module then applies the sink's write semantics itself
  (:func:`apply_semantics`): append keeps every row, upsert keeps the last write
  per key in batch order, and Spark's complete output mode keeps the last batch.

The failure-free sparkonce run must equal that reference; if it does not, the
campaign fails before any trial (:class:`ReferenceMismatchError`); if the two runs
planned other batches (:func:`first_batch_apart`, the reference's offset log against
the ledger), the message names the first and blames the boundaries, not the sink. The trials
then compare with the failure-free run, which the check proved equal to the
reference and which reads back in the sink's own representation.

Several outputs (``Pipeline(outputs=...)``): the transform's ``{name: DataFrame}``
is folded into one query as the runner does (:func:`~sparkonce.outputs.combine.combine`;
outputs given the same DataFrame object share one branch), and each micro-batch's
combined rows are collected once and taken apart by their output tag in Python, so
the reference shares no commit code and no ``split`` with the runner. Each line is
then ``{"batch": ID, "outputs": {NAME: [...]}}``, and ``outputs.json`` beside the
file names each output's columns and whether it is a dead-letter output. Each output
gets its own sink's semantics (append, or upsert by its keys) and is compared with
that output's rows. A dead-letter output's sink adds ``pipeline`` and ``batch_seq``
(the ledger entry of the batch), which the reference cannot know: ``batch_seq``
depends on how the input was cut into batches, not on the transform. Dead letters
are compared on their other columns. A late output
(:func:`~sparkonce.outputs.late.late_records`) keeps, as the runner's does, the records
the batch's aggregation dropped by the watermark in the offset log, here the
reference run's own checkpoint's (the definition of late in
:mod:`sparkonce.outputs.late`, not commit code).

The reference assumes a **deterministic transform** (DESIGN.md, section 1):
clocks, random numbers or external lookups give another output in each run, and
then the reference differs from the failure-free run whatever sparkonce does.
Columns the user declares non-deterministic (``--nondeterministic``) are left out
of the comparison on both sides; when the runs differ in some columns only,
the message names them (:func:`sparkonce.verify.checks.suspect_columns`) so the
user can declare them. The run happens in a child process
(:mod:`sparkonce.verify.reference_run`) with the same Spark session settings as
``sparkonce run``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sparkonce.errors import ConfigError, PipelineError, VerificationError
from sparkonce.offsets import BatchRanges
from sparkonce.outputs.combine import nullable_type
from sparkonce.verify.checks import suspect_columns, without
from sparkonce.verify.compare import RowDiff, canonical_value, diff_rows

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from sparkonce.pipeline.pipeline import Pipeline
    from sparkonce.sources.base import Source

log = logging.getLogger("sparkonce.verify.reference")

Semantics = Literal["append", "upsert", "complete"]
ENTRY = ("sparkonce.verify.reference_run",)  # ``python -m`` module of the child process
OUTPUTS_FILE = "outputs.json"  # beside the rows file: each output's columns (several outputs)
START_ATTEMPTS = 3  # Spark gives its Python planner worker 10 s to connect back
_WORKER_START_TIMEOUT = "Python worker failed to connect back"


class ReferenceMismatchError(VerificationError):
    """The failure-free sparkonce run differs from Spark's plain ``foreachBatch`` run.

    With no fault at all, sparkonce lost, added or changed rows: a bug in the
    sink or in sparkonce's commit logic (or a non-deterministic transform). The
    trials were not run: they compare against the failure-free run.
    """

    def __init__(self, message: str, check: ReferenceCheck) -> None:
        super().__init__(message)
        self.check = check


# -- in the child process ----------------------------------------------------------------
class BatchRecorder:
    """The ``foreachBatch`` function of the reference run (on the driver).

    Appends one JSON line per micro-batch, no-data batches included. A batch
    written twice (a query started again from its checkpoint) counts once: the
    reader keeps the last line of each batch id.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.batches = 0

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = df.toArrow().to_pylist()
        line = {
            "batch": batch_id,
            "rows": [{k: canonical_value(v) for k, v in r.items()} for r in rows],
        }
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        self.batches += 1


class OutputsRecorder:
    """The ``foreachBatch`` function of a reference run with several outputs (driver).

    Collects the combined batch once (``toArrow``) and takes each row's output from
    its tag column; an output that shares another's branch gets the same rows. A late
    output (:func:`~sparkonce.outputs.late.late_records`) keeps the records the batch's
    aggregation dropped, by the reference run's own checkpoint
    (:func:`~sparkonce.outputs.late.filter_late` with
    :func:`~sparkonce.outputs.late.batch_watermark_ms`): the definition of "late", not
    commit code.
    """

    def __init__(
        self,
        path: Path,
        names: Sequence[str],
        aliases: Mapping[str, str],
        *,
        layout: Any = None,
        late: Sequence[str] = (),
        checkpoint: Path | None = None,
    ) -> None:
        self.path = path
        self.names = tuple(names)
        self.aliases = dict(aliases)
        self.layout = layout
        self.late = tuple(late)
        self.checkpoint = checkpoint
        self.batches = 0

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        from sparkonce.outputs.combine import OUTPUT_TAG, select_output

        rows: dict[str, list[dict[str, Any]]] = {n: [] for n in self.names}
        if self.late:
            df = df.persist()  # read once, for the late outputs and the others
        try:
            rest = df.where(~F.col(OUTPUT_TAG).isin(*self.late)) if self.late else df
            for r in _collect(rest):
                tag = r[OUTPUT_TAG]
                inner = r.get(tag) or {}
                rows[tag].append({k: canonical_value(v) for k, v in inner.items()})
            for name in self.late:
                from sparkonce.outputs.late import batch_watermark_ms, filter_late

                assert self.checkpoint is not None
                watermark = batch_watermark_ms(self.checkpoint, batch_id)
                dropped = filter_late(select_output(df, self.layout, name), watermark)
                rows[name] = [
                    {k: canonical_value(v) for k, v in r.items()} for r in _collect(dropped)
                ]
        finally:
            if self.late:
                df.unpersist()
        for name, branch in self.aliases.items():
            rows[name] = rows[branch]
        line = {"batch": batch_id, "outputs": rows}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        self.batches += 1


def _collect(df: DataFrame) -> list[dict[str, Any]]:
    """``df``'s rows as dicts, through Arrow. Arrow refuses a NULL struct (another output's
    row) whose fields are NOT NULL: every field is made nullable first (no value changes)."""
    from pyspark.sql import functions as F

    loose = df.select(
        *[F.col(f"`{f.name}`").cast(nullable_type(f.dataType)).alias(f.name) for f in df.schema]
    )
    rows: list[dict[str, Any]] = loose.toArrow().to_pylist()
    return rows


def _outputs_query(
    pipeline: Pipeline, result: object, out: Path, checkpoint: Path
) -> tuple[DataFrame, OutputsRecorder]:
    """The combined query of a pipeline with ``outputs``, and its recorder. Writes the
    outputs' columns to ``outputs.json`` beside ``out``."""
    from pyspark.sql import DataFrame

    from sparkonce.outputs import late
    from sparkonce.outputs.combine import combine
    from sparkonce.outputs.output_set import DEAD_LETTER_EXTRA, is_dead_letter_schema

    names = list(pipeline.outputs or ())
    if not isinstance(result, Mapping):
        raise ConfigError(
            f"pipeline {pipeline.name!r}: with outputs={names} the transform must return "
            f"{{name: DataFrame}} with one streaming DataFrame per output, got "
            f"{type(result).__name__}"
        )
    if sorted(result) != sorted(names):
        raise ConfigError(
            f"pipeline {pipeline.name!r}: the transform returned outputs {list(result)}, but "
            f"the pipeline declares {names}"
        )
    branches: dict[str, DataFrame] = {}
    aliases: dict[str, str] = {}
    for name in names:
        df = result[name]
        if not isinstance(df, DataFrame) or not df.isStreaming:
            raise ConfigError(
                f"pipeline {pipeline.name!r}: output {name!r} must be a streaming DataFrame "
                f"derived from the transform's input, got {type(df).__name__}"
            )
        same = next((b for b, other in branches.items() if other is df), None)
        if same is None:
            branches[name] = df
        else:
            aliases[name] = same
    combined, layout = combine(branches)
    schemas = {}
    for name in names:
        schema = layout.schemas[aliases.get(name, name)]
        dead = is_dead_letter_schema(schema)
        columns = [f.name for f in schema.fields]
        if dead:
            columns += list(DEAD_LETTER_EXTRA)
        elif late.is_late_branch(schema):
            columns = [c for c in columns if c != late.LATE_COLUMN]
            columns += [late.WATERMARK_COLUMN, late.WINDOWS_COLUMN, late.LATE_WINDOWS_COLUMN]
        schemas[name] = {"columns": columns, "dead_letter": dead}
    out.with_name(OUTPUTS_FILE).write_text(json.dumps(schemas, indent=2))
    late_branches = [b for b in branches if late.is_late_branch(layout.schemas[b])]
    recorder = OutputsRecorder(
        out, names, aliases, layout=layout, late=late_branches, checkpoint=checkpoint
    )
    return combined, recorder


def record(pipeline: Pipeline, spark: SparkSession, out: Path, checkpoint: Path) -> int:
    """Run ``pipeline``'s transform with plain Spark into ``out``; the batches written.

    Nothing of sparkonce's runner, sinks or ledger runs here.
    """
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import DataFrame

    from sparkonce.pipeline.query import aligned_source

    result = _transform(pipeline, pipeline.source, spark)
    frames = result.values() if isinstance(result, Mapping) else [result]
    aligned = aligned_source(
        pipeline.source, [df for df in frames if isinstance(df, DataFrame) and df.isStreaming]
    )
    if aligned is not None:  # the runner's read rule: its batches, not Spark's plain ones
        result = _transform(pipeline, aligned, spark)
    recorder: BatchRecorder | OutputsRecorder
    if pipeline.outputs is not None:
        result, recorder = _outputs_query(pipeline, result, out, checkpoint)
    elif not isinstance(result, DataFrame) or not result.isStreaming:
        raise ConfigError(
            f"pipeline {pipeline.name!r}: transform must return the streaming DataFrame "
            f"derived from its input, got {type(result).__name__}"
        )
    else:
        recorder = BatchRecorder(out)
    writer = (
        result.writeStream.foreachBatch(recorder)
        .option("checkpointLocation", str(checkpoint))
        .outputMode(pipeline.output_mode)
        .trigger(availableNow=True)
    )
    for attempt in range(1, START_ATTEMPTS + 1):
        query = writer.start()
        try:
            query.awaitTermination()
            break
        except StreamingQueryException as exc:
            if _WORKER_START_TIMEOUT in str(exc) and attempt < START_ATTEMPTS:
                log.warning("reference run: Spark's Python worker was late; starting again")
                continue
            raise PipelineError(
                f"pipeline {pipeline.name!r}: the reference run (plain Spark foreachBatch) "
                f"failed: {str(exc).strip().splitlines()[0][:500]}"
            ) from exc
    return recorder.batches


def _transform(pipeline: Pipeline, source: Source, spark: SparkSession) -> object:
    """``pipeline.transform`` over ``source``'s plain stream (several sources: each member's,
    by name, as the transform takes them)."""
    from sparkonce.sources.source_set import SourceSet

    if isinstance(source, SourceSet):
        return pipeline.transform(source.streams(spark, None))
    return pipeline.transform(source.stream(spark, None))


# -- in the campaign's process -------------------------------------------------------------
def read_batches(path: Path) -> dict[int, list[dict[str, Any]]]:
    """The rows of each batch in a reference file (the last line of a batch id wins).

    No file: Spark ran no micro-batch.
    """
    out: dict[int, list[dict[str, Any]]] = {}
    for batch, doc in _lines(path):
        out[batch] = list(doc["rows"])
    return out


def read_output_batches(path: Path) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Each output's rows per batch in the reference file of a pipeline with several
    outputs (the last line of a batch id wins)."""
    out: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for batch, doc in _lines(path):
        for name, rows in doc["outputs"].items():
            out.setdefault(name, {})[batch] = list(rows)
    return out


def _lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    if not path.exists():
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                doc = json.loads(line)
                out.append((int(doc["batch"]), doc))
    return out


def read_output_schemas(path: Path) -> dict[str, dict[str, Any]]:
    """``{output: {"columns": [...], "dead_letter": bool}}`` written beside the rows file of
    a pipeline with several outputs ({} if there is none)."""
    schemas = path.with_name(OUTPUTS_FILE)
    if not schemas.exists():
        return {}
    doc: dict[str, dict[str, Any]] = json.loads(schemas.read_text())
    return doc


def sink_semantics(pipeline: Pipeline) -> tuple[Semantics, tuple[str, ...]]:
    """How the pipeline's sink shows its batches: (semantics, upsert keys).

    For a pipeline with several outputs, see :func:`output_semantics`."""
    if pipeline.output_mode == "complete":
        return "complete", ()
    sink = pipeline.sink
    if pipeline.output_set is not None and pipeline.output_set.single:
        sink = next(iter(pipeline.output_set.outputs.values()))
    return _semantics(sink)


def _semantics(sink: object) -> tuple[Semantics, tuple[str, ...]]:
    keys = tuple(getattr(sink, "keys", ()) or ())
    if getattr(sink, "mode", "append") == "upsert" and keys:
        return "upsert", keys
    return "append", ()


def output_semantics(pipeline: Pipeline) -> dict[str, tuple[Semantics, tuple[str, ...]]]:
    """Each declared output's (semantics, upsert keys), from its own sink."""
    outputs = pipeline.output_set
    if pipeline.outputs is None or outputs is None:
        raise ConfigError(f"pipeline {pipeline.name!r} has no named outputs")
    if pipeline.output_mode == "complete":
        return {name: ("complete", ()) for name in outputs.outputs}
    return {name: _semantics(sink) for name, sink in outputs.outputs.items()}


def apply_semantics(
    batches: Mapping[int, Sequence[Mapping[str, Any]]],
    semantics: Semantics,
    keys: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """What a reader of the sink would see after ``batches``, in batch-id order.

    ``append``: every row of every batch. ``upsert``: the last row written for
    each key. ``complete``: the rows of the last batch (Spark's complete mode
    emits the whole result each time).
    """
    order = sorted(batches)
    if semantics == "complete":
        return [dict(r) for r in batches[order[-1]]] if order else []
    if semantics == "upsert":
        if not keys:
            raise ConfigError("upsert semantics need the sink's key columns")
        latest: dict[tuple[Any, ...], dict[str, Any]] = {}
        for b in order:
            for r in batches[b]:
                latest[tuple(canonical_value(r.get(k)) for k in keys)] = dict(r)
        return list(latest.values())
    return [dict(r) for b in order for r in batches[b]]


def project(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[dict[str, Any]]:
    """``rows`` with exactly ``columns`` (absent ones are NULL).

    The reference is compared on the columns the sink shows: a Kafka sink, for
    one, shows ``key`` and ``value`` and routes by a ``partition`` column.
    """
    return [{c: r.get(c) for c in columns} for r in rows]


@dataclass(frozen=True)
class OutputCheck:
    """One output of a pipeline with several outputs, compared with the reference."""

    diff: RowDiff
    semantics: Semantics
    suspects: tuple[str, ...] = ()  # columns that alone explain the difference
    left_out: tuple[str, ...] = ()  # columns not compared (declared, dead-letter extras)

    def to_json(self) -> dict[str, Any]:
        return {
            "matched": self.diff.matched,
            "rows": self.diff.expected_rows,
            "sparkonce_rows": self.diff.actual_rows,
            "semantics": self.semantics,
            "not_compared": list(self.left_out),
            **({"differing_columns": list(self.suspects)} if self.suspects else {}),
            **self.diff.to_json(),
        }


@dataclass(frozen=True)
class ReferenceCheck:
    """The failure-free sparkonce run compared with the reference run.

    With several outputs, ``outputs`` holds each one's comparison and ``diff`` their
    summed counts (without examples); ``semantics`` is then ``"per output"``.
    ``suspects`` names the columns that alone explain a difference (by output, or
    ``"output"`` for a single sink): see :func:`sparkonce.verify.checks.suspect_columns`.
    """

    diff: RowDiff
    batches: int  # micro-batches of the reference run, no-data batches included
    seconds: float
    semantics: str
    rows_file: str
    outputs: dict[str, OutputCheck] = field(default_factory=dict)
    suspects: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Where the two runs' batches first differ (:func:`first_batch_apart`), "" if they agree
    # or could not be read: then the difference may come from batch boundaries alone.
    batches_apart: str = ""

    @property
    def matched(self) -> bool:
        return self.diff.matched and all(o.diff.matched for o in self.outputs.values())

    @classmethod
    def compare(
        cls,
        reference: Sequence[Mapping[str, Any]],
        sparkonce_rows: Sequence[Mapping[str, Any]],
        key_columns: Sequence[str] = (),
        *,
        batches: int = 0,
        seconds: float = 0.0,
        semantics: Semantics = "append",
        rows_file: str = "",
        left_out: Sequence[str] = (),
    ) -> ReferenceCheck:
        """Compare on the columns the sink shows (all of the reference's if it shows none),
        except those ``left_out`` (declared non-deterministic, a dead-letter output's
        ``pipeline`` and ``batch_seq``)."""
        diff, suspects = _compare(reference, sparkonce_rows, key_columns, left_out)
        found = {"output": suspects} if suspects else {}
        return cls(diff, batches, seconds, semantics, rows_file, suspects=found)

    @classmethod
    def compare_outputs(
        cls,
        reference: Mapping[str, Sequence[Mapping[str, Any]]],
        sparkonce_rows: Mapping[str, Sequence[Mapping[str, Any]]],
        key_columns: Mapping[str, Sequence[str]],
        semantics: Mapping[str, Semantics],
        *,
        left_out: Mapping[str, Sequence[str]] | None = None,
        batches: int = 0,
        seconds: float = 0.0,
        rows_file: str = "",
    ) -> ReferenceCheck:
        """Each output of ``sparkonce_rows`` against its reference rows, on its own keys
        and semantics, with the columns ``left_out`` of that output not compared."""
        left_out = left_out or {}
        outputs: dict[str, OutputCheck] = {}
        for name, rows in sparkonce_rows.items():
            skip = tuple(left_out.get(name, ()))
            diff, suspects = _compare(
                reference.get(name, []), rows, key_columns.get(name, ()), skip
            )
            outputs[name] = OutputCheck(diff, semantics[name], suspects, skip)
        total = RowDiff(
            sum(o.diff.expected_rows for o in outputs.values()),
            sum(o.diff.actual_rows for o in outputs.values()),
            (),
            sum(o.diff.missing for o in outputs.values()),
            sum(o.diff.extra for o in outputs.values()),
            sum(o.diff.mismatched for o in outputs.values()),
        )
        found = {n: o.suspects for n, o in outputs.items() if o.suspects}
        return cls(total, batches, seconds, "per output", rows_file, outputs, found)

    def message(self, pipeline_file: str | Path, log_file: str | Path) -> str:
        d = self.diff
        if self.outputs:
            differ = [n for n, o in self.outputs.items() if not o.diff.matched]
            body = "\n".join(
                f"output {n} ({self.outputs[n].semantics}): "
                + self.outputs[n].diff.describe("reference", "sparkonce")
                for n in differ
            )
            head = f" in outputs {', '.join(differ)}: {d.counts()}.\n"
            batches = f"{self.batches} micro-batches, each output's sink semantics applied"
        else:
            body = d.describe("reference", "sparkonce")
            head = f": {d.counts()}.\n"
            batches = f"{self.batches} micro-batches, {self.semantics} semantics applied"
        if self.batches_apart:
            why = (
                f"\nThe two runs cut the input into other batches ({self.batches_apart}), and "
                "the output of a query with an event-time watermark depends on where batch "
                "boundaries fall (a late record is dropped or kept by the batch it lands in), "
                "so this need not be a bug in the sink. Both read the source by the same rule: "
                "check that nothing wrote to the source while verify ran."
            )
        else:
            why = (
                f"\nWith no fault injected, the sink of {pipeline_file} shows other rows than "
                f"Spark's own engine produced ({batches} by the reference): a bug in the sink "
                "or in sparkonce's commit logic, or a non-deterministic transform."
            )
        return (
            "failure-free sparkonce run differs from Spark's plain foreachBatch reference"
            + head
            + body
            + self._hint()
            + why
            + " The trials were not run, since they compare with the failure-free run. "
            f"Reference rows: {self.rows_file}; its log: {log_file}."
        )

    def _hint(self) -> str:
        if not self.suspects:
            return ""
        columns = list(dict.fromkeys(c for cs in self.suspects.values() for c in cs))
        if self.outputs:
            places = "; ".join(f"{n}: {', '.join(cs)}" for n, cs in self.suspects.items())
            lead = f"\nIn each output named, the rows agree on every column but ({places})."
        else:
            lead = f"\nThe rows agree on every column but {', '.join(columns)}."
        return (
            f"{lead} If the transform computes {'it' if len(columns) == 1 else 'them'} "
            "non-deterministically (uuid(), rand(), current_timestamp(), an external lookup), "
            "every run gives other values, so no run can match another there: declare "
            f"{'it' if len(columns) == 1 else 'them'} with --nondeterministic {','.join(columns)} "
            "and verify checks such columns by count and across outputs instead of by value. "
            "If the transform is deterministic, these values are wrong."
        )

    def to_json(self) -> dict[str, Any]:
        """The ``reference`` section of ``verify.json``."""
        doc = {
            "matched": self.matched,
            "rows": self.diff.expected_rows,
            "sparkonce_rows": self.diff.actual_rows,
            "batches": self.batches,
            "seconds": round(self.seconds, 1),
            "semantics": self.semantics,
            **self.diff.to_json(),
        }
        if self.outputs:
            doc["outputs"] = {n: o.to_json() for n, o in self.outputs.items()}
        elif self.suspects:
            doc["differing_columns"] = list(self.suspects.get("output", ()))
        return doc


def _compare(
    reference: Sequence[Mapping[str, Any]],
    sparkonce_rows: Sequence[Mapping[str, Any]],
    key_columns: Sequence[str],
    left_out: Sequence[str],
) -> tuple[RowDiff, tuple[str, ...]]:
    """(the diff on the shown columns minus ``left_out``, the columns that alone explain it)."""
    skip = set(left_out)
    shown = without(sparkonce_rows, skip)
    if shown:
        columns = list(dict.fromkeys(c for r in shown for c in r))
        reference = project(reference, columns)
    else:
        reference = without(reference, skip)
    keys = () if skip & set(key_columns) else tuple(key_columns)
    diff = diff_rows(reference, shown, keys)
    return diff, () if diff.matched else suspect_columns(reference, shown, keys)


def planned_batches(checkpoint: Path, source: Source) -> list[BatchRanges]:
    """The input ranges of each batch with data that the reference run planned, in batch
    order, from its checkpoint's offset log (by the source's own reading of its offsets)."""
    from sparkonce.spark.checkpoint import Checkpoint

    chk = Checkpoint(checkpoint)
    out = []
    for bid in chk.batch_ids():
        current = chk.source_offset(bid, source)
        if current is None:
            continue
        ranges = source.batch_ranges(chk.previous_offset(bid, source), current)
        if not ranges.empty:
            out.append(ranges)
    return out


def first_batch_apart(
    reference: Sequence[BatchRanges], ledger: Sequence[BatchRanges]
) -> str | None:
    """Where two runs' batches with data first differ, as a sentence; None if they agree.
    Empty ranges are left out: a partition with nothing to read is no boundary."""

    def shown(b: BatchRanges) -> str:
        return str(BatchRanges(tuple(r for r in b.ranges if not r.empty)))

    ours = [b for b in ledger if not b.empty]
    for i in range(max(len(reference), len(ours))):
        ref = shown(reference[i]) if i < len(reference) else "(none)"
        got = shown(ours[i]) if i < len(ours) else "(none)"
        if ref != got:
            return f"batch {i} with data: reference {ref}, sparkonce {got}"
    return None


def load_reference(path: Path, pipeline: Pipeline) -> tuple[list[dict[str, Any]], int]:
    """(rows a reader of the sink would see, batches) from a reference file."""
    batches = read_batches(path)
    semantics, keys = sink_semantics(pipeline)
    return apply_semantics(batches, semantics, keys), len(batches)


def load_output_references(
    path: Path, pipeline: Pipeline
) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """({output: rows a reader of its sink would see}, batches) from the reference file of
    a pipeline with several outputs."""
    per_output = read_output_batches(path)
    batches = {b for rows in per_output.values() for b in rows}
    out = {}
    for name, (semantics, keys) in output_semantics(pipeline).items():
        out[name] = apply_semantics(per_output.get(name, {}), semantics, keys)
    return out, len(batches)


__all__ = [
    "ENTRY",
    "OUTPUTS_FILE",
    "BatchRecorder",
    "OutputCheck",
    "OutputsRecorder",
    "ReferenceCheck",
    "ReferenceMismatchError",
    "apply_semantics",
    "first_batch_apart",
    "load_output_references",
    "load_reference",
    "output_semantics",
    "planned_batches",
    "project",
    "read_batches",
    "read_output_batches",
    "read_output_schemas",
    "record",
    "sink_semantics",
]
