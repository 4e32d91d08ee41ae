"""Helpers of the ``sparkonce ui`` tests: a closed port, a password URL, the repo's report."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CAMPAIGN_REPORT = REPO / "benchmarks" / "results" / "verify-campaign.json"
SECRET = "s3cret-pw"


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def unreachable_pg() -> str:
    """A PostgreSQL URL with a password, on a port nothing listens on."""
    return f"postgresql://watcher:{SECRET}@127.0.0.1:{closed_port()}/nowhere"
