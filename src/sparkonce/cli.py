"""The ``sparkonce`` command: a thin shell over the public API.

``main()`` is the only place that turns exceptions into messages and exit
codes; ``--debug`` re-raises instead. Each subcommand imports its
implementation lazily, so ``sparkonce --help`` does not start Spark.

Exit codes: 0 success, 1 failure (a FAIL, a failed run), 2 bad input (including a
bad command line or environment variable), 3 fenced by a newer run, 4 a store or
source unreachable, 130 interrupted (Ctrl-C); ``run`` stops cleanly between commits on
SIGINT and SIGTERM and exits 130 and 143. Every failure ends with one line on stderr,
``sparkonce: ...``; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sparkonce.errors import (
    ConfigError,
    FencedError,
    RunStopped,
    SinkUnavailableError,
    SparkOnceError,
)
from sparkonce.kafka.client import KafkaUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.kafka.client import KafkaConnection
    from sparkonce.log import Topic
    from sparkonce.sinks.base import Sink
    from sparkonce.verify import TrialOutcome

EXIT_FAIL, EXIT_USAGE, EXIT_FENCED, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 1, 2, 3, 4, 130

# `log produce` and `kafka produce` read stdin in chunks of this many lines: memory stays
# bounded whatever the input's size, and a malformed line stops the input before any
# record of its chunk is sent.
PRODUCE_CHUNK_LINES = 10_000

_T = TypeVar("_T")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def _help(text: str, env: str) -> str:
    return f"{text} (env: {env})"


class _EnvDefault(str):
    """An option's default, read from the environment variable ``env``.

    argparse converts a string default with the option's ``type=`` when, and only when,
    the option is not on the command line of the command being run. So a bad value gets
    argparse's usage error (exit 2) naming the variable, ``--help`` never reads it, and
    a command that does not have the option ignores it.
    """

    env: str


def _env_default(name: str, default: str) -> str:
    """The value of ``name`` (an empty value counts as unset), else ``default``."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = _EnvDefault(raw)
    value.env = name
    return value


def _typed(convert: Callable[[str], _T], flag: str, expected: str) -> Callable[[str], _T]:
    """``convert`` as an argparse ``type=``; a bad value from the environment is named."""

    def parse(text: str) -> _T:
        try:
            return convert(text)
        except ValueError:
            if isinstance(text, _EnvDefault):
                raise argparse.ArgumentTypeError(
                    f"invalid value {str(text)!r} for {flag} from {text.env}: expected {expected}"
                ) from None
            raise

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse: "invalid int value"
    return parse


def _add_env_number(
    p: argparse.ArgumentParser,
    flag: str,
    *,
    env: str,
    default: int | float,
    help: str,
) -> None:
    """An int or float option whose default comes from ``env``, converted by argparse."""
    convert: Callable[[str], int | float] = int if isinstance(default, int) else float
    expected = "an integer" if convert is int else "a number"
    p.add_argument(
        flag,
        type=_typed(convert, flag, expected),
        default=_env_default(env, str(default)),
        help=_help(help, env),
    )


