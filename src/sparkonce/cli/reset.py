"""``sparkonce reset``: forget a pipeline's progress in its sink (owner epoch and ledger), after
a confirmation; a thin shell over :func:`sparkonce.pipeline.reset.reset_pipeline`."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from sparkonce.cli.common import (
    EXIT_FAIL,
    add_pipeline_and_sink,
)
from sparkonce.errors import ConfigError

# The checkpoint is the pipeline's, not the sink's: reset cannot know where it is.
CHECKPOINT_NOTE = (
    "Delete (or move away) the pipeline's checkpoint directory before that run: a checkpoint "
    "ahead of the ledger is refused."
)

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.cli.common import SubParsers
    from sparkonce.pipeline.reset import ResetPlan


def _ask(plan: ResetPlan) -> bool:
    """Show what will be deleted and ask; anything but "y" or "yes" is a no."""
    print(f"sparkonce reset: pipeline {plan.pipeline!r} in {plan.sink}. This deletes:")
    for line in plan.progress:
        print(f"  - {line}")
    if plan.output:
        print("and, because --output-rows was given, THE PIPELINE'S OUTPUT:")
        for line in plan.output:
            print(f"  - {line}")
    else:
        print("The output rows are kept (--output-rows deletes them too).")
    print(f"Its next run starts from the source's beginning, with epoch 1. {CHECKPOINT_NOTE}")
    print("Proceed? [y/N] ", end="", flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def cmd_reset(args: argparse.Namespace) -> int:
    from sparkonce.pipeline.reset import reset_pipeline

    if not args.pipeline:
        raise ConfigError("--pipeline is required (or set SPARKONCE_PIPELINE)")
    if not args.sink:
        raise ConfigError("--sink is required (or set SPARKONCE_SINK)")
    plan = reset_pipeline(
        args.pipeline,
        args.sink,
        output_rows=args.output_rows,
        table=args.table,
        holder_stopped=args.holder_stopped,
        confirm=None if args.yes else _ask,
    )
    if plan.empty:
        print(f"pipeline {args.pipeline!r} has no progress in {plan.sink}: nothing to reset")
        return 0
    if not plan.done:
        print("reset cancelled: nothing was deleted", file=sys.stderr)
        return EXIT_FAIL
    kept = "deleted" if plan.output else "kept"
    also = f", {plan.precommits} never-committed pre-commits" if plan.precommits else ""
    print(
        f"reset pipeline {args.pipeline!r} in {plan.sink}: {plan.batches} ledger entries{also} "
        f"and the owner epoch deleted, output {kept}; its next run starts from the beginning. "
        + CHECKPOINT_NOTE
    )
    return 0


def add_parser(sub: SubParsers) -> None:
    p = sub.add_parser(
        "reset",
        help="forget a pipeline's progress (owner epoch, ledger) in its sink",
        description=(
            "Delete a pipeline's owner epoch and ledger from its sink, after showing what "
            "goes and asking, so that its next run starts from the source's beginning with "
            "epoch 1. The output rows are kept unless --output-rows is given. Refused (exit "
            "5) while the run holding the epoch is alive. Runbook: docs/operations/reset.md."
        ),
    )
    add_pipeline_and_sink(p, "sink URL, as for status")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument(
        "--output-rows",
        action="store_true",
        help="also delete the pipeline's output (SQL: drop --table; Kafka: empty the topic; "
        "Delta: delete the table directory)",
    )
    p.add_argument(
        "--table", help="the output table of a SQLite or PostgreSQL sink (with --output-rows)"
    )
    p.add_argument(
        "--holder-stopped",
        action="store_true",
        help="the run holding the epoch ran on another host and you made sure it is stopped",
    )
    p.set_defaults(func=cmd_reset)
