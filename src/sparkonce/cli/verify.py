"""``sparkonce verify``: a crash-test campaign against a pipeline file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sparkonce.cli.common import EXIT_FAIL, _add_env_number, _env, _help
from sparkonce.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.cli.common import SubParsers
    from sparkonce.verify import TrialOutcome


def cmd_verify(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Table

    from sparkonce.verify import (
        Campaign,
        Fault,
        ReferenceMismatchError,
        load_report,
        parse_fault_kinds,
        run_trials,
        summarize,
        write_json,
    )

    if args.trials < 1 and args.replay is None:
        raise ConfigError(f"--trials must be >= 1, got {args.trials}")
    if args.replay is not None and args.replay < 0:
        raise ConfigError(
            f"--replay takes a trial number from verify.json (0 or more), got {args.replay}"
        )
    if args.retime_oracle and not args.resume and args.replay is None:
        raise ConfigError(
            "--retime-oracle only changes a campaign that goes on (--resume) or repeats a "
            "trial (--replay N); a new campaign always times its oracle"
        )
    kinds = parse_fault_kinds(args.faults)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    console = Console()
    env_sink = _env("SPARKONCE_VERIFY_SINK")
    sink_urls: list[str | None] = list(args.sink or [env_sink or None])
    if len(set(sink_urls)) != len(sink_urls):
        raise ConfigError(
            f"--sink names the same store twice ({sink_urls}); parallel trials each need "
            "their own store"
        )
    campaigns = [
        Campaign(
            args.pipeline_file,
            workdir=out_dir / ("work" if len(sink_urls) == 1 else f"work/w{i}"),
            seed=args.seed,
            kinds=kinds,
            sink_url=url,
            on_event=lambda msg: console.print(f"[dim]{msg}[/]"),
            quick_start=not args.full_jit,
            key_columns=tuple(args.key or ()),
        )
        for i, url in enumerate(sink_urls)
    ]
    campaign = campaigns[0]
    kinds = campaign.kinds  # db-drop is left out for sinks without a store connection
    stores = [c.pipeline.sink.describe() for c in campaigns]
    console.print(
        f"[bold]verify[/] {campaign.pipeline.name}: sink {', '.join(stores)}, "
        f"faults {', '.join(kinds)}, seed {args.seed}. Each trial wipes this pipeline's "
        "output (table or topic) and ledger in that sink."
    )
    json_path, png_path = out_dir / "verify.json", out_dir / "recovery.png"
    recorded = (
        load_report(json_path, args.seed, kinds) if args.resume or args.replay is not None else None
    )
    outcomes: list[TrialOutcome] = []
    if args.replay is not None:
        trials = [args.replay]
        replayed = recorded.fault_of(args.replay) if recorded is not None else None
        if replayed is not None:
            for c in campaigns:
                c.recorded_faults[args.replay] = replayed
        console.print(
            f"replaying trial {args.replay} with "
            + (
                f"its recorded fault: {replayed.describe()}"
                if replayed is not None
                else f"the fault planned from seed {args.seed} (not in {json_path})"
            )
        )
        # A replay never overwrites the campaign's own report.
        json_path = out_dir / f"replay-{args.replay}.json"
        png_path = out_dir / f"replay-{args.replay}.png"
    else:
        again: list[int] = []
        if recorded is not None:
            outcomes, again = recorded.split()
        done = {o.trial for o in outcomes}
        trials = [n for n in range(args.trials) if n not in done]
        if done or again:
            console.print(f"resuming: {len(done)} trials kept from {json_path}")
        again = [n for n in again if n < args.trials]
        if again:
            console.print(
                f"running again {len(again)} trials whose fault did not fire: {again[:20]}"
            )
    oracle_seconds = None
    if recorded is not None and not args.retime_oracle:
        oracle_seconds = recorded.oracle_seconds
    kept = len(outcomes)
    started = time.monotonic()
    try:
        try:
            oracle = campaign.run_oracle(oracle_seconds)
        except ReferenceMismatchError:
            write_json(json_path, campaign, outcomes, time.monotonic() - started, stores, 0)
            raise
        for other in campaigns[1:]:
            other.oracle = oracle
        if len(campaigns) > 1:
            console.print(f"running {len(campaigns)} trials at a time, one per store")
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("trials", total=len(trials))

            def starting(n: int, fault: Fault) -> None:
                progress.update(task, description=f"trial {n}: {fault.describe()}")

            for outcome in run_trials(campaigns, trials, on_start=starting):
                outcomes.append(outcome)
                mark = "[green]pass[/]" if outcome.passed else "[bold red]FAIL[/]"
                detail = (
                    f"lost {outcome.lost_rows}, duplicated {outcome.duplicated_rows}, "
                    f"mismatched {outcome.value_mismatches}"
                )
                if outcome.error:
                    detail += f"; {outcome.error.splitlines()[0][:160]}"
                where = f" on store {outcome.worker}" if len(campaigns) > 1 else ""
                progress.console.print(
                    f"trial {outcome.trial} ({outcome.fault.describe()}){where}: {mark} in "
                    f"{outcome.seconds:.0f} s; {detail}"
                )
                progress.advance(task)
                write_json(
                    json_path,
                    campaign,
                    outcomes,
                    time.monotonic() - started,
                    stores,
                    len(outcomes) - kept,
                )
    finally:
        for c in campaigns:
            c.close()
    elapsed = time.monotonic() - started
    ran = len(outcomes) - kept
    write_json(json_path, campaign, outcomes, elapsed, stores, ran)
    charted = _write_chart(png_path, outcomes, kinds)
    title = f"sparkonce verify: {len(outcomes)} trials"
    if kept:
        title += f" ({kept} kept from earlier runs, {ran} run now in {elapsed / 60:.1f} min)"
    else:
        title += f" in {elapsed / 60:.1f} min"
    table = Table(title=title)
    for col in (
        "fault",
        "trials",
        "passed",
        "fired",
        "lost rows",
        "duplicated rows",
        "value mismatches",
        "recovery mean (s)",
        "recovery p95 (s)",
    ):
        table.add_column(col, justify="left" if col == "fault" else "right")
    for s in summarize(outcomes, kinds):
        table.add_row(
            s.kind,
            str(s.trials),
            str(s.passed),
            str(s.fired),
            str(s.lost_rows),
            str(s.duplicated_rows),
            str(s.value_mismatches),
            "-" if s.recovery_mean_s is None else f"{s.recovery_mean_s:.1f}",
            "-" if s.recovery_p95_s is None else f"{s.recovery_p95_s:.1f}",
        )
    console.print(table)
    console.print(f"every trial: {json_path}" + (f"; chart: {png_path}" if charted else ""))
    failed = [o.trial for o in outcomes if not o.passed]
    if failed:
        console.print(
            f"[bold red]FAIL[/]: trials {failed[:20]} failed. Repeat one exactly with: "
            f"sparkonce verify {args.pipeline_file} --seed {args.seed} --replay {failed[0]}"
            + (f" --faults {args.faults}" if args.faults else "")
        )
        return EXIT_FAIL
    unfired = [o.trial for o in outcomes if not o.fault_fired]
    if unfired:
        console.print(
            f"[yellow]note[/]: in {len(unfired)} trials the fault did not fire, so they "
            f"tested nothing ({unfired[:20]}); --resume runs them again"
        )
    console.print("[bold green]PASS[/]: every trial matched the oracle")
    return 0


def _write_chart(path: Path, outcomes: Sequence[TrialOutcome], kinds: Sequence[str]) -> bool:
    """The recovery-time chart (True if written). Without matplotlib (the ``verify`` extra)
    there is no chart, only a one-line warning: every result is in verify.json anyway."""
    from sparkonce.verify import write_chart

    try:
        return write_chart(path, outcomes, kinds)
    except ImportError as exc:
        print(
            f"sparkonce: warning: no chart {str(path)!r} ({type(exc).__name__}: {exc}); the "
            "chart needs matplotlib: pip install 'sparkonce[verify]'",
            file=sys.stderr,
        )
        return False


def add_parser(sub: SubParsers) -> None:
    p = sub.add_parser(
        "verify",
        help="crash-test campaign: faults vs a failure-free oracle",
        description="Crash-test campaign: run the pipeline under faults and compare each "
        "trial with a failure-free oracle. Results go to OUT/verify.json; the recovery-time "
        "chart OUT/recovery.png needs matplotlib: pip install 'sparkonce[verify]'.",
    )
    p.add_argument("pipeline_file")
    _add_env_number(
        p,
        "--trials",
        env="SPARKONCE_VERIFY_TRIALS",
        default=20,
        help="number of trials, default 20",
    )
    _add_env_number(
        p, "--seed", env="SPARKONCE_VERIFY_SEED", default=0, help="campaign seed, default 0"
    )
    p.add_argument(
        "--faults",
        default=_env("SPARKONCE_VERIFY_FAULTS"),
        help=_help(
            "comma-separated kinds: kill, crash-point, task-failure, db-drop, "
            "zombie (default: all)",
            "SPARKONCE_VERIFY_FAULTS",
        ),
    )
    p.add_argument(
        "--replay",
        type=int,
        default=None,
        help="run only this trial again, with the fault recorded for it in OUT/verify.json",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the trials already in OUT/verify.json and run the rest, and again "
        "those whose fault did not fire",
    )
    p.add_argument(
        "--retime-oracle",
        action="store_true",
        help="with --resume (or --replay of a trial not in the report): plan kills on this "
        "oracle run's time, not the time recorded in OUT/verify.json",
    )
    p.add_argument(
        "--sink",
        action="append",
        default=None,
        help=_help(
            "test store to use instead of the file's sink URL; give it several times to run "
            "that many trials at a time, one per store",
            "SPARKONCE_VERIFY_SINK, one store",
        ),
    )
    p.add_argument(
        "--out",
        default=_env("SPARKONCE_VERIFY_OUT", "verify-out"),
        help=_help("directory for verify.json, recovery.png and logs", "SPARKONCE_VERIFY_OUT"),
    )
    p.add_argument(
        "--full-jit",
        action="store_true",
        help="start trial drivers without --quick-start (slower; same results expected)",
    )
    p.add_argument(
        "--key",
        action="append",
        default=None,
        metavar="COL",
        help="match rows on this output column (repeat for a composite key) against the "
        "reference and the oracle; default: the sink's upsert keys, else rows are compared "
        "as multisets",
    )
    p.set_defaults(func=cmd_verify)
