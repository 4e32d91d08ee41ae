"""A paused driver must not lock other writers out of the embedded log.

A stream reader polls the log all the time while its query is idle. If each poll opened and
closed its own SQLite connection, a driver stopped by SIGSTOP (a debugger, a frozen VM,
the live-takeover crash test) would most often be stopped inside that open or close, while
it holds the WAL shared-memory lock; every other process then fails with "locking
protocol" until it is continued. Seen once in tests/crash/test_live_takeover.py.

Here a real process polls ``EmbeddedLogStreamReader`` in a loop, is stopped at several
moments, and each time another connection appends to the topic.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sparkonce.log.storage import NewRecord, Topic

_POLLER = """
import sys
from sparkonce.sources.embedded import EmbeddedLogStreamReader
reader = EmbeddedLogStreamReader({"path": sys.argv[1], "topic": "events"})
reader._log_ends()
print("ready", flush=True)
while True:
    reader._log_ends()
"""


def test_appends_go_through_while_a_polling_reader_is_stopped(tmp_path: Path) -> None:
    Topic.create(tmp_path, "events", partitions=1).close()
    poller = subprocess.Popen(
        [sys.executable, "-c", _POLLER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert poller.stdout is not None and poller.stdout.readline().strip() == "ready"
        for trial in range(8):
            time.sleep(0.05 + 0.013 * trial)  # stop it at a different point of its loop
            poller.send_signal(signal.SIGSTOP)
            try:
                # The log's busy timeout would wait 60 s for a plain lock; "locking
                # protocol" is raised after about 10 s whatever the timeout.
                with Topic(tmp_path, "events") as topic:
                    topic.append(
                        0, [NewRecord(key=None, value=b"x")], producer_id="t", first_seq=trial
                    )
            finally:
                poller.send_signal(signal.SIGCONT)
        with Topic(tmp_path, "events") as topic:
            assert topic.end_offsets() == {0: 8}
        assert poller.poll() is None, "the poller died"
    finally:
        poller.kill()
        poller.wait()