def _record_count(text: str) -> int:
    """``-n`` of ``tail``: an integer >= 0 (0 prints nothing, like ``tail -n 0``)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0 prints no records), got {n}")
    return n


# -- subcommands ------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    """Run a pipeline file. SIGTERM and SIGINT stop it cleanly between commits (exit
    143 and 130); Spark's and py4j's logs, with their stacks, go to the run's log file."""
    import signal
    import threading

    from sparkonce.faults import FaultPlan
    from sparkonce.pipeline.loader import load_pipeline
    from sparkonce.pipeline.spark import build_session

    faults = FaultPlan.from_env()  # the run's fault plan, parsed once (none set: no faults)
    pipeline = load_pipeline(args.pipeline_file).with_overrides(
        sink_url=args.sink, checkpoint=args.checkpoint
    )
    log_file = Path(args.log_file) if args.log_file else _default_log_file(pipeline.name)
    file_handler = _log_to_file(log_file)
    stop = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        stop.signal_number = signum  # type: ignore[attr-defined]
        stop.set()

    previous: dict[int, Any] = {}
    try:
        spark = build_session(
            master=args.master,
            app_name=f"sparkonce:{pipeline.name}",
            quick_start=args.quick_start,
            log_file=log_file,
        )
        # After the session: PySpark's SparkContext installs a SIGINT handler of its own.
        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            report = pipeline.run(spark, timeout=args.timeout, stop=stop, faults=faults)
        finally:
            spark.stop()
    except SparkOnceError as exc:
        exc.log_file = log_file  # type: ignore[attr-defined]
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for name in _LOGGED_TO_FILE:
            logging.getLogger(name).removeHandler(file_handler)
        file_handler.close()
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
    sink, label = _open_sink_for_status(args.sink)
    try:
        st = pipeline_status(sink, args.pipeline)
    finally:
        sink.close()
    console = Console()
    if st.owner is None:
        console.print(f"pipeline {args.pipeline!r} has never run against {label}")
        return EXIT_FAIL
    console.print(f"[bold]pipeline[/] {st.pipeline}   [bold]sink[/] {label}")
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


def _open_sink_for_status(url: str) -> tuple[Sink, str]:
    """The sink whose ledger ``status`` reads, and how to name it: the URL the user gave
    (password masked), not the sink object, whose output table status never touches."""
    from sparkonce.config import StoreURL, mask_url
    from sparkonce.sinks.sql import PostgresSink, SQLiteSink

    if url.startswith("kafka://"):
        from sparkonce.sinks.kafka import kafka_sink_from_uri

        kafka = kafka_sink_from_uri(url)
        kafka.open()
        return kafka, mask_url(url)

    parsed = StoreURL.parse(url)
    if parsed.scheme == "sqlite" and parsed.path is not None and not parsed.path.exists():
        raise ConfigError(f"SQLite sink file {str(parsed.path)!r} does not exist")
    cls = SQLiteSink if parsed.scheme == "sqlite" else PostgresSink
    # The table is irrelevant for status; the ledger lives beside it.
    sink = cls(parsed, "sparkonce_status_probe")
    sink.open()
    return sink, str(parsed)


def _log_dir(log_dir: str) -> Path:
    root = Path(log_dir)
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise ConfigError(
            f"log directory {log_dir!r} {what}; create a topic in it with: "
            f"sparkonce log create {log_dir} TOPIC --partitions N"
        )
    return root


def _open_topic(log_dir: str, name: str) -> Topic:
    """The topic, or a ConfigError (exit 2) naming the directory or the topic."""
    from sparkonce.errors import SourceError
    from sparkonce.log import Topic

    root = _log_dir(log_dir)
    try:
        return Topic(root, name)
    except SourceError as exc:  # no such topic, or a file that is no topic
        raise ConfigError(str(exc)) from exc


def cmd_log_create(args: argparse.Namespace) -> int:
    from sparkonce.log import Topic

    with Topic.create(args.dir, args.topic, args.partitions, exist_ok=args.exist_ok) as t:
        print(f"topic {t.name!r} with {t.partitions} partitions in {t.root}")
    return 0


class _BadLine(ConfigError):
    """A line of input that is not a record; ``line`` counts from 1."""

    def __init__(self, where: str, line: int, problem: str) -> None:
        self.where, self.line = where, line
        super().__init__(f"{where}: {problem}")


def _record_chunks(
    args: argparse.Namespace, chunk_lines: int = PRODUCE_CHUNK_LINES
) -> Iterator[list[tuple[str | None, str]]]:
    """(key, value) of each --value, or else of each stdin line, in chunks.

    The --value records are one chunk. Stdin is read lazily, ``chunk_lines`` lines at a
    time, so memory stays bounded. A chunk is parsed whole before it is yielded: a
    malformed line raises :class:`_BadLine` before any record of its chunk is sent.
    """
    if args.values:
        yield [_parse_line(args, t, f"--value #{n}", n) for n, t in enumerate(args.values, 1)]
        return
    chunk: list[tuple[str | None, str]] = []
    for n, raw in enumerate(sys.stdin, 1):
        chunk.append(_parse_line(args, raw.rstrip("\n"), f"line {n}", n))
        if len(chunk) >= chunk_lines:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _parse_line(args: argparse.Namespace, text: str, where: str, n: int) -> tuple[str | None, str]:
    sep = args.separator
    if sep is None:
        return args.key, text
    if sep not in text:
        raise _BadLine(
            where,
            n,
            f"{text[:80]!r} has no separator {sep!r}; every line must be KEY<separator>VALUE "
            "when --separator is given.",
        )
    k, v = text.split(sep, 1)
    return k, v


