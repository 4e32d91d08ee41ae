"""The ``sparkonce`` command: a thin shell over the public API.

``main()`` is the only place that turns exceptions into messages and exit
codes; ``--debug`` re-raises instead. Each subcommand imports its
implementation lazily, so ``sparkonce --help`` does not start Spark.

Exit codes: 0 success, 1 failure (a FAIL, a failed run), 2 bad input,
3 fenced by a newer run, 4 a store or source unreachable.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparkonce.errors import ConfigError, FencedError, SinkUnavailableError, SparkOnceError
from sparkonce.kafka.client import KafkaUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.kafka.client import KafkaConnection
    from sparkonce.sinks.base import Sink

EXIT_FAIL, EXIT_USAGE, EXIT_FENCED, EXIT_UNAVAILABLE = 1, 2, 3, 4


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def _help(text: str, env: str) -> str:
    return f"{text} (env: {env})"


# -- subcommands ------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from sparkonce.pipeline.loader import load_pipeline
    from sparkonce.pipeline.spark import build_session

    pipeline = load_pipeline(args.pipeline_file).with_overrides(
        sink_url=args.sink, checkpoint=args.checkpoint
    )
    spark = build_session(
        master=args.master, app_name=f"sparkonce:{pipeline.name}", quick_start=args.quick_start
    )
    try:
        report = pipeline.run(spark, timeout=args.timeout)
    finally:
        spark.stop()
    print(
        f"pipeline {report.pipeline}: epoch {report.epoch}, resumed from {report.resumed_from}; "
        f"committed {report.batches_committed} batches ({report.rows_committed} rows), "
        f"skipped {report.batches_skipped} replayed batches"
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sparkonce.pipeline.status import pipeline_status

    if not args.pipeline:
        raise ConfigError("--pipeline is required (or set SPARKONCE_PIPELINE)")
    if not args.sink:
        raise ConfigError("--sink is required (or set SPARKONCE_SINK)")
    sink = _open_sink_for_status(args.sink)
    try:
        st = pipeline_status(sink, args.pipeline)
    finally:
        sink.close()
    console = Console()
    if st.owner is None:
        console.print(f"pipeline {args.pipeline!r} has never run against {st.sink}")
        return EXIT_FAIL
    console.print(f"[bold]pipeline[/] {st.pipeline}   [bold]sink[/] {st.sink}")
    console.print(
        f"owner epoch {st.owner.epoch} (taken {st.owner.acquired_at:%Y-%m-%d %H:%M:%S %Z} by "
        f"{st.owner.holder})"
    )
    last = f"{st.last_commit_at:%Y-%m-%d %H:%M:%S %Z}" if st.last_commit_at else "never"
    console.print(
        f"ledger: {st.batches} batches, {st.rows_committed} rows committed, last commit {last}"
    )
    table = Table(title="committed offsets and lag")
    for col in ("topic", "partition", "committed", "latest", "lag"):
        table.add_column(col, justify="right" if col != "topic" else "left")
    for p in st.partitions:
        table.add_row(
            p.topic,
            str(p.partition),
            str(p.committed),
            "?" if p.latest is None else str(p.latest),
            "?" if p.lag is None else str(p.lag),
        )
    console.print(table)
    if st.source_note:
        console.print(f"[yellow]{st.source_note}[/]")
    for problem in st.ledger_problems:
        console.print(f"[red]ledger problem:[/] {problem}")
    return EXIT_FAIL if st.ledger_problems else 0


def _open_sink_for_status(url: str) -> Sink:
    from sparkonce.config import StoreURL
    from sparkonce.sinks.sql import PostgresSink, SQLiteSink

    if url.startswith("kafka://"):
        from sparkonce.sinks.kafka import kafka_sink_from_uri

        kafka = kafka_sink_from_uri(url)
        kafka.open()
        return kafka

    parsed = StoreURL.parse(url)
    if parsed.scheme == "sqlite" and parsed.path is not None and not parsed.path.exists():
        raise ConfigError(f"SQLite sink file {str(parsed.path)!r} does not exist")
    cls = SQLiteSink if parsed.scheme == "sqlite" else PostgresSink
    # The table is irrelevant for status; the ledger lives beside it.
    sink = cls(parsed, "sparkonce_status_probe")
    sink.open()
    return sink


def cmd_log_create(args: argparse.Namespace) -> int:
    from sparkonce.log import Topic

    with Topic.create(args.dir, args.topic, args.partitions, exist_ok=args.exist_ok) as t:
        print(f"topic {t.name!r} with {t.partitions} partitions in {t.root}")
    return 0


def _read_records(args: argparse.Namespace) -> list[tuple[str | None, str]]:
    """(key, value) of each --value or stdin line. Every line is parsed before any is
    sent, so that bad input writes nothing."""
    lines: Sequence[str] = args.values or [ln.rstrip("\n") for ln in sys.stdin]
    sep = args.separator
    records: list[tuple[str | None, str]] = []
    for text in lines:
        if sep is None:
            records.append((args.key, text))
        elif sep not in text:
            raise ConfigError(
                f"line {text[:80]!r} has no separator {sep!r}; every line must be "
                "KEY<separator>VALUE when --separator is given"
            )
        else:
            k, v = text.split(sep, 1)
            records.append((k, v))
    return records


def _print_record(r: Any) -> None:
    """One record as a tab-separated line: partition, offset, record id, key, value."""
    key = r.key.decode(errors="replace") if r.key is not None else ""
    value = r.value.decode(errors="replace") if r.value is not None else ""
    print(f"{r.partition}\t{r.offset}\t{r.record_id or ''}\t{key}\t{value}")


def cmd_log_produce(args: argparse.Namespace) -> int:
    from sparkonce.log import IdempotentProducer, Topic

    records = _read_records(args)
    with Topic(args.dir, args.topic) as t, IdempotentProducer(t, args.producer_id) as producer:
        for key, value in records:
            raw_key = None if key is None else key.encode()
            producer.send(value.encode(), raw_key, partition=args.partition)
        producer.flush()
        sent = producer.sent
    print(f"appended {sent} records to {args.topic!r} as producer {args.producer_id!r}")
    return 0


def cmd_log_tail(args: argparse.Namespace) -> int:
    from sparkonce.log import Topic

    with Topic(args.dir, args.topic) as t:
        for r in t.tail(args.partition, args.n):
            _print_record(r)
    return 0


def cmd_log_describe(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sparkonce.log import Topic, list_topics

    names = [args.topic] if args.topic else list_topics(args.dir)
    console = Console()
    if not names:
        console.print(f"no topics in {args.dir}")
    for name in names:
        with Topic(args.dir, name) as t:
            ends = t.end_offsets()
            seqs = t.producer_sequences()
        table = Table(title=f"topic {name} ({len(ends)} partitions, {sum(ends.values())} records)")
        table.add_column("partition", justify="right")
        table.add_column("end offset", justify="right")
        table.add_column("producers (last sequence)")
        for p, end in ends.items():
            prods = ", ".join(f"{pid}:{s}" for (pid, pp), s in sorted(seqs.items()) if pp == p)
            table.add_row(str(p), str(end), prods)
        console.print(table)
    return 0


def _kafka_connection(args: argparse.Namespace) -> KafkaConnection:
    from sparkonce.kafka import KafkaConnection
    from sparkonce.kafka.producer import require_confluent_kafka

    if not args.bootstrap:
        raise ConfigError("BOOTSTRAP is required (or set SPARKONCE_KAFKA_BOOTSTRAP)")
    require_confluent_kafka()
    return KafkaConnection(args.bootstrap, _kafka_client_config(args.client_config))


def _kafka_client_config(items: Sequence[str]) -> dict[str, str]:
    config: dict[str, str] = {}
    for n, item in enumerate(items, 1):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # Never echo the item: it may hold a password.
            raise ConfigError(f"--config #{n} is not KEY=VALUE (e.g. security.protocol=SSL)")
        config[key.strip()] = value
    return config


def cmd_kafka_create(args: argparse.Namespace) -> int:
    conn = _kafka_connection(args)
    conn.topics(args.timeout)  # fail fast (exit 4) if the cluster does not answer
    created = conn.ensure_topic(args.topic, args.partitions, timeout=max(args.timeout, 30.0))
    count = conn.partitions(args.topic, args.timeout)
    if created:
        print(f"created Kafka topic {args.topic!r} with {count} partitions at {conn.bootstrap}")
    else:
        print(
            f"Kafka topic {args.topic!r} already exists at {conn.bootstrap} "
            f"with {count} partitions; left unchanged"
        )
    return 0


def cmd_kafka_produce(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sparkonce.kafka import KafkaProducer

    conn = _kafka_connection(args)
    from_stdin = not args.values
    records = _read_records(args)
    console = Console(stderr=True)
    show_progress = from_stdin and console.is_terminal and len(records) >= 10_000
    with KafkaProducer(
        conn.bootstrap, args.topic, client_config=conn.config, timeout=args.timeout
    ) as producer:
        if show_progress:
            with console.status(f"sending {len(records)} records to {args.topic!r}") as status:
                for i, (key, value) in enumerate(records, 1):
                    producer.send(value, key, partition=args.partition)
                    if i % 10_000 == 0:
                        status.update(f"sent {i}/{len(records)} records to {args.topic!r}")
                status.update(f"waiting for acknowledgements of {len(records)} records")
                producer.flush()
        else:
            for key, value in records:
                producer.send(value, key, partition=args.partition)
    print(
        f"delivered {producer.delivered} records to Kafka topic {args.topic!r} at "
        f"{conn.bootstrap} (idempotent producer: exactly-once delivery for this session)"
    )
    return 0


def cmd_kafka_tail(args: argparse.Namespace) -> int:
    from sparkonce.kafka.topic import tail

    conn = _kafka_connection(args)
    for r in tail(conn, args.topic, args.n, partition=args.partition, timeout=args.timeout):
        _print_record(r)
    return 0


def cmd_kafka_describe(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sparkonce.kafka.topic import partition_offsets

    conn = _kafka_connection(args)
    offsets = partition_offsets(conn, args.topic, args.timeout)
    table = Table(
        title=f"Kafka topic {args.topic} ({len(offsets)} partitions)",
        caption=f"at {conn.bootstrap}; end = last stable offset (read_committed)",
    )
    for col in ("partition", "log start", "end (committed)"):
        table.add_column(col, justify="right")
    for po in offsets:
        table.add_row(str(po.partition), str(po.start), str(po.end))
    Console().print(table)
    return 0


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
        TrialOutcome,
        load_report,
        parse_fault_kinds,
        run_trials,
        summarize,
        write_chart,
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
        oracle = campaign.run_oracle(oracle_seconds)
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
    charted = write_chart(png_path, outcomes, kinds)
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


def cmd_demo(args: argparse.Namespace) -> int:
    from sparkonce.demo import run_demo

    result = run_demo(
        records=args.records,
        keys=args.keys,
        partitions=args.partitions,
        workdir=args.workdir,
        seed=args.seed,
    )
    return 0 if result.passed else EXIT_FAIL


# -- parser -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkonce",
        description="Effectively-once streaming pipelines on Apache Spark.",
    )
    parser.add_argument("--debug", action="store_true", help="re-raise errors with tracebacks")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a pipeline file (defines `pipeline = Pipeline(...)`)")
    p.add_argument("pipeline_file")
    p.add_argument(
        "--master",
        default=_env("SPARKONCE_MASTER", "local[2]"),
        help=_help("Spark master URL, default local[2]", "SPARKONCE_MASTER"),
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="stop after this many seconds (for processingTime triggers)",
    )
    p.add_argument(
        "--sink",
        default=_env("SPARKONCE_RUN_SINK"),
        help=_help("write to this store instead of the file's sink URL", "SPARKONCE_RUN_SINK"),
    )
    p.add_argument(
        "--checkpoint",
        default=_env("SPARKONCE_RUN_CHECKPOINT"),
        help=_help("use this checkpoint directory instead", "SPARKONCE_RUN_CHECKPOINT"),
    )
    p.add_argument(
        "--quick-start",
        action="store_true",
        default=_env("SPARKONCE_QUICK_START", "") == "1",
        help=_help(
            "start Spark's JVM for a short run (C1 JIT, serial GC): about a quarter less "
            "CPU for runs of a minute; keep it off for long-running jobs",
            "SPARKONCE_QUICK_START=1",
        ),
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("status", help="owner epoch, committed offsets, lag, rows committed")
    p.add_argument(
        "--pipeline",
        default=_env("SPARKONCE_PIPELINE"),
        help=_help("pipeline name", "SPARKONCE_PIPELINE"),
    )
    p.add_argument(
        "--sink", default=_env("SPARKONCE_SINK"), help=_help("sink URL", "SPARKONCE_SINK")
    )
    p.set_defaults(func=cmd_status)

    log_p = sub.add_parser("log", help="the embedded durable log")
    log_sub = log_p.add_subparsers(dest="log_command", required=True)
    default_dir = _env("SPARKONCE_LOG_DIR")

    def add_dir_topic(q: argparse.ArgumentParser, topic_required: bool = True) -> None:
        q.add_argument(
            "dir",
            nargs=None if default_dir is None else "?",
            default=default_dir,
            help=_help("log directory", "SPARKONCE_LOG_DIR"),
        )
        q.add_argument("topic", nargs=None if topic_required else "?")

    q = log_sub.add_parser("create", help="create a topic")
    add_dir_topic(q)
    q.add_argument(
        "--partitions",
        type=int,
        default=int(_env("SPARKONCE_PARTITIONS", "4") or 4),
        help=_help("number of partitions, default 4", "SPARKONCE_PARTITIONS"),
    )
    q.add_argument("--exist-ok", action="store_true", help="no error if it already exists")
    q.set_defaults(func=cmd_log_create)

    q = log_sub.add_parser(
        "produce", help="append records: each --value, or else each line of stdin"
    )
    add_dir_topic(q)
    q.add_argument(
        "--value", dest="values", action="append", default=[], help="a record (repeatable)"
    )
    q.add_argument("--key", default=None, help="key for every record")
    q.add_argument("--separator", default=None, help="split each line into KEY<sep>VALUE")
    q.add_argument("--partition", type=int, default=None, help="write to this partition")
    q.add_argument(
        "--producer-id",
        default=_env("SPARKONCE_PRODUCER_ID", "cli"),
        help=_help("idempotent producer id, default 'cli'", "SPARKONCE_PRODUCER_ID"),
    )
    q.set_defaults(func=cmd_log_produce)

    q = log_sub.add_parser("tail", help="print the last records")
    add_dir_topic(q)
    q.add_argument("-n", type=int, default=10, help="records per partition, default 10")
    q.add_argument("--partition", type=int, default=None)
    q.set_defaults(func=cmd_log_tail)

    q = log_sub.add_parser("describe", help="partitions, end offsets and producers")
    add_dir_topic(q, topic_required=False)
    q.set_defaults(func=cmd_log_describe)

    kafka_p = sub.add_parser("kafka", help="Kafka topics: create, produce (idempotent), tail")
    kafka_sub = kafka_p.add_subparsers(dest="kafka_command", required=True)
    default_bootstrap = _env("SPARKONCE_KAFKA_BOOTSTRAP")

    def add_bootstrap_topic(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "bootstrap",
            metavar="BOOTSTRAP",
            nargs=None if default_bootstrap is None else "?",
            default=default_bootstrap,
            help=_help(
                "Kafka bootstrap servers, host:port[,host:port...]", "SPARKONCE_KAFKA_BOOTSTRAP"
            ),
        )
        q.add_argument("topic", metavar="TOPIC")
        q.add_argument(
            "--config",
            dest="client_config",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="extra librdkafka setting, e.g. security.protocol=SASL_SSL (repeatable; "
            "values are never printed)",
        )
        q.add_argument(
            "--timeout",
            type=float,
            default=10.0,
            help="seconds to wait for the cluster to answer, default 10",
        )

    q = kafka_sub.add_parser("create", help="create a topic (no error if it exists)")
    add_bootstrap_topic(q)
    q.add_argument(
        "--partitions",
        type=int,
        default=int(_env("SPARKONCE_PARTITIONS", "4") or 4),
        help=_help("number of partitions, default 4", "SPARKONCE_PARTITIONS"),
    )
    q.set_defaults(func=cmd_kafka_create)

    q = kafka_sub.add_parser(
        "produce",
        help="send records with the idempotent producer: each --value, or else each line of stdin",
    )
    add_bootstrap_topic(q)
    q.add_argument(
        "--value", dest="values", action="append", default=[], help="a record (repeatable)"
    )
    q.add_argument("--key", default=None, help="key for every record")
    q.add_argument("--separator", default=None, help="split each line into KEY<sep>VALUE")
    q.add_argument("--partition", type=int, default=None, help="write to this partition")
    q.set_defaults(func=cmd_kafka_produce)

    q = kafka_sub.add_parser("tail", help="print the last committed records (read_committed)")
    add_bootstrap_topic(q)
    q.add_argument("-n", type=int, default=10, help="records per partition, default 10")
    q.add_argument("--partition", type=int, default=None)
    q.set_defaults(func=cmd_kafka_tail)

    q = kafka_sub.add_parser("describe", help="partitions with log start and committed end offsets")
    add_bootstrap_topic(q)
    q.set_defaults(func=cmd_kafka_describe)

    p = sub.add_parser("verify", help="crash-test campaign: faults vs a failure-free oracle")
    p.add_argument("pipeline_file")
    p.add_argument(
        "--trials",
        type=int,
        default=int(_env("SPARKONCE_VERIFY_TRIALS", "20") or 20),
        help=_help("number of trials, default 20", "SPARKONCE_VERIFY_TRIALS"),
    )
    p.add_argument(
        "--seed",
        type=int,
        default=int(_env("SPARKONCE_VERIFY_SEED", "0") or 0),
        help=_help("campaign seed, default 0", "SPARKONCE_VERIFY_SEED"),
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
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("demo", help="crash a real pipeline twice and check the sums are exact")
    p.add_argument(
        "--records",
        type=int,
        default=int(_env("SPARKONCE_DEMO_RECORDS", "200000") or 0),
        help=_help("records to produce, default 200000", "SPARKONCE_DEMO_RECORDS"),
    )
    p.add_argument("--keys", type=int, default=16, help="distinct keys, default 16")
    p.add_argument("--partitions", type=int, default=4, help="log partitions, default 4")
    p.add_argument(
        "--workdir",
        default=_env("SPARKONCE_DEMO_DIR", ".demo"),
        help=_help("work directory (wiped), default .demo", "SPARKONCE_DEMO_DIR"),
    )
    p.add_argument("--seed", type=int, default=None, help="seed for the random kill moment")
    p.set_defaults(func=cmd_demo)
    return parser


def _setup_logging(verbose: int) -> None:
    from rich.logging import RichHandler

    # sparkonce's own progress (one line per batch) shows by default; -v adds debug output.
    # On a terminal, rich formatting; in a log file, one plain line per record.
    handler: logging.Handler
    if sys.stderr.isatty():
        handler = RichHandler(show_path=False, rich_tracebacks=False, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    logging.getLogger("sparkonce").setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.getLogger("py4j").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    try:
        return int(args.func(args))
    except Exception as exc:
        if args.debug:
            raise
        return _report(exc)


def _report(exc: Exception) -> int:
    name = type(exc).__name__
    if isinstance(exc, FencedError):
        print(f"sparkonce: fenced: {exc}", file=sys.stderr)
        return EXIT_FENCED
    if isinstance(exc, (SinkUnavailableError, KafkaUnavailableError)):
        print(f"sparkonce: unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if isinstance(exc, ConfigError):
        print(f"sparkonce: bad input: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(exc, SparkOnceError):
        print(f"sparkonce: {name}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    print(
        f"sparkonce: unexpected {name}: {exc} (run with --debug for a traceback)", file=sys.stderr
    )
    return EXIT_FAIL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
