"""Every benchmark script imports: they run rarely (make bench*), so a moved helper would
otherwise break one unseen until its next measurement."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHMARKS = sorted(
    p.stem for p in (Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py")
)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_the_benchmark_script_imports(name: str) -> None:
    importlib.import_module(f"benchmarks.{name}")