def _stopped_at(bad: _BadLine, sent: int, verb: str, target: str) -> ConfigError:
    """The error for a malformed line after ``sent`` records of earlier lines went out."""
    if sent == 0:
        return ConfigError(f"{bad} Nothing was {verb}.")
    return ConfigError(
        f"{bad} Stopped there: the {sent} records of lines 1..{sent} were already {verb} "
        f"to {target} and stay there; lines {sent + 1}.. were not. Fix line {bad.line} and "
        f"send only lines {sent + 1} onwards (e.g. tail -n +{sent + 1} FILE | ...): "
        f"sending lines 1..{sent} again would add them again, as new records."
    )


def _print_record(r: Any) -> None:
    """One record as a tab-separated line: partition, offset, record id, key, value."""
    key = r.key.decode(errors="replace") if r.key is not None else ""
    value = r.value.decode(errors="replace") if r.value is not None else ""
    print(f"{r.partition}\t{r.offset}\t{r.record_id or ''}\t{key}\t{value}")


def cmd_log_produce(args: argparse.Namespace) -> int:
    from sparkonce.log import IdempotentProducer

    with (
        _open_topic(args.dir, args.topic) as t,
        IdempotentProducer(t, args.producer_id) as producer,
    ):
        try:
            for chunk in _record_chunks(args):
                for key, value in chunk:
                    raw_key = None if key is None else key.encode()
                    producer.send(value.encode(), raw_key, partition=args.partition)
                producer.flush()  # the chunk is durable before the next one is read
        except _BadLine as bad:
            raise _stopped_at(bad, producer.sent, "appended", f"topic {args.topic!r}") from None
        sent = producer.sent
    print(f"appended {sent} records to {args.topic!r} as producer {args.producer_id!r}")
    return 0


def cmd_log_tail(args: argparse.Namespace) -> int:
    with _open_topic(args.dir, args.topic) as t:
        for r in t.tail(args.partition, args.n):
            _print_record(r)
    return 0


