"""``sparkonce verify``: a crash-test campaign against a pipeline file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sparkonce.cli.common import (
    DIRECTORY_EXPECTED,
    EXIT_FAIL,
    SINK_URL_EXPECTED,
    _add_env_number,
    _check_directory,
    _check_env,
    _check_sink_url,
    _env,
    _env_checked,
    _help,
)
from sparkonce.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.cli.common import SubParsers
    from sparkonce.verify import TrialOutcome


def cmd_verify(args: argparse.Namespace) -> int:
    import time

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
        parse_fault_kinds,
        run_trials,
        summarize,
        write_json,
    )
    from sparkonce.verify.planning import (
        VerifyRequest,
        check_request,
        load_plan,
        store_workdirs,
    )

    request = VerifyRequest(
        trials=args.trials,
        seed=args.seed,
        replay=args.replay,
        resume=args.resume,
        retime_oracle=args.retime_oracle,
    )
    check_request(request)
    if not args.sink:
        _check_env(
            _env("SPARKONCE_VERIFY_SINK"), "--sink", SINK_URL_EXPECTED, _check_sink_url, secret=True
        )
    kinds = parse_fault_kinds(args.faults)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    console = Console()
    env_sink = _env("SPARKONCE_VERIFY_SINK")
    sink_urls: list[str | None] = list(args.sink or [env_sink or None])
    workdirs = store_workdirs(out_dir, sink_urls)
    campaigns = [
        Campaign(
            args.pipeline_file,
            workdir=workdir,
            seed=args.seed,
            kinds=kinds,
            sink_url=url,
            on_event=lambda msg: console.print(f"[dim]{msg}[/]"),
            quick_start=not args.full_jit,
            key_columns=tuple(args.key or ()),
        )
        for url, workdir in zip(sink_urls, workdirs, strict=True)
    ]
    campaign = campaigns[0]
    kinds = campaign.kinds  # db-drop is left out for sinks without a store connection
    stores = [c.pipeline.sink.describe() for c in campaigns]
    console.print(
        f"[bold]verify[/] {campaign.pipeline.name}: sink {', '.join(stores)}, "
        f"faults {', '.join(kinds)}, seed {args.seed}. Each trial wipes this pipeline's "
        "output (table or topic) and ledger in that sink."
    )
    plan = load_plan(request, out_dir, kinds)
    for note in plan.notes:
        console.print(note)
    for c in campaigns:
        c.recorded_faults.update(plan.recorded_faults)
    json_path, png_path = plan.report, plan.chart
    outcomes: list[TrialOutcome] = list(plan.kept)
    trials = plan.trials
    oracle_seconds = plan.oracle_seconds
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


def _check_faults(text: str) -> None:
    from sparkonce.verify import parse_fault_kinds

    kinds = [k.strip() for k in text.split(",") if k.strip()]
    if not kinds:
        raise ValueError("it names no kind")
    unknown = []
    for kind in kinds:
        try:
            parse_fault_kinds(kind)
        except ConfigError:
            unknown.append(kind)
    if unknown:
        raise ValueError(f"unknown: {', '.join(unknown)}")
    parse_fault_kinds(text)


def _faults_expected() -> str:
    from sparkonce.protocol import CrashPoint
    from sparkonce.verify import FAULT_KINDS

    points = "|".join(sorted(p.value for p in CrashPoint))
    return (
        f"a comma-separated list of {', '.join(FAULT_KINDS)}; crash-point may name its "
        f"point: crash-point:{points}"
    )


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
        minimum=1,
    )
    _add_env_number(
        p, "--seed", env="SPARKONCE_VERIFY_SEED", default=0, help="campaign seed, default 0"
    )
    p.add_argument(
        "--faults",
        type=_env_checked("--faults", _faults_expected, _check_faults),
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
        type=_env_checked("--out", DIRECTORY_EXPECTED, _check_directory),
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
