"""``python -m tests.crash.user_program FILE``: run FILE as a user's own PySpark program (as
``__main__``), not through ``sparkonce run``: the driver processes of
tests/crash/test_foreach_batch_crash.py, whose query hands ``foreachBatch`` sparkonce's
function."""

from __future__ import annotations

import runpy
import sys

if __name__ == "__main__":
    runpy.run_path(sys.argv[1], run_name="__main__")
