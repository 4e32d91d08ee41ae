"""A `sparkonce verify` campaign on a Spark standalone cluster with its checkpoints on S3.

    .venv/bin/python scripts/cluster-campaign.py [TRIALS] [VERIFY OPTIONS...]   (default 50)

What it starts, all throwaway and on 127.0.0.1 (tests/services):

* a moto S3 server, with the bucket ``verify``: every run's checkpoint is a fresh prefix
  ``s3a://verify/campaign/cluster-campaign/RUN-ID`` (``verify --checkpoint``), so the
  state store's files are written by the executors into the bucket, and the offset and
  commit logs by the driver;
* a master and two workers of 4 cores each. Every driver takes one core per worker, so
  two trials run at a time (each on its own SQLite store), each with room for a zombie
  driver beside its successor;
* the executors' Python, packed by ``scripts/pack-executor-env.sh`` and shipped by every
  driver through ``spark.archives``, as docs/guides/cluster.md ("Running on a cluster") describes.

The pipeline is ``scripts/verify-campaign.sh``'s: per-key sums (a stateful aggregation)
from an embedded log (one file, which every node here sees at the same path) into SQLite,
upsert by key. Kill, crash-point, task-failure and zombie take turns. The report is kept
in ``benchmarks/results/verify-cluster.json`` (recovery chart: ``verify-cluster.png``) and
the campaign resumes from it: each call runs the trials not there yet. The seed is
``SPARKONCE_CAMPAIGN_SEED`` (default 1).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.services

from tests.cluster.pipelines import write_sums_pipeline  # noqa: E402
from tests.services.spark_cluster import cluster_with_s3  # noqa: E402

NAME = "verify-cluster"
WORK = REPO / ".cache" / "cluster-campaign"
BUCKET = "verify"
PY = REPO / ".venv" / "bin" / "python"
KINDS = "kill,crash-point,task-failure,zombie"


def sparkonce(*args: str, stdin: str | None = None) -> None:
    subprocess.run([str(PY), "-m", "sparkonce", *args], input=stdin, text=True, check=True)


def make_input() -> Path:
    log = WORK / "log"
    if not (log / "events.db").exists():
        sparkonce("log", "create", str(log), "events", "--partitions", "3")
        lines = "".join(f"k{i % 6}\t{i}\n" for i in range(1, 1201))
        sparkonce("log", "produce", str(log), "events", "--separator", "\t", stdin=lines)
    return log


def main(argv: list[str]) -> int:
    trials = argv[0] if argv and not argv[0].startswith("-") else "50"
    options = argv[1:] if argv and not argv[0].startswith("-") else argv
    WORK.mkdir(parents=True, exist_ok=True)
    out = WORK / "out"
    out.mkdir(exist_ok=True)
    result = REPO / "benchmarks" / "results" / f"{NAME}.json"
    if result.exists() and not (out / "verify.json").exists():
        shutil.copy(result, out / "verify.json")
    log = make_input()
    pipeline = write_sums_pipeline(
        WORK / "pipeline.py",
        name="cluster-campaign",
        log=log,
        limit=200,
        sink=WORK / "sink.db",
        checkpoint=WORK / "checkpoint",
    )
    status = 1
    try:
        with cluster_with_s3(WORK, buckets=[BUCKET], cores=4) as run:
            cmd = [
                str(PY),
                "-m",
                "sparkonce",
                "verify",
                str(pipeline),
                "--master",
                run.cluster.master_url,
                "--checkpoint",
                f"s3a://{BUCKET}/campaign",
                "--trials",
                trials,
                "--seed",
                os.environ.get("SPARKONCE_CAMPAIGN_SEED", "1"),
                "--faults",
                KINDS,
                "--resume",
                "--out",
                str(out),
                "--sink",
                f"sqlite:///{WORK / 'sink.db'}",
                "--sink",
                f"sqlite:///{WORK / 'sink2.db'}",
                *options,
            ]
            status = subprocess.run(cmd, cwd=run.driver_dir, env=run.env, check=False).returncode
    finally:
        if (out / "verify.json").exists():
            shutil.copy(out / "verify.json", result)
        if (out / "recovery.png").exists():
            shutil.copy(out / "recovery.png", result.with_suffix(".png"))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
