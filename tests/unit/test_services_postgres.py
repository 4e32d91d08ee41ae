"""The tests' throwaway PostgreSQL (tests/services/postgres.py) under pytest's temp root."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.services import postgres


@pytest.mark.postgres
def test_a_cluster_under_a_pytest_temp_root_outlives_another_session_resetting_its_mode(
    tmp_path: Path,
) -> None:
    """Every pytest session that starts makes /tmp/pytest-of-<user> 0700 again. A cluster
    reached through it (as root, PostgreSQL runs as the postgres user) then died at its next
    checkpoint ("could not open file .../global/pg_control: Permission denied"): the
    Kafka broker-fault campaign's server did, while a mutation run's sessions started."""
    root = tmp_path / "pytest-of-someone"  # named as pytest's root is
    root.mkdir(mode=0o700)
    datadir = root / "pytest-7" / "postgres"
    server = postgres.start(datadir)
    try:
        root.chmod(0o700)  # what a pytest session starting meanwhile does
        with psycopg.connect(server.url, autocommit=True, connect_timeout=10) as conn:
            conn.execute("CHECKPOINT")  # the server reads and writes global/pg_control
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pointer = datadir / postgres.LOCATION_FILE
        relocated = Path(pointer.read_text().strip()) if pointer.is_file() else None
        postgres.remove(datadir)
    assert not datadir.exists()
    assert relocated is None or not relocated.parent.exists()  # nothing left in the temp dir
