"""``sparkonce log ...``: topics of the embedded durable log (create, produce, tail,
describe)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from sparkonce.cli.common import (
    DIRECTORY_EXPECTED,
    _add_partitions,
    _check_directory,
    _env,
    _env_checked,
    _help,
    _record_count,
)
from sparkonce.cli.records import (
    PRODUCE_CHUNK_LINES,
    _add_record_options,
    _BadLine,
    _print_record,
    _record_chunks,
    _stopped_at,
)
from sparkonce.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.cli.common import SubParsers
    from sparkonce.log import Topic


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


def add_parser(sub: SubParsers) -> None:
    log_p = sub.add_parser("log", help="the embedded durable log")
    log_sub = log_p.add_subparsers(dest="log_command", required=True)
    default_dir = _env("SPARKONCE_LOG_DIR")

    def add_dir_topic(q: argparse.ArgumentParser, topic_required: bool = True) -> None:
        q.add_argument(
            "dir",
            nargs=None if default_dir is None else "?",
            type=_env_checked("dir", DIRECTORY_EXPECTED, _check_directory),
            default=default_dir,
            help=_help("log directory", "SPARKONCE_LOG_DIR"),
        )
        q.add_argument("topic", nargs=None if topic_required else "?")

    q = log_sub.add_parser("create", help="create a topic")
    add_dir_topic(q)
    _add_partitions(q)
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
    _add_record_options(q)
    q.add_argument(
        "--producer-id",
        type=_env_checked("--producer-id", "a producer id"),
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
