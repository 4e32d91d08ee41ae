"""Several named outputs per pipeline: ``Pipeline(outputs={name: sink, ...})``.

* :mod:`~sparkonce.outputs.output_set`: the outputs committed as one sink by the runner,
  one committer per store (outputs sharing a store commit in one transaction);
* :mod:`~sparkonce.outputs.combine`: several named streaming DataFrames run as one query
  (one batch id, one set of offsets), split back into one DataFrame per output in each
  micro-batch;
* :mod:`~sparkonce.outputs.stable`: a micro-batch's output written once (Parquet under the
  checkpoint), so a replay reads the copy instead of recomputing a non-deterministic
  transform;
* :mod:`~sparkonce.outputs.dedup`: :func:`~sparkonce.outputs.dedup.dedupe` removes the records a
  producer re-sent, by record id, within an event-time bound (Spark's state store, collected by
  the watermark);
* :mod:`~sparkonce.outputs.quality`: parse helpers built on Spark's own functions that route
  records failing parsing or validation to dead letters instead of failing the query.
"""

from sparkonce.outputs.combine import (
    OUTPUT_TAG,
    OutputLayout,
    check_output_mode,
    check_output_name,
    combine,
    select_output,
    split,
)
from sparkonce.outputs.dedup import DedupCounts, dedup_counts, dedupe
from sparkonce.outputs.quality import (
    DEAD_LETTER_SCHEMA,
    Parsed,
    mark_bad,
    parse_delimited,
    parse_json,
    then,
    to_number,
)
from sparkonce.outputs.stable import BatchKey, StableOutput

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "OUTPUT_TAG",
    "BatchKey",
    "DedupCounts",
    "OutputLayout",
    "Parsed",
    "StableOutput",
    "check_output_mode",
    "check_output_name",
    "combine",
    "dedup_counts",
    "dedupe",
    "mark_bad",
    "parse_delimited",
    "parse_json",
    "select_output",
    "split",
    "then",
    "to_number",
]
