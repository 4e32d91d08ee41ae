"""Loading a pipeline definition file (``sparkonce run PIPELINE.py``).

The file is ordinary Python that defines a module-level ``pipeline`` (a
:class:`~sparkonce.Pipeline`) or a function ``build_pipeline()`` returning one.
"""

from __future__ import annotations

import runpy
from pathlib import Path

from sparkonce.errors import ConfigError, SparkOnceError
from sparkonce.pipeline.pipeline import Pipeline


def load_pipeline(path: str | Path) -> Pipeline:
    """Execute ``path`` and return the Pipeline it defines."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"pipeline file {str(p)!r} does not exist")
    try:
        namespace = runpy.run_path(str(p), run_name="sparkonce_pipeline")
    except SparkOnceError as exc:
        raise ConfigError(f"pipeline file {str(p)!r}: {exc}") from exc
    except SyntaxError as exc:
        raise ConfigError(f"pipeline file {str(p)!r} line {exc.lineno}: {exc.msg}") from exc
    if "pipeline" in namespace:
        found = namespace["pipeline"]
    elif callable(namespace.get("build_pipeline")):
        try:
            found = namespace["build_pipeline"]()
        except SparkOnceError as exc:
            raise ConfigError(f"pipeline file {str(p)!r}: {exc}") from exc
    else:
        raise ConfigError(
            f"pipeline file {str(p)!r} defines neither 'pipeline' nor 'build_pipeline()'; "
            "add: pipeline = Pipeline(name=..., source=..., sink=..., checkpoint=...)"
        )
    if not isinstance(found, Pipeline):
        raise ConfigError(
            f"pipeline file {str(p)!r}: 'pipeline' is a {type(found).__name__}, not a "
            "sparkonce.Pipeline"
        )
    return found
