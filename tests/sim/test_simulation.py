"""The protocol simulation against the real committer and real stores (no Spark).

How many schedules run comes from the environment, so that ``make test`` can ask for
many while a developer's run stays short:

* ``SPARKONCE_SIM_SCHEDULES``: SQLite schedules (default 2,000);
* ``SPARKONCE_SIM_PG_SCHEDULES``: PostgreSQL schedules, SQL sink (default 300);
* ``SPARKONCE_SIM_2PC_SCHEDULES``: PostgreSQL schedules, two-phase sink (default 40);
* ``SPARKONCE_SIM_WORKERS``: processes for the SQLite schedules (default 1);
* ``SPARKONCE_SIM_SEED``: the first seed (default 0; schedule i has seed + i);
* ``SPARKONCE_SIM_RESTORE=1``: also restore old checkpoint backups (SQLite; it finds the
  bugs pinned in ``test_known_bugs.py``, so it is off until they are fixed).

Each test prints how many schedules it ran and how fast. A failure names the seed;
``python -m sparkonce.verify.simulation --replay SEED`` replays, shrinks and prints it.
"""

from __future__ import annotations

import os

import pytest

from sparkonce.verify.simulation import (
    Campaign,
    Schedule,
    Summary,
    Target,
    generate,
    main,
    run_parallel,
    run_schedule,
    run_schedules,
)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, "") or default)


SEED = _env_int("SPARKONCE_SIM_SEED", 0)


def _report(
    capsys: pytest.CaptureFixture[str], what: str, summary: Summary, campaign: Campaign
) -> None:
    with capsys.disabled():
        print(
            f"\nsimulation ({what}): {summary.schedules} schedules in {summary.seconds:.1f} s, "
            f"{summary.rate:.0f} schedules/s, {len(summary.failed)} failed\n  {summary.stats}"
        )
    if summary.failed:
        lines = [f"seed {seed}: {failures[0]}" for seed, failures in summary.failed[:10]]
        pytest.fail(
            f"{len(summary.failed)} of {summary.schedules} schedules broke an invariant:\n"
            + "\n".join(lines)
            + f"\nreplay and shrink: {campaign.replay_command(summary.failed[0][0])}"
        )


def test_sqlite_schedules(capsys: pytest.CaptureFixture[str]) -> None:
    n = _env_int("SPARKONCE_SIM_SCHEDULES", 2_000)
    workers = _env_int("SPARKONCE_SIM_WORKERS", 1)
    restore = os.environ.get("SPARKONCE_SIM_RESTORE", "") == "1"
    campaign = Campaign(seed=SEED, schedules=n, workers=workers, with_restore=restore)
    summary = run_parallel(campaign)
    assert summary.schedules == n
    _report(capsys, f"SQLite, {workers} worker(s)", summary, campaign)
    # The faults were reached, not just planned.
    s = summary.stats
    if n >= 200:
        assert min(s.crashes, s.drops, s.fenced, s.zombies, s.nodata, s.skips) > 0, s


@pytest.mark.postgres
def test_postgres_schedules(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    n = _env_int("SPARKONCE_SIM_PG_SCHEDULES", 300)
    target = Target(pg_url)
    try:
        summary = run_schedules(target, range(SEED, SEED + n))
    finally:
        target.close()
    _report(capsys, "PostgreSQL, SQL sink", summary, Campaign(store="postgres"))


@pytest.mark.postgres
def test_postgres_twophase_schedules(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    n = _env_int("SPARKONCE_SIM_2PC_SCHEDULES", 40)
    target = Target(pg_url, sink="twophase")
    try:
        summary = run_schedules(target, range(SEED, SEED + n))
    finally:
        target.close()
    _report(
        capsys, "PostgreSQL, two-phase sink", summary, Campaign(store="postgres", sink="twophase")
    )


def test_a_seed_replays_identically(sqlite_target: Target) -> None:
    """Same seed, same schedule, same outcome: what a replay relies on."""
    for seed in (3, 17, 29):
        assert generate(seed) == generate(seed)
        first = run_schedule(generate(seed), sqlite_target)
        ledger = [(e.seq, e.ranges, e.epoch, e.row_count) for e in sqlite_target.entries()]
        second = run_schedule(generate(seed), sqlite_target)
        assert first == second
        assert ledger == [(e.seq, e.ranges, e.epoch, e.row_count) for e in sqlite_target.entries()]


def test_events_round_trip_through_json() -> None:
    for seed in range(50):
        schedule = generate(seed)
        assert Schedule.parse_events(schedule.events_json()) == schedule.events


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--store", "sqlite", "--schedules", "20", "--seed", "7"]) == 0
    assert "20 schedules" in capsys.readouterr().out
    assert main(["--store", "sqlite", "--replay", "7"]) == 0
    assert "passed" in capsys.readouterr().out
