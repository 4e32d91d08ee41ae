"""The command line: ``python -m sparkonce.verify.sim``.

::

    python -m sparkonce.verify.sim --schedules 100000 --workers 2 --progress
    python -m sparkonce.verify.sim --replay 4242                      # print, run, shrink
    python -m sparkonce.verify.sim --store postgres --url postgresql://... --lanes 8
    python -m sparkonce.verify.sim --store kafka --bootstrap 127.0.0.1:9092 --lanes 16

A campaign prints its rate and every failing seed; the first failing seed is then
shrunk and printed with the command that replays the shrunk schedule exactly;
``--save DIR`` also stores it as JSON in ``DIR`` (a regression test's data).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

from sparkonce.verify.sim.regression import Regression
from sparkonce.verify.sim.runner import (
    Campaign,
    Summary,
    TargetSpec,
    close_target,
    run_campaign,
    run_schedule,
    shrink,
)
from sparkonce.verify.sim.schedule import Schedule, generate
from sparkonce.verify.sim.world import Failure

LIVE_FAILURES = 20  # failing seeds printed while a campaign runs (all are counted)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sparkonce.verify.sim",
        description="Seeded schedules of runs, crashes, dropped connections and zombies, "
        "driving the real committer against a real store; invariants checked after each.",
    )
    p.add_argument(
        "--store", choices=("sqlite", "postgres", "kafka", "delta", "iceberg"), default="sqlite"
    )
    p.add_argument("--url", help="PostgreSQL URL (--store postgres)")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (--store kafka)")
    p.add_argument("--sink", choices=("sql", "twophase"), default="sql", help="SQL stores only")
    p.add_argument("--schedules", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0, help="first seed (schedule i has seed+i)")
    p.add_argument(
        "--seconds",
        type=float,
        help="time box: start no schedule after this many seconds (up to --schedules)",
    )
    p.add_argument("--workers", type=int, default=1, help="processes")
    p.add_argument(
        "--lanes", type=int, default=1, help="concurrent schedules per process (server stores)"
    )
    p.add_argument("--replay", type=int, metavar="SEED", help="run one schedule, print it")
    p.add_argument("--events", help="with --replay: the events as JSON (a shrunk schedule)")
    p.add_argument("--no-shrink", action="store_true", help="print failures unshrunk")
    p.add_argument(
        "--save",
        metavar="DIR",
        help="store the shrunk failing schedule as JSON in DIR (e.g. tests/sim/regressions), "
        "to replay as a regression test",
    )
    p.add_argument(
        "--no-restore",
        action="store_true",
        help="no run starts from a checkpoint restored from an old backup",
    )
    p.add_argument("--fresh-connections", action="store_true", help="a new connection per run")
    p.add_argument("--progress", action="store_true", help="show a progress bar (rich)")
    p.add_argument("--profile", action="store_true", help="cProfile the run (one process)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # The committer logs every injected drop and retry; thousands of schedules inject many.
    logging.getLogger("sparkonce").setLevel(logging.ERROR)
    url = args.url or args.bootstrap or ""
    if args.store == "postgres" and not args.url:
        print("error: --store postgres needs --url postgresql://...", file=sys.stderr)
        return 2
    if args.store == "kafka" and not args.bootstrap:
        print("error: --store kafka needs --bootstrap HOST:PORT", file=sys.stderr)
        return 2
    if args.store != "postgres" and args.sink != "sql":
        print("error: --sink twophase needs --store postgres", file=sys.stderr)
        return 2
    spec = TargetSpec(
        store=args.store,
        url=url,
        sink=args.store if args.store in ("kafka", "delta", "iceberg") else args.sink,
        fresh_connections=args.fresh_connections,
    )
    campaign = Campaign(
        target=spec,
        seed=args.seed,
        schedules=args.schedules,
        workers=1 if args.profile else max(1, args.workers),
        lanes=max(1, args.lanes),
        with_restore=not args.no_restore,
        seconds=args.seconds,
    )
    if args.replay is not None:
        return _replay(args, campaign)
    return _campaign(args, campaign)


def _campaign(args: argparse.Namespace, c: Campaign) -> int:
    what = f"{c.target.store} ({c.target.sink} sink), {c.workers} process(es) x {c.lanes} lane(s)"
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        summary = prof.runcall(run_campaign, c)
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    elif args.progress:
        summary = _with_progress(c, what)
    else:
        summary = run_campaign(c)
    print(report_line(what, summary))
    print(f"  {summary.stats}")
    for seed, failures in summary.failed[:10]:
        more = f" (+{len(failures) - 1})" if failures[1:] else ""
        print(f"  seed {seed}: {failures[0]}{more}")
        print(f"    replay: {c.replay_command(seed)}")
    if not summary.failed:
        return 0
    if not args.no_shrink:
        seed = summary.failed[0][0]
        _shrink_and_print(c, generate(seed, with_restore=c.with_restore), args.save)
    return 1


def report_line(what: str, summary: Summary) -> str:
    cpu = (
        f", {summary.schedules / summary.cpu_seconds:.0f} per CPU-second"
        if summary.cpu_seconds
        else ""
    )
    failed = summary.failed_count
    return (
        f"{summary.schedules:,} schedules checked ({what}) in {summary.seconds:.1f} s: "
        f"{summary.rate:,.0f} schedules/s{cpu}; {failed} failed"
    )


def _with_progress(c: Campaign, what: str) -> Summary:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    started = time.perf_counter()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>8} schedules/s"),
        TextColumn("[red]{task.fields[failed]} failed"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        refresh_per_second=4,
    ) as bar:
        task = bar.add_task(what, total=c.schedules, rate="-", failed=0)

        def progress(done: int, failed: int) -> None:
            elapsed = time.perf_counter() - started
            rate = f"{done / elapsed:,.0f}" if elapsed > 0 else "-"
            bar.update(task, completed=done, rate=rate, failed=failed)

        shown = [0]

        def on_failure(seed: int, failures: list[Failure]) -> None:
            shown[0] += 1
            if shown[0] <= LIVE_FAILURES:
                bar.console.print(
                    f"[red]seed {seed}[/red]: {failures[0]}\n    replay: {c.replay_command(seed)}"
                )
            elif shown[0] == LIVE_FAILURES + 1:
                bar.console.print("[red]more failures[/red]: counted, listed at the end")

        return run_campaign(c, progress=progress, on_failure=on_failure)


def _shrink_and_print(c: Campaign, schedule: Schedule, save: str | None = None) -> None:
    target = c.target.build()
    try:
        small, failures = shrink(schedule, target, c.steps)
    finally:
        close_target(target)
    if not failures:
        print(f"seed {schedule.seed} passed when run again: not reproducible on one lane?")
        return
    print(f"\nseed {schedule.seed} shrunk to {len(small.events)} of {len(schedule.events)} events:")
    print(small.describe())
    for f in failures:
        print(f"  {f}")
    print(f"replay exactly: {c.replay_command(schedule.seed)} --events '{small.events_json()}'")
    if save:
        spec = c.target
        kinds = tuple(dict.fromkeys(f.kind for f in failures))
        path = Regression(
            f"{spec.store}-{spec.sink}-seed{schedule.seed}",
            small,
            store=spec.store,
            sink=spec.sink,
            kinds=kinds,
            note=f"found by: {c.replay_command(schedule.seed)}; shows {', '.join(kinds)}",
        ).save(save)
        print(f"stored: {path}")


def _replay(args: argparse.Namespace, c: Campaign) -> int:
    target = c.target.build()
    try:
        schedule = generate(args.replay, with_restore=c.with_restore)
        if args.events:
            schedule = replace(schedule, events=Schedule.parse_events(args.events))
        print(schedule.describe())
        failures, stats = run_schedule(schedule, target)
        print(f"  {stats}")
        if not failures:
            print("passed: every invariant holds")
            return 0
        print(f"FAILED ({len(failures)}):")
        for f in failures:
            print(f"  {f}")
    finally:
        close_target(target)
    if not args.no_shrink:
        _shrink_and_print(c, schedule, args.save)
    return 1


if __name__ == "__main__":
    sys.exit(main())
