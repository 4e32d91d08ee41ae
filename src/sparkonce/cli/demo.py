"""``sparkonce demo``: crash a real pipeline twice and check that its sums are exact."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from sparkonce.cli.common import (
    DIRECTORY_EXPECTED,
    EXIT_FAIL,
    _add_env_number,
    _check_directory,
    _env,
    _env_checked,
    _help,
)

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.cli.common import SubParsers


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


def add_parser(sub: SubParsers) -> None:
    p = sub.add_parser("demo", help="crash a real pipeline twice and check the sums are exact")
    _add_env_number(
        p,
        "--records",
        env="SPARKONCE_DEMO_RECORDS",
        default=200000,
        help="records to produce, default 200000",
        minimum=1000,  # as run_demo requires: the run must span batches
    )
    p.add_argument("--keys", type=int, default=16, help="distinct keys, default 16")
    p.add_argument("--partitions", type=int, default=4, help="log partitions, default 4")
    p.add_argument(
        "--workdir",
        type=_env_checked("--workdir", DIRECTORY_EXPECTED, _check_directory),
        default=_env("SPARKONCE_DEMO_DIR", ".demo"),
        help=_help("work directory (wiped), default .demo", "SPARKONCE_DEMO_DIR"),
    )
    p.add_argument("--seed", type=int, default=None, help="seed for the random kill moment")
    p.set_defaults(func=cmd_demo)
