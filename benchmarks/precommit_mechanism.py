"""How should a PostgreSQL 2PC sink hide pre-committed rows? Three mechanisms, side by side.

Run from the repository root (starts a throwaway PostgreSQL unless ``--url`` is given)::

    .venv/bin/python benchmarks/precommit_mechanism.py --rows 1000000 --attempts 4

Every mechanism loads the same rows with COPY in ``--attempts`` pre-commit transactions (as
executor tasks would), then commits them in one driver transaction, then a reader scans what
is visible. Measured per mechanism: pre-commit seconds, commit seconds (the time the driver
holds the pipeline's owner row lock, i.e. the commit latency), and reader scan seconds.

- ``row-status``: a status column on every row, flipped by ``UPDATE`` at commit; readers use a
  view filtering ``status = 'committed'``.
- ``staging``: one staging table per attempt, merged into the output with ``INSERT ... SELECT``
  at commit, then dropped; readers read the output table.
- ``attempt-status``: every row carries its attempt id; a small attempts table holds one status
  per attempt, flipped at commit; readers use a view that keeps rows of committed attempts.

Writes ``benchmarks/results/precommit-mechanism.json``.
"""

from __future__ import annotations

import argparse
import io
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import write_results  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "precommit-mechanism.json"


def payload(start: int, n: int) -> bytes:
    buf = io.StringIO()
    for i in range(start, start + n):
        buf.write(f"{i}\tk{i % 1000}\t{i * 7}\n")
    return buf.getvalue().encode()


class Mechanism:
    name = ""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def setup(self) -> None: ...
    def tag(self, attempt: int, data: bytes) -> bytes:
        """The COPY payload of ``attempt`` (prepared before the clock starts)."""
        return data

    def precommit(self, attempt: int, data: bytes) -> None: ...
    def commit(self, attempts: list[int]) -> None: ...
    def read_sql(self) -> str:
        return ""

    def copy(self, sql: str, data: bytes) -> None:
        with self.conn.cursor() as cur, cur.copy(sql) as cp:
            cp.write(data)


class RowStatus(Mechanism):
    name = "row-status"

    def setup(self) -> None:
        self.conn.execute(
            "CREATE TABLE m_rows (id bigint, key text, value bigint, attempt bigint, "
            "status text NOT NULL DEFAULT 'precommit')"
        )
        self.conn.execute(
            "CREATE VIEW m_view AS SELECT id, key, value FROM m_rows WHERE status = 'committed'"
        )

    def precommit(self, attempt: int, data: bytes) -> None:
        tagged = b"".join(line + f"\t{attempt}\tprecommit\n".encode() for line in data.splitlines())
        with self.conn.transaction():
            self.copy("COPY m_rows (id, key, value, attempt, status) FROM STDIN", tagged)

    def commit(self, attempts: list[int]) -> None:
        with self.conn.transaction():
            self.conn.execute(
                "UPDATE m_rows SET status = 'committed' WHERE attempt = ANY(%s)", (attempts,)
            )

    def read_sql(self) -> str:
        return "SELECT count(*), sum(value) FROM m_view"


class Staging(Mechanism):
    name = "staging"

    def setup(self) -> None:
        self.conn.execute("CREATE TABLE m_out (id bigint, key text, value bigint)")

    def precommit(self, attempt: int, data: bytes) -> None:
        with self.conn.transaction():
            self.conn.execute(f"CREATE TABLE m_stage_{attempt} (id bigint, key text, value bigint)")
            self.copy(f"COPY m_stage_{attempt} FROM STDIN", data)

    def commit(self, attempts: list[int]) -> None:
        with self.conn.transaction():
            for a in attempts:
                self.conn.execute(f"INSERT INTO m_out SELECT * FROM m_stage_{a}")
                self.conn.execute(f"DROP TABLE m_stage_{a}")

    def read_sql(self) -> str:
        return "SELECT count(*), sum(value) FROM m_out"


