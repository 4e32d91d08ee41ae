"""``sparkonce verify``: a crash-test campaign against a pipeline file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkonce.cli.common import (
    DIRECTORY_EXPECTED,
    EXIT_FAIL,
    MASTER_EXPECTED,
    SINK_URL_EXPECTED,
    _add_env_number,
    _check_checkpoint,
    _check_directory,
    _check_env,
    _check_master,
    _check_sink_url,
    _env,
    _env_checked,
    _help,
)
from sparkonce.errors import ConfigError, RunStopped

if TYPE_CHECKING:  # pragma: no cover
    from rich.table import Table

    from sparkonce.cli.common import SubParsers
    from sparkonce.verify import Campaign, TrialOutcome
    from sparkonce.verify.model import Oracle


CHECKS_HELP = """\
what every trial checks:
  Each output against the oracle's rows of that output: no row lost, none duplicated,
  the same values, matched on the output's keys (its sink's upsert keys, or --key) or
  as multisets; a zombie run's commits refused; in every store a gap-free, monotonic
  ledger (seq 0..n-1, epochs not going backwards); with outputs in several stores,
  the same batches in every store's ledger. Dead-letter outputs are checked like any
  other (against the reference without their pipeline and batch_seq columns, which
  depend on sparkonce's batches, not on the transform).

non-deterministic columns (--nondeterministic):
  (a) every other column exactly: rows are compared with the declared columns left
      out, which also checks the number of rows per input record;
  (b) by count: a trial holds a value (not NULL) in a declared column at least as
      often as the oracle's rows with the same other columns;
  (c) the same values in every sink: two outputs that both have a declared column C
      and share another column are joined on their shared (undeclared) columns, and
      must hold the same C values; each joined value that differs counts as
      "inconsistent" and fails the trial (a crash between two stores' commits without
      stable output shows up here). A pair that differs in the failure-free run
      already (C computed separately per output) is reported and not checked.
  Declared columns are left out of the reference check. An undeclared one makes the
  failure-free run differ from the reference: verify then names the columns that
  alone explain it, and stops before the trials.

resend (opt-in: --faults resend, or e.g. --faults kill,resend; needs an embedded-log or
  Kafka source): a real producer process copies the input into a fresh trial source of
  the same kind (a new log directory in the trial's directory, or a new Kafka topic,
  deleted after the trial), keeping each record's partition, key, value, timestamp and
  record id, and persisting its progress every M records. It is SIGKILLed once it has
  acknowledged k records, restarted with a new producer identity, and re-sends the
  records acknowledged since its last progress write under the same record ids; the
  pipeline then runs on the trial source (sparkonce run --source). A pipeline that
  removes copies by record id (sparkonce.outputs.dedupe) matches the oracle; one that
  does not shows duplicated rows (or other aggregate values). verify.json records k, M,
  the window re-sent and the trial source. The oracle ran on the original source in
  other micro-batches: the output must not depend on where batch boundaries fall (true
  of stateless pipelines, and of watermarked aggregations with no late records).

several outputs (Pipeline(outputs=...)): counts per output and in total in
  verify.json ("outputs" of each trial, and per output over all trials). --sink
  moves every output to one store, so it is refused when the outputs live in
  several stores: the trials then run in the pipeline's own stores, one at a time.
  Each store's commit reaches a crash point once per batch, so crash-point, db-drop
  and zombie faults pick among batches x stores (with two stores, an odd hit of
  crash-point:after-ledger-commit falls between the two stores' commits of a batch).
"""


def _stop_on_signals() -> Callable[[], None]:
    """SIGTERM and SIGINT stop a campaign between trials' results: the running trials'
    drivers are killed (:func:`~sparkonce.verify.run_trials` aborts them on the way out),
    the report keeps every trial finished before, and ``--resume`` goes on from it. The
    stop is :class:`RunStopped` (exit 143 or 130). A campaign started in the background
    by a shell, which ignores SIGINT there, still stops on either. Returns the function
    that puts the previous handlers back (nothing is changed off the main thread)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum: int, _frame: object) -> None:
        for s in previous:  # a second signal must not cut the drivers' clean-up short
            signal.signal(s, signal.SIG_IGN)
        raise RunStopped(
            f"sparkonce verify stopped on {signal.Signals(signum).name}; the report keeps "
            "every finished trial, and --resume runs the others",
            signum,
        )

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)

    return restore


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
        failure_hint,
        parse_fault_kinds,
        run_trials,
        summarize,
        write_json,
    )
    from sparkonce.verify.live import DEFAULT_INTERVAL_S as LIVE_INTERVAL_S
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
    broker = None
    if "broker-kill" in kinds or args.broker_nodes:
        from sparkonce.verify.injection import BrokerKill

        broker = BrokerKill.parse(
            (args.broker_nodes or "").split(","),
            args.broker_kill_command,
            args.broker_start_command,
            args.broker_down,
        )
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
            nondeterministic=tuple(args.nondeterministic or ()),
            master=args.master,
            remote=args.remote,
            checkpoint_root=args.checkpoint,
            live_interval_s=None if args.no_live else (args.live_interval or LIVE_INTERVAL_S),
            broker=broker,
        )
        for url, workdir in zip(sink_urls, workdirs, strict=True)
    ]
    campaign = campaigns[0]
    kinds = campaign.kinds  # db-drop is left out for sinks without a store connection
    stores = [c.pipeline.sink.describe() for c in campaigns]
    if campaign.multi:
        console.print(
            f"[bold]verify[/] {campaign.pipeline.name}: outputs "
            f"{', '.join(campaign.sinks)} in {'; '.join(campaign.store_names())}"
            + (f" (one set per trial worker: {len(campaigns)})" if len(campaigns) > 1 else "")
            + f", faults {', '.join(kinds)}, seed {args.seed}. Each trial wipes this "
            "pipeline's outputs (tables or topics) and its ledger in every store."
        )
    else:
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
    restore = _stop_on_signals()
    try:
        try:
            oracle = campaign.run_oracle(oracle_seconds, plan.oracle_timing)
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
                detail = _trial_detail(outcome)
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
        restore()
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
    checks_pairs = bool(campaign.pairs) or any(o.inconsistent for o in outcomes)
    table = Table(title=title)
    for col in (
        "fault",
        "trials",
        "passed",
        "fired",
        "lost rows",
        "duplicated rows",
        "value mismatches",
        *(["inconsistent"] if checks_pairs else []),
        "live observations",
        "live anomalies",
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
            *([str(s.inconsistent)] if checks_pairs else []),
            str(s.live_observations),
            str(s.live_anomalies),
            "-" if s.recovery_mean_s is None else f"{s.recovery_mean_s:.1f}",
            "-" if s.recovery_p95_s is None else f"{s.recovery_p95_s:.1f}",
        )
    console.print(table)
    _print_live(console, outcomes)
    _print_recovery(console, outcomes, campaign.oracle, max(1, len(stores)))
    if campaign.multi:
        console.print(_outputs_table(campaign, outcomes))
    console.print(f"every trial: {json_path}" + (f"; chart: {png_path}" if charted else ""))
    failed = [o.trial for o in outcomes if not o.passed]
    if failed:
        console.print(
            f"[bold red]FAIL[/]: trials {failed[:20]} failed. Repeat one exactly with: "
            f"sparkonce verify {args.pipeline_file} --seed {args.seed} --replay {failed[0]}"
            + (f" --faults {args.faults}" if args.faults else "")
        )
        hint = failure_hint(outcomes)
        if hint:
            console.print(hint, markup=False, highlight=False)
        return EXIT_FAIL
    unfired = [o.trial for o in outcomes if not o.fault_fired]
    if unfired:
        console.print(
            f"[yellow]note[/]: in {len(unfired)} trials the fault did not fire, so they "
            f"tested nothing ({unfired[:20]}); --resume runs them again"
        )
    console.print(
        "[bold green]PASS[/]: every trial matched the oracle"
        + (" in every output" if campaign.multi else "")
        + (", and the outputs agreed on the declared columns" if campaign.pairs else "")
    )
    return 0


