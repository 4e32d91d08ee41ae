"""The reference run: the pipeline's transform through Spark alone, as a second oracle.

The campaign's oracle is a failure-free *sparkonce* run, so a bug in sparkonce's
own commit logic (a batch wrongly skipped as a replay, say) loses the same rows
in the oracle and in every trial, and the trials pass. An oracle must not share
the code it checks. So before the trials, the campaign runs the pipeline once
more without any of it:

- the source's plain stream (``source.stream(spark, None)``: the input, not the
  code under test) goes through ``pipeline.transform``, with the pipeline's
  output mode, ``availableNow`` and a fresh checkpoint of its own;
- ``writeStream.foreachBatch`` appends each micro-batch's rows (``toArrow``, in
  canonical form, see :mod:`sparkonce.verify.compare`) as one JSON line
  ``{"batch": ID, "rows": [...]}`` to a file: no sink, no ledger, no runner;
- this module then applies the sink's write semantics itself
  (:func:`apply_semantics`): append keeps every row, upsert keeps the last write
  per key in batch order, and Spark's complete output mode keeps the last batch.

The failure-free sparkonce run must equal that reference; if it does not, the
campaign fails before any trial (:class:`ReferenceMismatchError`). The trials
then compare with the failure-free run, which the check proved equal to the
reference and which reads back in the sink's own representation.

The reference assumes a **deterministic transform** (DESIGN.md, section 1):
clocks, random numbers or external lookups give another output in each run, and
then the reference differs from the failure-free run whatever sparkonce does.
The run happens in a child process (:mod:`sparkonce.verify.reference_run`) with
the same Spark session settings as ``sparkonce run``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sparkonce.errors import ConfigError, PipelineError, VerificationError
from sparkonce.verify.compare import RowDiff, canonical_value, diff_rows

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from sparkonce.pipeline.pipeline import Pipeline

log = logging.getLogger("sparkonce.verify.reference")

Semantics = Literal["append", "upsert", "complete"]
ENTRY = ("sparkonce.verify.reference_run",)  # ``python -m`` module of the child process
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


def record(pipeline: Pipeline, spark: SparkSession, out: Path, checkpoint: Path) -> int:
    """Run ``pipeline``'s transform with plain Spark into ``out``; the batches written.

    Nothing of sparkonce's runner, sinks or ledger runs here.
    """
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import DataFrame

    stream = pipeline.source.stream(spark, None)
    result = pipeline.transform(stream)
    if not isinstance(result, DataFrame) or not result.isStreaming:
        raise ConfigError(
            f"pipeline {pipeline.name!r}: transform must return the streaming DataFrame "
            f"derived from its input, got {type(result).__name__}"
        )
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


# -- in the campaign's process -------------------------------------------------------------
def read_batches(path: Path) -> dict[int, list[dict[str, Any]]]:
    """The rows of each batch in a reference file (the last line of a batch id wins).

    No file: Spark ran no micro-batch.
    """
    out: dict[int, list[dict[str, Any]]] = {}
    if not path.exists():
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                doc = json.loads(line)
                out[int(doc["batch"])] = list(doc["rows"])
    return out


def sink_semantics(pipeline: Pipeline) -> tuple[Semantics, tuple[str, ...]]:
    """How the pipeline's sink shows its batches: (semantics, upsert keys)."""
    if pipeline.output_mode == "complete":
        return "complete", ()
    keys = tuple(getattr(pipeline.sink, "keys", ()) or ())
    if getattr(pipeline.sink, "mode", "append") == "upsert" and keys:
        return "upsert", keys
    return "append", ()


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
class ReferenceCheck:
    """The failure-free sparkonce run compared with the reference run."""

    diff: RowDiff
    batches: int  # micro-batches of the reference run, no-data batches included
    seconds: float
    semantics: Semantics
    rows_file: str

    @property
    def matched(self) -> bool:
        return self.diff.matched

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
    ) -> ReferenceCheck:
        """Compare on the columns the sink shows (all of the reference's if it shows none)."""
        if sparkonce_rows:
            columns = list(dict.fromkeys(c for r in sparkonce_rows for c in r))
            reference = project(reference, columns)
        diff = diff_rows(reference, sparkonce_rows, key_columns)
        return cls(diff, batches, seconds, semantics, rows_file)

    def message(self, pipeline_file: str | Path, log_file: str | Path) -> str:
        d = self.diff
        return (
            f"failure-free sparkonce run differs from Spark's plain foreachBatch reference: "
            f"{d.counts()}.\n"
            + d.describe("reference", "sparkonce")
            + f"\nWith no fault injected, the sink of {pipeline_file} shows other rows than "
            f"Spark's own engine produced ({self.batches} micro-batches, {self.semantics} "
            "semantics applied by the reference): a bug in the sink or in sparkonce's commit "
            "logic, or a non-deterministic transform. The trials were not run, since they "
            f"compare with the failure-free run. Reference rows: {self.rows_file}; its log: "
            f"{log_file}."
        )

    def to_json(self) -> dict[str, Any]:
        """The ``reference`` section of ``verify.json``."""
        return {
            "matched": self.matched,
            "rows": self.diff.expected_rows,
            "sparkonce_rows": self.diff.actual_rows,
            "batches": self.batches,
            "seconds": round(self.seconds, 1),
            "semantics": self.semantics,
            **self.diff.to_json(),
        }


def load_reference(path: Path, pipeline: Pipeline) -> tuple[list[dict[str, Any]], int]:
    """(rows a reader of the sink would see, batches) from a reference file."""
    batches = read_batches(path)
    semantics, keys = sink_semantics(pipeline)
    return apply_semantics(batches, semantics, keys), len(batches)


__all__ = [
    "ENTRY",
    "BatchRecorder",
    "ReferenceCheck",
    "ReferenceMismatchError",
    "apply_semantics",
    "load_reference",
    "project",
    "read_batches",
    "record",
    "sink_semantics",
]
