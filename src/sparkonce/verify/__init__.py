"""Crash harness and ``sparkonce verify``: named crash points, kill/restart, oracle checks."""

from sparkonce.verify.campaign import (
    FAULT_KINDS,
    Campaign,
    Fault,
    KindSummary,
    Recorded,
    TrialOutcome,
    compare_rows,
    load_report,
    parse_fault_kinds,
    run_trials,
    summarize,
    write_chart,
    write_json,
)
from sparkonce.verify.driver import Driver

__all__ = [
    "FAULT_KINDS",
    "Campaign",
    "Driver",
    "Fault",
    "KindSummary",
    "Recorded",
    "TrialOutcome",
    "compare_rows",
    "load_report",
    "parse_fault_kinds",
    "run_trials",
    "summarize",
    "write_chart",
    "write_json",
]