_SHORT = {
    "lost_rows": "lost",
    "duplicated_rows": "duplicated",
    "value_mismatches": "mismatched",
    "null_values": "of which NULL",
}


def _trial_detail(outcome: TrialOutcome) -> str:
    """``lost 0, duplicated 0, mismatched 0`` (and where, for several outputs)."""
    text = (
        f"lost {outcome.lost_rows}, duplicated {outcome.duplicated_rows}, "
        f"mismatched {outcome.value_mismatches}"
    )
    bad = [
        f"{name}: " + ", ".join(f"{_SHORT.get(k, k)} {v}" for k, v in counts.items() if v)
        for name, counts in outcome.outputs.items()
        if any(counts.values())
    ]
    if bad:
        text += f" ({'; '.join(bad)})"
    if outcome.live:
        seen = sum(s.get("observations", 0) for s in outcome.live)
        text += f"; live: {seen} observations, {outcome.live_anomalies} anomalies"
    if outcome.inconsistent:
        text += f"; inconsistent across outputs {outcome.inconsistent}"
        if outcome.inconsistencies:  # examples are in verify.json
            text += f" ({outcome.inconsistencies[0].split(', e.g. ')[0]})"
    return text


def _print_live(console: Any, outcomes: Sequence[TrialOutcome]) -> None:
    """Per store: the live readers' observations and anomalies by kind, first examples."""
    from sparkonce.verify.summary import live_totals

    for store in live_totals(outcomes):
        found = ", ".join(f"{k} {n}" for k, n in store["anomalies"].items())
        line = (
            f"live reader ({store['reader'] or 'none'}) of {store['store']}: "
            f"{store['observations']} observations in {store['trials']} trials; anomalies: {found}"
        )
        if store.get("read_errors"):
            line += f"; {store['read_errors']} reads failed (retried)"
        if store.get("not_read"):
            line += f"; not read: {store['not_read']}"
        console.print(line, markup=False, highlight=False)
        for kind, examples in store["examples"].items():
            for e in examples:
                console.print(f"  {kind}: {e}", markup=False, highlight=False)


