"""Tests of ``sparkonce explain``; :func:`explain_file` is shared with tests/verify, which
compares what explain says of a pipeline file with what verify finds when it runs it."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any


def explain_file(path: Path) -> dict[str, Any]:
    """``sparkonce explain PATH --json``, in this process, as parsed JSON."""
    from sparkonce.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["explain", str(path), "--json"])
    assert code == 0, f"sparkonce explain {path} exited {code}"
    return dict(json.loads(out.getvalue()))


def verdict(explained: dict[str, Any], part: str) -> str:
    return str(next(p for p in explained["parts"] if p["part"] == part)["verdict"])
