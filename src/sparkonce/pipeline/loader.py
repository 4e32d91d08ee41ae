"""Loading a pipeline definition file (``sparkonce run PIPELINE.py``).

The file is ordinary Python that defines a module-level ``pipeline`` (a
:class:`~sparkonce.Pipeline`) or a function ``build_pipeline()`` returning one.
Any error raised while the file runs (a missing module, a typo, a bad argument) is
reported as a :class:`~sparkonce.errors.ConfigError` that names the file, the line
in it and the original error; the original stays chained as ``__cause__``.
"""

from __future__ import annotations

import runpy
import traceback
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
    except Exception as exc:
        raise ConfigError(
            f"pipeline file {str(p)!r} failed to import{_where(exc, p)}: {_describe(exc)}"
            f"{_hint(exc)}"
        ) from exc
    if "pipeline" in namespace:
        found = namespace["pipeline"]
    elif callable(namespace.get("build_pipeline")):
        try:
            found = namespace["build_pipeline"]()
        except SparkOnceError as exc:
            raise ConfigError(f"pipeline file {str(p)!r}: {exc}") from exc
        except Exception as exc:
            raise ConfigError(
                f"pipeline file {str(p)!r}: build_pipeline() failed{_where(exc, p)}: "
                f"{_describe(exc)}"
            ) from exc
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


# PySpark's error condition when a UDF (``@F.udf``, ``F.pandas_udf``...) or another object
# that needs a SparkContext is made while none exists: at a pipeline file's top level, since
# sparkonce starts Spark only after the file is loaded.
_NO_SESSION = "SESSION_OR_CONTEXT_NOT_EXISTS"


def _hint(exc: BaseException) -> str:
    """Advice for an import error a pipeline file's own layout causes, or ``""``."""
    condition = getattr(exc, "getCondition", None)
    named = condition() if callable(condition) else None
    if named == _NO_SESSION or _NO_SESSION in str(exc):
        return (
            " sparkonce loads the file before it starts Spark, so a UDF (@F.udf, F.udf(...), "
            "F.pandas_udf) cannot be made at the file's top level: create it inside the "
            "transform, or in a function the transform calls"
        )
    return ""


def _describe(exc: BaseException) -> str:
    """``ModuleNotFoundError: No module named 'nope'``: the error's type and first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _where(exc: BaseException, path: Path) -> str:
    """`` (line N)`` of the innermost frame in the pipeline file, or ``""``."""
    target = path.resolve()
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == target:
            line = frame.lineno
    return f" (line {line})" if line is not None else ""