def _outputs_table(campaign: Campaign, outcomes: Sequence[TrialOutcome]) -> Table:
    """Lost, duplicated and mismatched rows per output, over every trial."""
    from rich.table import Table

    table = Table(title="per output, all trials")
    for col in ("output", "store", "oracle rows", "lost", "duplicated", "mismatched", "declared"):
        table.add_column(col, justify="left" if col in ("output", "declared") else "right")
    oracle = campaign.oracle.output_rows() if campaign.oracle is not None else {}
    store_of = {n: i for i, names in enumerate(campaign.stores) for n in names}
    for name in campaign.sinks:

        def total(key: str, name: str = name) -> str:
            return str(sum(o.outputs.get(name, {}).get(key, 0) for o in outcomes))

        table.add_row(
            name,
            str(store_of[name]),
            str(len(oracle.get(name, []))),
            total("lost_rows"),
            total("duplicated_rows"),
            total("value_mismatches"),
            ", ".join(campaign.nondeterministic.get(name, ())) or "-",
        )
    return table


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
    from sparkonce.verify import KNOWN_KINDS

    points = "|".join(sorted(p.value for p in CrashPoint))
    return (
        f"a comma-separated list of {', '.join(KNOWN_KINDS)}; crash-point may name its "
        f"point: crash-point:{points}"
    )


