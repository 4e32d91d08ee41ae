"""Where SQLite files are opened, process by process (tests/cluster/test_pipeline.py).

Python imports ``sitecustomize`` at start from its path. With this directory on
``PYTHONPATH`` and ``SPARKONCE_TEST_SQLITE_AUDIT`` naming a file, every ``sqlite3.connect``
of the process appends one JSON line to that file: the pid, the interpreter, the working
directory (a driver's, or an executor's under a worker's work dir) and the database. An
audit hook only watches: nothing the process does changes. The cluster tests put this
directory on the driver's path and, through ``spark.executorEnv``, on the path of every
Python worker Spark starts, on the driver's side and on executors.
"""

import os

_AUDIT_FILE = os.environ.get("SPARKONCE_TEST_SQLITE_AUDIT", "")

if _AUDIT_FILE:
    import json
    import sys

    def _record(event: str, args: tuple[object, ...]) -> None:
        if event != "sqlite3.connect":
            return
        line = {
            "pid": os.getpid(),
            "executable": sys.executable,
            "cwd": os.getcwd(),
            "database": str(args[0]) if args else None,
            "argv": sys.argv[:3],
        }
        with open(_AUDIT_FILE, "a") as f:
            f.write(json.dumps(line) + "\n")

    sys.addaudithook(_record)