class AttemptStatus(Mechanism):
    name = "attempt-status"

    def setup(self) -> None:
        self.conn.execute(
            "CREATE TABLE m_attempts (attempt bigint PRIMARY KEY, state text NOT NULL)"
        )
        self.conn.execute(
            "CREATE TABLE m_data (id bigint, key text, value bigint, attempt bigint NOT NULL)"
        )
        self.conn.execute(
            "CREATE VIEW m_view AS SELECT id, key, value FROM m_data WHERE attempt "
            "IN (SELECT attempt FROM m_attempts WHERE state = 'committed')"
        )

    def tag(self, attempt: int, data: bytes) -> bytes:
        return b"".join(line + f"\t{attempt}\n".encode() for line in data.splitlines())

    def precommit(self, attempt: int, data: bytes) -> None:
        with self.conn.transaction():
            self.conn.execute("INSERT INTO m_attempts VALUES (%s, 'precommit')", (attempt,))
            self.copy("COPY m_data (id, key, value, attempt) FROM STDIN", data)

    def commit(self, attempts: list[int]) -> None:
        with self.conn.transaction():
            self.conn.execute(
                "UPDATE m_attempts SET state = 'committed' WHERE attempt = ANY(%s)", (attempts,)
            )

    def read_sql(self) -> str:
        return "SELECT count(*), sum(value) FROM m_view"


def measure(conn: Any, mech: Mechanism, rows: int, attempts: int) -> dict[str, float]:
    conn.execute("DROP SCHEMA IF EXISTS bench CASCADE")
    conn.execute("CREATE SCHEMA bench")
    conn.execute("SET search_path = bench")
    mech.setup()
    per = rows // attempts
    chunks = [payload(a * per, per) for a in range(attempts)] + [payload(0, per)]
    # The last chunk is a failed attempt's copy of the first: its rows must stay invisible.
    tagged = [mech.tag(a + 1, data) for a, data in enumerate(chunks)]
    t0 = time.perf_counter()
    for a, data in enumerate(tagged):
        mech.precommit(a + 1, data)
    pre = time.perf_counter() - t0
    t0 = time.perf_counter()
    mech.commit(list(range(1, attempts + 1)))
    commit = time.perf_counter() - t0
    conn.execute("VACUUM ANALYZE")
    reads = []
    for _ in range(3):
        t0 = time.perf_counter()
        count, total = conn.execute(mech.read_sql()).fetchone()
        reads.append(time.perf_counter() - t0)
    assert count == per * attempts, (mech.name, count)
    assert int(total) == sum(i * 7 for i in range(per * attempts)), mech.name
    return {"precommit_s": pre, "commit_s": commit, "read_s": statistics.median(reads)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--attempts", type=int, default=4)
    ap.add_argument("--url", help="postgresql:// URL (default: a throwaway server)")
    args = ap.parse_args()
    import psycopg

    server = None
    url = args.url
    if url is None:
        from tests.services import postgres

        server = Path(tempfile.mkdtemp(prefix="sparkonce-bench-pg-"))
        url = postgres.start(server).url
    try:
        results = {}
        with psycopg.connect(url, autocommit=True) as conn:
            for cls in (RowStatus, Staging, AttemptStatus):
                results[cls.name] = measure(conn, cls(conn), args.rows, args.attempts)
                r = results[cls.name]
                print(
                    f"{cls.name:15} precommit {r['precommit_s']:6.2f} s   commit "
                    f"{r['commit_s']:7.3f} s   reader scan {r['read_s']:6.3f} s",
                    flush=True,
                )
            conn.execute("DROP SCHEMA bench CASCADE")
    finally:
        if server is not None:
            postgres.stop(server)
    write_results(
        OUT,
        {
            "benchmark": "precommit-mechanism",
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()}, {platform.system()} {platform.release()}",
            "rows": args.rows,
            "attempts": args.attempts,
            "note": "one extra, failed attempt of the first chunk is pre-committed, never "
            "committed; readers must not see it",
            "results": results,
        },
    )
    print(f"wrote {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