def add_parser(sub: SubParsers) -> None:
    p = sub.add_parser(
        "verify",
        help="crash-test campaign: faults vs a failure-free oracle",
        description="Crash-test campaign: run the pipeline under faults and compare each "
        "trial with a failure-free oracle. Results go to OUT/verify.json; the recovery-time "
        "chart OUT/recovery.png needs matplotlib: pip install 'sparkonce[verify]'.",
        epilog=CHECKS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
            "comma-separated kinds: kill, crash-point, task-failure, db-drop, zombie "
            "(default: these five), and resend, only when named: the input's producer is "
            "killed and restarted and re-sends records under the same ids (needs an "
            "embedded-log or Kafka source; see below), and broker-kill, only when named: "
            "one Kafka broker node is killed and started again while the run goes on, "
            "which must finish with no exit (see --broker-nodes)",
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
        "those whose fault did not fire (SIGTERM or SIGINT stops a campaign; the report "
        "keeps every finished trial)",
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
        "--master",
        type=_env_checked("--master", MASTER_EXPECTED, _check_master),
        default=_env("SPARKONCE_MASTER"),
        help=_help(
            "Spark master of the trial drivers, default sparkonce run's (local[2]); on a "
            "cluster, task-failure trials rely on its own task retries, and the reference run "
            "stays local",
            "SPARKONCE_MASTER",
        ),
    )
    p.add_argument(
        "--remote",
        metavar="local[N]",
        help=(
            "run every trial driver on a Spark Connect session: each driver starts a Connect "
            "server of its own (local[N]) and is its client; task-failure trials are left out"
        ),
    )
    p.add_argument(
        "--checkpoint",
        type=_env_checked("--checkpoint", "a directory path or a URL", _check_checkpoint),
        default=_env("SPARKONCE_VERIFY_CHECKPOINT"),
        metavar="ROOT",
        help=_help(
            "a directory or URL (such as s3a://bucket/verify) under which every run gets a "
            "fresh checkpoint, ROOT/PIPELINE/RUN-ID; they are left there, for a look and for "
            "your storage's tools to remove. Default: one local checkpoint in OUT, removed "
            "between runs",
            "SPARKONCE_VERIFY_CHECKPOINT",
        ),
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
        "as multisets. With several outputs: OUTPUT.COLUMN",
    )
    p.add_argument(
        "--nondeterministic",
        action="append",
        default=None,
        metavar="[OUTPUT.]COLUMN[,...]",
        help="columns the transform computes non-deterministically (uuid(), rand(), a "
        "clock, a lookup): not compared by value but by count and across outputs (see "
        "below). COLUMN applies to every output having it; OUTPUT.COLUMN to one output",
    )
    p.add_argument(
        "--live-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how often the live readers read each store during a trial (default 0.25); "
        "every observation is checked for aborted reads, "
        "duplicates, torn batches and rows that disappear",
    )
    p.add_argument(
        "--no-live",
        action="store_true",
        help="no live readers: check only each trial's final state",
    )
    p.add_argument(
        "--broker-nodes",
        default=None,
        metavar="NODE,NODE,...",
        help="for --faults broker-kill: the broker nodes of a multi-broker Kafka cluster, "
        "one of which each such trial kills (at least two)",
    )
    p.add_argument(
        "--broker-kill-command",
        default=None,
        metavar="CMD",
        help="for --faults broker-kill: the command that kills a node, with {node} for its "
        "name, run without a shell, e.g. 'ssh {node} sudo systemctl kill -s KILL kafka'",
    )
    p.add_argument(
        "--broker-start-command",
        default=None,
        metavar="CMD",
        help="for --faults broker-kill: the command that starts the node again (always run "
        "after a kill), e.g. 'ssh {node} sudo systemctl start kafka'",
    )
    p.add_argument(
        "--broker-down",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="for --faults broker-kill: seconds between the kill and the start, default 5",
    )
    p.set_defaults(func=cmd_verify)


def _print_recovery(
    console: Any, outcomes: Sequence[TrialOutcome], oracle: Oracle | None, at_a_time: int = 1
) -> None:
    """The recoveries' split (means over every kind) and the recovery goal, when known."""
    import statistics

    from sparkonce.verify.summary import RECOVERY_GOAL, RECOVERY_PHASES, recovery_goal

    split = [o.recovery_phases for o in outcomes if o.recovery_phases]
    if split:
        mean = {k: statistics.fmean(s[k] for s in split) for k in RECOVERY_PHASES}
        console.print(
            f"recovery, mean of {len(split)}: process and Spark start {mean['start_s']:.1f} s, "
            f"ledger and query start {mean['plan_s']:.1f} s, first batch "
            f"{mean['first_batch_s']:.1f} s"
        )
    if oracle is not None and oracle.phases:
        o = oracle.phases
        console.print(
            f"the oracle's cold start plus one batch: process and Spark start {o['start_s']:.1f} "
            f"s, ledger and query start {o['plan_s']:.1f} s, first batch "
            f"{o['first_batch_s']:.1f} s"
        )
    goal = recovery_goal(outcomes, oracle, at_a_time)
    if goal is not None:
        verdict = "met" if goal["met"] else "[yellow]not met[/]"
        console.print(
            f"recovery goal {verdict}: p95 {goal['p95_s']:.1f} s is {goal['ratio']:.2f}x the "
            f"oracle's cold start plus one batch ({goal['cold_start_and_one_batch_s']:.1f} s); "
            f"the goal is at most {RECOVERY_GOAL}x"
        )
        if not goal["fair"]:
            console.print(
                f"  [yellow]note:[/] {at_a_time} trials ran at a time and the oracle alone, so "
                "each recovery shared the machine and the ratio overstates it; run with one "
                "--sink to judge the goal"
            )
