"""``sparkonce verify --master spark://... --checkpoint s3a://...``: a crash-test campaign
whose drivers run on the standalone cluster, each run with a checkpoint of its own in a
real S3 bucket (moto's server), the state store's files written there by the executors.

A short one (a task failure and a kill) keeps the lane's time; ``scripts/cluster-campaign.py``
runs the long one. The task failure only fires if the driver handed its fault variables to
the executors (``spark.executorEnv``): on a cluster they are not the driver's children.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from sparkonce.log import IdempotentProducer, Topic
from tests.cluster.conftest import StartDriver
from tests.cluster.pipelines import write_sums_pipeline
from tests.services.s3 import S3Server, s3a_settings
from tests.services.spark_cluster import SparkCluster

pytestmark = pytest.mark.campaign_lane

RECORDS = 900  # 3 partitions, 150 per partition and batch: 2 batches
KEYS = 5


def test_verify_runs_its_trials_on_the_cluster_with_checkpoints_in_s3(
    start_driver: StartDriver,
    spark_cluster: SparkCluster,
    s3: S3Server,
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    log = tmp_path / "log"
    with Topic.create(log, "events", 3) as topic, IdempotentProducer(topic, "t") as producer:
        for i in range(RECORDS):
            producer.send(str(i).encode(), f"k{i % KEYS}".encode(), partition=i % 3)
    pipeline = write_sums_pipeline(
        tmp_path / "pipeline.py",
        name="cluster-verify",
        log=log,
        limit=150,
        sink=tmp_path / "sink.db",
        checkpoint=tmp_path / "cp",
    )
    out = tmp_path / "out"
    root = f"s3a://{s3_bucket}/verify"
    verify = start_driver(
        [
            "-m", "sparkonce", "verify", str(pipeline),
            "--master", spark_cluster.master_url,
            "--checkpoint", root,
            "--trials", "2",
            "--faults", "task-failure,kill",
            "--out", str(out),
        ],
        name="verify",
        settings=s3a_settings(s3),
    )  # fmt: skip
    code = verify.wait(900)
    assert code == 0, verify.tail(60)

    report = json.loads((out / "verify.json").read_text())
    trials = {t["fault"]["kind"]: t for t in report["trials"]}
    assert sorted(trials) == ["kill", "task-failure"]
    for kind, trial in trials.items():
        assert trial["passed"], (kind, trial)
        assert trial["fault_fired"], f"{kind} did not fire: {trial}"
        assert (trial["lost_rows"], trial["duplicated_rows"], trial["value_mismatches"]) == (
            0,
            0,
            0,
        )
    # The last trial's output, against the input: every key's sum and count.
    assert report["oracle"]["rows"] == KEYS
    expected = {
        f"k{k}": (sum(i for i in range(RECORDS) if i % KEYS == k), RECORDS // KEYS)
        for k in range(KEYS)
    }
    with sqlite3.connect(tmp_path / "sink.db") as db:
        found = {key: (total, n) for key, total, n in db.execute("SELECT key, total, n FROM sums")}
    assert found == expected

    # Every run had a checkpoint of its own under the root, and the executors wrote the
    # aggregation's state into each.
    keys = s3.list_keys(s3_bucket, "verify/cluster-verify/")
    runs = {k.split("/")[2] for k in keys}
    kinds = sorted({r.rsplit("-", 1)[0] for r in runs})
    assert kinds == ["oracle", "trial-00000", "trial-00001"], runs
    for run in runs:
        assert any(k.startswith(f"verify/cluster-verify/{run}/state/") for k in keys), run
        assert any(k.startswith(f"verify/cluster-verify/{run}/offsets/") for k in keys), run
    # Nothing was written to the pipeline file's own local checkpoint.
    assert not (tmp_path / "cp").exists()