def cmd_log_describe(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sparkonce.log import list_topics

    names = [args.topic] if args.topic else list_topics(_log_dir(args.dir))
    console = Console()
    if not names:
        console.print(f"no topics in {args.dir}")
    for name in names:
        with _open_topic(args.dir, name) as t:
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
    from contextlib import AbstractContextManager, nullcontext

    from rich.console import Console
    from rich.status import Status

    from sparkonce.kafka import KafkaProducer

    conn = _kafka_connection(args)
    chunks = _record_chunks(args)
    first = next(chunks, [])  # bad input in the first chunk is refused before connecting
    console = Console(stderr=True)
    progress: AbstractContextManager[Status | None] = (
        console.status(f"sending records to {args.topic!r}")
        if not args.values and console.is_terminal
        else nullcontext()
    )
    with (
        KafkaProducer(
            conn.bootstrap, args.topic, client_config=conn.config, timeout=args.timeout
        ) as producer,
        progress as status,
    ):
        sent = 0
        try:
            for chunk in _chain_first(first, chunks):
                for key, value in chunk:
                    producer.send(value, key, partition=args.partition)
                sent += len(chunk)
                if status is not None:
                    status.update(f"sent {sent} records to {args.topic!r}")
        except _BadLine as bad:
            producer.flush()  # deliver (or report) what earlier chunks sent
            raise _stopped_at(
                bad, producer.delivered, "delivered", f"Kafka topic {args.topic!r}"
            ) from None
        if status is not None:
            status.update(f"waiting for acknowledgements of {sent} records")
        producer.flush()
    print(
        f"delivered {producer.delivered} records to Kafka topic {args.topic!r} at "
        f"{conn.bootstrap} (idempotent producer: exactly-once delivery for this session)"
    )
    return 0


def _chain_first(first: _T, rest: Iterator[_T]) -> Iterator[_T]:
    if first:
        yield first
    yield from rest


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
    p.add_argument(
        "--log-file",
        default=_env("SPARKONCE_LOG_FILE"),
        help=_help(
            "write Spark's and the run's full log, stacks included, here (default: a new file "
            "under the temp directory's sparkonce/, named in every error)",
            "SPARKONCE_LOG_FILE",
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
    _add_env_number(
        q,
        "--partitions",
        env="SPARKONCE_PARTITIONS",
        default=4,
        help="number of partitions, default 4",
    )
    q.add_argument("--exist-ok", action="store_true", help="no error if it already exists")
    q.set_defaults(func=cmd_log_create)

    q = log_sub.add_parser(
        "produce",
        help="append records: each --value, or else each line of stdin",
        description="Append records to a topic of the embedded log: each --value, or else "
        "each line of stdin. The --value records are all-or-nothing. Stdin is read and sent "
        f"in chunks of {PRODUCE_CHUNK_LINES} lines, so any input size fits in memory; each "
        "chunk is parsed whole, then appended (durable) before the next is read. A malformed "
        "line stops the input with exit code 2, naming the line and how many records (of the "
        "lines before its chunk) were already appended: those stay in the log, and "
        "re-sending them appends them again, even with the same --producer-id (a new "
        f"producer continues after its last sequence). Input of up to {PRODUCE_CHUNK_LINES} "
        "lines is all-or-nothing.",
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
    q.add_argument(
        "-n",
        type=_record_count,
        default=10,
        help="records per partition, default 10; 0 prints none (checks that the topic exists)",
    )
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
    _add_env_number(
        q,
        "--partitions",
        env="SPARKONCE_PARTITIONS",
        default=4,
        help="number of partitions, default 4",
    )
    q.set_defaults(func=cmd_kafka_create)

    q = kafka_sub.add_parser(
        "produce",
        help="send records with the idempotent producer: each --value, or else each line of stdin",
        description="Send records with the idempotent producer: each --value, or else each "
        "line of stdin. Bad input in the --value records, or in the first "
        f"{PRODUCE_CHUNK_LINES} lines of stdin, is refused before connecting. Stdin is read "
        f"and sent in chunks of {PRODUCE_CHUNK_LINES} lines, so any input size fits in "
        "memory; a malformed line stops the input with exit code 2, naming the line and how "
        "many records of the lines before its chunk were delivered: those stay in the topic, "
        "and re-sending them adds them again (a new producer session).",
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
    q.add_argument(
        "-n", type=_record_count, default=10, help="records per partition, default 10; 0: none"
    )
    q.add_argument("--partition", type=int, default=None)
    q.set_defaults(func=cmd_kafka_tail)

    q = kafka_sub.add_parser("describe", help="partitions with log start and committed end offsets")
    add_bootstrap_topic(q)
    q.set_defaults(func=cmd_kafka_describe)

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

    p = sub.add_parser("demo", help="crash a real pipeline twice and check the sums are exact")
    _add_env_number(
        p,
        "--records",
        env="SPARKONCE_DEMO_RECORDS",
        default=200000,
        help="records to produce, default 200000",
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


def _setup_logging(verbose: int, debug: bool = False) -> None:
    """sparkonce's own progress (one line per batch) shows by default; -v adds its debug
    output. Spark's Python loggers (``pyspark``, ``py4j``) stay at WARNING unless -v is
    given (-v: INFO, -vv: DEBUG). Without -v or --debug, their tracebacks are left out
    (see :class:`_QuietCallbackErrors`): main() reports the error in one line, and
    --debug shows its traceback."""
    from rich.logging import RichHandler

    # On a terminal, rich formatting; in a log file, one plain line per record.
    handler: logging.Handler
    if sys.stderr.isatty():
        handler = RichHandler(show_path=False, rich_tracebacks=False, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # The filter sits on the terminal's handler, not on the loggers, so that a run's log
    # file (see _log_to_file, whose handlers run first) keeps every traceback.
    if not (verbose or debug):
        handler.addFilter(_QuietCallbackErrors())
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    logging.getLogger("sparkonce").setLevel(logging.DEBUG if verbose else logging.INFO)
    spark_level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    for name in ("py4j", "pyspark"):
        logging.getLogger(name).setLevel(spark_level)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not when the handler
    was made (main() may run more than once in a process, as in tests)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


_LOGGED_TO_FILE = ("sparkonce", "py4j", "pyspark")


def _log_to_file(path: Path) -> logging.Handler:
    """Also write sparkonce's, py4j's and pyspark's records, tracebacks included, to ``path``.

    The handler sits on those loggers themselves, so it formats a record before the
    terminal's handler (on the root logger) drops its traceback.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in _LOGGED_TO_FILE:
        logging.getLogger(name).addHandler(handler)
    return handler


def _default_log_file(pipeline: str) -> Path:
    import tempfile
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.gettempdir()) / "sparkonce" / f"{pipeline}-{stamp}-{os.getpid()}.log"


class _QuietCallbackErrors(logging.Filter):
    """Keeps tracebacks of Spark's Python loggers off stderr (without -v or --debug).

    py4j logs ``logger.exception`` when a Python callback raises, e.g. a FencedError in
    the batch handler. A sparkonce error reaches main(), which reports it in one line, so
    its record is dropped; any other record keeps its message, without the traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is None:
            return True
        if isinstance(record.exc_info[1], SparkOnceError):
            return False
        record.exc_info, record.exc_text = None, None
        return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in ``argv``; returns the exit code (see the module docstring).

    Every failure ends with one line on stderr: ``sparkonce: <what>: <message>``.
    ``--debug`` re-raises instead, with the traceback. A usage error (bad option, bad
    environment variable) is argparse's own message and exit code 2.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _setup_logging(args.verbose, args.debug)
        return int(args.func(args))
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("sparkonce: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout went away (e.g. `sparkonce log tail ... | head`): stop
        # quietly, and keep the interpreter from complaining when it flushes stdout.
        _silence_stdout()
        return EXIT_FAIL
    except Exception as exc:
        if args.debug:
            raise
        return _report(exc)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (e.g. captured in tests)
        pass


def _report(exc: Exception) -> int:
    """Print the one line for ``exc`` on stderr and return its exit code."""
    name = type(exc).__name__
    if isinstance(exc, RunStopped):
        signum = exc.signal_number or 2
        line, code = f"stopped: {exc}", 128 + signum
    elif isinstance(exc, FencedError):
        line, code = f"fenced: {exc}", EXIT_FENCED
    elif isinstance(exc, (SinkUnavailableError, KafkaUnavailableError)):
        line, code = f"unavailable: {exc}", EXIT_UNAVAILABLE
    elif isinstance(exc, ConfigError):
        line, code = f"bad input: {exc}", EXIT_USAGE
    elif isinstance(exc, SparkOnceError):
        line, code = f"{name}: {exc}", EXIT_FAIL
    elif isinstance(exc, ImportError) and "pip install" in str(exc):
        # An optional dependency that is not installed; the message names the extra.
        line, code = f"missing dependency: {exc}", EXIT_USAGE
    else:
        line, code = f"unexpected {name}: {exc} (run with --debug for a traceback)", EXIT_FAIL
    log_file = getattr(exc, "log_file", None)
    if log_file is not None and not isinstance(exc, RunStopped):
        line += f" (full log: {log_file})"
    print(f"sparkonce: {_one_line(line)}", file=sys.stderr)
    return code


def _one_line(text: str) -> str:
    """``text`` on one line: a multi-line message (a server's detail, say) is joined."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
