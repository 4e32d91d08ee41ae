"""Crash harness and ``sparkonce verify``: named crash points, kill/restart, oracle checks."""

from sparkonce.verify.campaign import Campaign
from sparkonce.verify.compare import RowDiff, canonical_row, canonical_value, diff_rows
from sparkonce.verify.driver import Driver
from sparkonce.verify.model import (
    FAULT_KINDS,
    KNOWN_KINDS,
    OPT_IN_KINDS,
    Fault,
    TrialOutcome,
    compare_rows,
    parse_fault_kinds,
)
from sparkonce.verify.parallel import run_trials
from sparkonce.verify.reference import (
    ReferenceCheck,
    ReferenceMismatchError,
    apply_semantics,
)
from sparkonce.verify.report import Recorded, load_report, write_chart, write_json
from sparkonce.verify.summary import KindSummary, failure_hint, summarize

__all__ = [
    "FAULT_KINDS",
    "KNOWN_KINDS",
    "OPT_IN_KINDS",
    "Campaign",
    "Driver",
    "Fault",
    "KindSummary",
    "Recorded",
    "ReferenceCheck",
    "ReferenceMismatchError",
    "RowDiff",
    "TrialOutcome",
    "apply_semantics",
    "canonical_row",
    "canonical_value",
    "compare_rows",
    "diff_rows",
    "failure_hint",
    "load_report",
    "parse_fault_kinds",
    "run_trials",
    "summarize",
    "write_chart",
    "write_json",
]
