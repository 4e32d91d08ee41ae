"""``sparkonce kafka ...``: Kafka topics (create, produce with the idempotent producer,
tail and describe at read_committed)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sparkonce.cli.common import (
    BOOTSTRAP_EXPECTED,
    _add_partitions,
    _check_bootstrap,
    _env,
    _env_checked,
    _help,
    _record_count,
)
from sparkonce.cli.records import (
    PRODUCE_CHUNK_LINES,
    _add_record_options,
    _BadLine,
    _chain_first,
    _print_record,
    _record_chunks,
    _stopped_at,
)
from sparkonce.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.cli.common import SubParsers
    from sparkonce.kafka.client import KafkaConnection


def _kafka_connection(args: argparse.Namespace) -> KafkaConnection:
    from sparkonce.kafka import KafkaConnection
    from sparkonce.kafka.producer import require_confluent_kafka

    if not args.bootstrap:
        raise ConfigError("BOOTSTRAP is required (or set SPARKONCE_KAFKA_BOOTSTRAP)")
    require_confluent_kafka()
    # The commands give up after --timeout, transient errors or not (no 2-minute retries).
    return KafkaConnection(
        args.bootstrap, _kafka_client_config(args.client_config), retry_s=args.timeout
    )


def _kafka_client_config(items: Sequence[str]) -> dict[str, str]:
    config: dict[str, str] = {}
    for n, item in enumerate(items, 1):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # Never echo the item: it may hold a password.
            raise ConfigError(f"--config #{n} is not KEY=VALUE (e.g. security.protocol=SSL)")
        config[key.strip()] = value
    return config


def _replication_factor(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def cmd_kafka_create(args: argparse.Namespace) -> int:
    conn = _kafka_connection(args)
    conn.topics(args.timeout)  # fail fast (exit 4) if the cluster does not answer
    created = conn.ensure_topic(
        args.topic,
        args.partitions,
        replication_factor=args.replication_factor,
        timeout=max(args.timeout, 30.0),
    )
    count = conn.partitions(args.topic, args.timeout)
    if created:
        replicas, _ = conn.replication(args.topic, args.timeout)
        print(
            f"created Kafka topic {args.topic!r} with {count} partitions and {replicas} "
            f"replicas at {conn.bootstrap}"
        )
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


def add_parser(sub: SubParsers) -> None:
    kafka_p = sub.add_parser("kafka", help="Kafka topics: create, produce (idempotent), tail")
    kafka_sub = kafka_p.add_subparsers(dest="kafka_command", required=True)
    default_bootstrap = _env("SPARKONCE_KAFKA_BOOTSTRAP")

    def add_bootstrap_topic(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "bootstrap",
            metavar="BOOTSTRAP",
            nargs=None if default_bootstrap is None else "?",
            type=_env_checked("BOOTSTRAP", BOOTSTRAP_EXPECTED, _check_bootstrap),
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
    _add_partitions(q)
    q.add_argument(
        "--replication-factor",
        type=_replication_factor,
        default=None,
        metavar="N",
        help="replicas of each partition; default: the cluster's default.replication.factor",
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
    _add_record_options(q)
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
