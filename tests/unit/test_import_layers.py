"""The import contracts of pyproject.toml ([tool.importlinter], checked by ``make lint``) hold
for the code, and they can fail: an upward import planted in a copy of the package breaks
them, naming that import.

Runs ``lint-imports`` (import-linter, from the dev extra) on a copy of ``src/sparkonce``, with
``PYTHONPATH`` pointing at the copy and pyproject.toml's contracts as the configuration. No
Spark, about a second per run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import sparkonce

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PLANTED = "import sparkonce.pipeline.runner  # planted: the bottom layer reaching the top\n"


def _copy(tmp_path: Path) -> Path:
    """A copy of the package under test, and pyproject.toml's contracts beside it."""
    src = tmp_path / "src"
    shutil.copytree(
        Path(sparkonce.__file__).parent,
        src / "sparkonce",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    return src


def _lint(tmp_path: Path, src: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(LINT_IMPORTS), str(tmp_path / "pyproject.toml"), "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_import_contracts_hold_and_fail_on_an_upward_import(tmp_path: Path) -> None:
    src = _copy(tmp_path)
    clean = _lint(tmp_path, src)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert " kept, 0 broken." in clean.stdout

    offsets = src / "sparkonce" / "offsets.py"
    lines = offsets.read_text().count("\n")
    offsets.write_text(offsets.read_text() + PLANTED)
    planted = _lint(tmp_path, src)
    assert planted.returncode == 1, planted.stdout + planted.stderr
    out = planted.stdout
    # The layers contract names the planted import, with its line.
    assert "Layers: the command line on top, the error hierarchy at the bottom BROKEN" in out
    assert "sparkonce.offsets is not allowed to import sparkonce.pipeline" in out
    assert f"- sparkonce.offsets -> sparkonce.pipeline.runner (l.{lines + 1})" in out
    # And it makes a circle: the pipeline imports offsets.
    assert "No import circles between sibling modules or packages BROKEN" in out
