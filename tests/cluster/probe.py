"""A driver program for tests/cluster/test_session.py:
``python probe.py MASTER OUT RELEASE [LOG_DIR]``.

It builds its session as ``sparkonce run`` does (:func:`sparkonce.build_session`, so the
environment's ``PYSPARK_PYTHON`` and ``SPARK_CONF_DIR`` apply), runs a Python UDF in
``TASKS`` tasks, and writes what each task saw, with the driver's own facts, to OUT as
JSON. With LOG_DIR it also counts the records of the embedded log's topic ``events`` there
(``log_rows``), or records why it could not (``log_error``). It then keeps the session (and
so the executors) alive until the file RELEASE appears, so that the test can look at the
executor processes, and stops.

It runs as a process of its own: a session on the cluster cannot share a process with the
tests' ``local[2]`` one. Only PySpark and sparkonce are imported, no test module.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

TASKS = 8
TASK_SECONDS = 0.5  # long enough that both single-core executors get tasks
RELEASE_TIMEOUT_S = 120.0
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def task_facts(_row_id: int) -> str:
    """What a task's Python worker sees: its interpreter, where modules come from, and the
    executor JVM above it (found by walking up the process tree)."""
    import os
    import sys
    import time
    from pathlib import Path

    time.sleep(TASK_SECONDS)
    executor: dict[str, Any] | None = None
    pid = os.getpid()
    while pid > 1:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        if EXECUTOR_CLASS in args:
            executor = {"pid": pid, "worker_url": args[args.index("--worker-url") + 1]}
            break
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    modules = {}
    for name in ("sparkonce", "confluent_kafka", "psycopg", "pyspark"):
        module = __import__(name)
        modules[name] = module.__file__
    return json.dumps(
        {
            "pid": os.getpid(),
            "executable": sys.executable,
            "prefix": sys.prefix,
            "cwd": os.getcwd(),
            "executor": executor,
            "modules": modules,
        }
    )


def count_log(spark: Any, log_dir: Path) -> dict[str, Any]:
    """The embedded log's records counted through sparkonce's source, or the error."""
    from sparkonce import EmbeddedLogSource

    try:
        return {"log_rows": EmbeddedLogSource(log_dir, "events").read_all(spark).count()}
    except Exception as exc:  # reported to the test, which decides
        return {"log_error": f"{type(exc).__name__}: {exc}"[:2000]}


def main(master: str, out: Path, release: Path, log_dir: Path | None) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from sparkonce import build_session

    spark = build_session(master=master, app_name="sparkonce-cluster-probe", quick_start=True)
    sc = spark.sparkContext
    facts = F.udf(task_facts, T.StringType())
    rows = spark.range(0, TASKS, 1, TASKS).select(facts("id").alias("facts")).collect()
    assert sc._jvm is not None
    result = {
        "app_id": sc.applicationId,
        "driver_pid": os.getpid(),
        "driver_jvm_pid": int(sc._jvm.java.lang.ProcessHandle.current().pid()),
        "driver_executable": sys.executable,
        "python_exec": sc.pythonExec,
        "tasks": [json.loads(r.facts) for r in rows],
    }
    if log_dir is not None:
        result.update(count_log(spark, log_dir))
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.rename(out)
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    spark.stop()


if __name__ == "__main__":
    main(
        sys.argv[1],
        Path(sys.argv[2]),
        Path(sys.argv[3]),
        Path(sys.argv[4]) if sys.argv[4:] else None,
    )
