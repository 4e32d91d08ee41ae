"""mkdocs hook: the reference pages' generated parts, rendered from the code at build time.

A page holds a marker line, ``<!-- generated: NAME -->``, and :func:`on_page_markdown`
replaces it with:

- ``api``: one mkdocstrings block (``::: sparkonce.NAME``) per name in ``sparkonce.__all__``;
- ``cli``: ``sparkonce --help`` and every subcommand's ``--help``, from the parser objects
  of ``sparkonce.cli`` (``build_parser()``), walked recursively;
- ``environment``: every environment variable ``src/`` reads, with the options that read it
  (their ``--help``) or :data:`ENV_NOTES`;
- ``results NAME``: the table of ``benchmarks/results/NAME.json``, naming the file and the
  date, machine and commit it records, then its chart (``NAME.png``, where there is one)
  and its dated ``notes`` (a list of ``{"date", "commit", "text"}``) in a folded block;
- ``performance``: the same for every results file that no ``results NAME`` marker of the
  page shows;
- ``errors``: every class of ``sparkonce.errors`` with its base, the exit code the CLI gives
  it (the CLI's own mapping, ``sparkonce.cli.common._report``), its docstring and a link to
  its runbook (:data:`RUNBOOK_OF`, for the class or its nearest base class listed there).

The code comes from this checkout's ``src/``, not from whatever is installed. A marker no
generator knows, or a ``results`` marker naming no file, fails the build. :func:`on_files`
puts the results' charts on the site as ``results/NAME.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
MARKER = re.compile(r"^<!-- generated: (\w+)(?: ([\w.-]+))? -->$", re.M)
HELP_COLUMNS = "100"


def _use_src() -> None:
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))


@contextlib.contextmanager
def _plain_environment() -> Iterator[None]:
    """No ``SPARKONCE_*`` variables (their values would show as defaults) and a fixed
    width, so the rendered help is the same on every machine."""
    saved = dict(os.environ)
    for name in [n for n in os.environ if n.startswith("SPARKONCE_")]:
        del os.environ[name]
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def api_markdown() -> str:
    _use_src()
    import sparkonce

    return "\n\n".join(f"::: sparkonce.{name}" for name in sorted(sparkonce.__all__)) + "\n"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(parser: argparse.ArgumentParser, words: list[str]) -> Iterator[tuple[str, str]]:
    yield " ".join(words), parser.format_help()
    for name, sub in _subcommands(parser).items():
        yield from _walk(sub, [*words, name])


def cli_markdown() -> str:
    _use_src()
    with _plain_environment():
        from sparkonce.cli import build_parser

        parser = build_parser()
        parser.prog = "sparkonce"
        sections = []
        for command, text in _walk(parser, ["sparkonce"]):
            level = "#" * min(2 + command.count(" "), 4)
            body = text.rstrip().replace("```", "'''")
            sections.append(f"{level} `{command}`\n\n```text\n{body}\n```\n")
    return "\n".join(sections)


def _exit_code(cls: type[BaseException]) -> int:
    """The exit code the CLI gives an error of class ``cls``: its own ``_report``, called on
    an instance made without ``__init__`` (some take keyword-only ids), output discarded."""
    from sparkonce.cli.common import _report

    exc: Any = cls.__new__(cls)
    exc.args = ("(generated)",)
    if "signal_number" in inspect.signature(cls.__init__).parameters:
        exc.signal_number = None
    with contextlib.redirect_stderr(io.StringIO()):
        return _report(exc)


# The runbook (a page of docs/operations/, or another page, relative to docs/) of each error
# class; a class not listed gets its nearest listed base class's.
RUNBOOK_OF = {
    "SparkOnceError": "operations/index.md",
    "FencedError": "operations/fenced.md",
    "CheckpointError": "operations/checkpoint-ahead.md",
    "CheckpointLostError": "operations/checkpoint-lost.md",
    "StoreUnavailableError": "operations/store-unavailable.md",
    "PipelineError": "operations/bad-record.md",
    "SourceError": "operations/bad-input.md",
    "SequenceError": "operations/index.md",
    "OffsetOutOfRangeError": "operations/offsets-gone.md",
    "LedgerError": "operations/ledger-error.md",
    "SinkError": "operations/sink-refused.md",
    "ConfigError": "operations/bad-input.md",
    "PipelineRunningError": "operations/reset.md",
    "VerificationError": "guides/verify.md",
}


def runbook_of(cls: type[BaseException]) -> str:
    """The runbook of error class ``cls``: its own, or its nearest listed base class's."""
    for c in cls.__mro__:
        if c.__name__ in RUNBOOK_OF:
            return RUNBOOK_OF[c.__name__]
    raise ValueError(f"{cls.__name__} is no SparkOnceError")


def errors_markdown() -> str:
    _use_src()
    from sparkonce import errors

    classes = [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.SparkOnceError) and c.__module__ == errors.__name__
    ]
    classes.sort(key=lambda c: (len(c.__mro__), c.__name__))
    rows = [
        "| error | is a | exit code | what it means, and what to do | runbook |",
        "|---|---|---:|---|---|",
    ]
    for cls in classes:
        bases = ", ".join(f"`{b.__name__}`" for b in cls.__bases__)
        code = str(_exit_code(cls))
        if issubclass(cls, errors.RunStopped):
            code = "130 (SIGINT), 143 (SIGTERM)"
        doc = " ".join((inspect.getdoc(cls) or "").split()).replace("|", "\\|")
        page = runbook_of(cls)
        title = "operations" if page == RUNBOOK_OF["SparkOnceError"] else Path(page).stem
        link = f"[{title}](../{page})"
        rows.append(f"| `{cls.__name__}` | {bases} | {code} | {doc} | {link} |")
    return "\n".join(rows) + "\n"


# -- environment variables ------------------------------------------------------------------

# A variable read by the code: a string literal naming a SPARKONCE_* variable, or any name
# passed to os.environ.get / os.environ[...] / os.environ.setdefault / os.getenv.
_ENV_LITERAL = re.compile(r"[\"'](SPARKONCE_[A-Z0-9_]*[A-Z0-9])[\"']")
_ENV_READ = re.compile(
    r"(?:environ(?:\.get|\.setdefault)?\(|environ\[|getenv\()\s*[\"']([A-Z][A-Z0-9_]*)[\"']"
)

# What the variables no command-line option reads mean (the options' own say it in --help).
ENV_NOTES = {
    "SPARKONCE_CRASH_AT": "fault injection (verify, tests): kill the process at a named point "
    "of the commit protocol, `NAME[@N]`; see `sparkonce.protocol`",
    "SPARKONCE_PAUSE_AT": "fault injection: SIGSTOP the process at a named point (a zombie "
    "driver), `NAME[@N]`; see `sparkonce.protocol`",
    "SPARKONCE_DROP_CONNECTION_AT": "fault injection: a SQL sink loses its connection at a "
    "named point, `NAME[@N]`; see `sparkonce.protocol`",
    "SPARKONCE_FAIL_TASKS": "fault injection: `read`, `write` or both: about half of those "
    "Spark tasks fail once; see `sparkonce.protocol`",
    "SPARKONCE_PAUSE_TASKS": "fault injection: `write`: each Kafka sink task stops itself "
    "(SIGSTOP) before its commit, its transaction open; see `sparkonce.protocol`",
    "SPARKONCE_FAULT_EVENTS": "a file where each injected fault is recorded as it fires",
    "SPARK_CONNECT_AUTHENTICATE_TOKEN": "the token of the Spark Connect server that "
    "`--remote local[N]` starts in the process (PySpark's client sends it); set to a fresh "
    "random one when unset",
    "SPARK_CONNECT_MODE_ENABLED": "set (not read) by `--remote local[N]` once its Connect "
    "client exists, as PySpark sets it, so `pyspark.sql.functions` builds Connect columns",
    "SPARKONCE_JAR_CACHE": "a directory holding the fetched jars by kind (`delta/`, `s3/`, "
    "`spark-kafka/`), as `sparkonce jars fetch --dir` writes it; looked at first, then "
    "`$XDG_CACHE_HOME/sparkonce/jars` (where `sparkonce jars fetch` puts them), then "
    "`.cache/jars` of a checkout",
    "SPARKONCE_DELTA_JARS": "a directory holding the Delta Lake jars (else `delta/` of the jar "
    "cache)",
    "SPARKONCE_S3_JARS": "a directory holding the S3A jars (else `s3/` of the jar cache)",
    "SPARKONCE_SPARK_KAFKA_JARS": "a directory holding Spark's Kafka connector jars "
    "(`SparkKafkaSource`; else `spark-kafka/` of the jar cache)",
    "SPARKONCE_CACHE_DIR": "where the JVM class-data archive is kept (default "
    "`$XDG_CACHE_HOME/sparkonce`)",
    "SPARKONCE_NO_CLASS_DATA": "any value: start Spark's JVM without the class-data archive",
    "XDG_CACHE_HOME": "the base of the default cache directories, of the JVM archive and of "
    "the jars `sparkonce jars fetch` downloads (default `~/.cache`)",
    "JAVA_HOME": "the JVM whose class-data archive is built and used",
    "PYSPARK_PYTHON": "the Python of Spark's workers; set to the running interpreter when unset",
    "PYSPARK_DRIVER_PYTHON": "the Python of Spark's driver; set to the running interpreter "
    "when unset",
    "TMPDIR": "temporary files of the protocol simulation, when `/dev/shm` is absent",
}


def env_vars_read() -> set[str]:
    """Every environment variable the code in ``src/`` reads (see :data:`_ENV_LITERAL`)."""
    names: set[str] = set()
    for path in (SRC / "sparkonce").rglob("*.py"):
        text = path.read_text()
        names |= set(_ENV_LITERAL.findall(text)) | set(_ENV_READ.findall(text))
    return names


def _env_options() -> dict[str, list[str]]:
    """Variable -> the command-line options that take their default from it (``(env: NAME)``
    in their help)."""
    from sparkonce.cli import build_parser

    parser = build_parser()
    parser.prog = "sparkonce"
    found: dict[str, list[str]] = {}
    for command, sub in _walk_parsers(parser, ["sparkonce"]):
        for action in sub._actions:
            for name in re.findall(r"\(env: (\w+)", action.help or ""):
                flag = max(action.option_strings, key=len, default=action.dest.upper())
                text = re.sub(r"\s*\(env: [^)]*\)", "", action.help or "")
                found.setdefault(name, []).append(f"`{command} {flag}`: {text}")
    return found


def _walk_parsers(
    parser: argparse.ArgumentParser, words: list[str]
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield " ".join(words), parser
    for name, sub in _subcommands(parser).items():
        yield from _walk_parsers(sub, [*words, name])


def environment_markdown() -> str:
    _use_src()
    with _plain_environment():
        options = _env_options()
    rows = ["| variable | read by | meaning |", "|---|---|---|"]
    for name in sorted(env_vars_read()):
        if name in options:
            uses = "<br>".join(options[name]).replace("|", "\\|")
            rows.append(f"| `{name}` | the option's default | {uses} |")
        elif name in ENV_NOTES:
            rows.append(f"| `{name}` | sparkonce itself | {ENV_NOTES[name]} |")
        else:
            raise ValueError(
                f"{name} is read in src/ but no option's help names it and ENV_NOTES (docs/"
                "hooks.py) does not describe it: add it there"
            )
    return "\n".join(rows) + "\n"


# -- performance tables -----------------------------------------------------------------------

RESULTS = SRC.parent / "benchmarks" / "results"
# The columns a results table shows first, when its rows have them (at most MAX_COLUMNS); rows
# with none of them at the top but nested per variant show those (``_preferred_nested``).
PREFERRED = (
    "kind",
    "trials",
    "passed",
    "fired",
    "bronze_rows",
    "target_rows",
    "lost_rows",
    "duplicated_rows",
    "value_mismatches",
    "recovery_mean_s",
    "recovery_p95_s",
    "records_per_s",
    "vs_copy_limit",
    "vs_at_least_once",
    "vs_counterpart",
    "ratio",
    "steady_records_per_s",
    "records_per_cpu_s",
    "python_driver_peak_mb",
    "jvm_driver_peak_mb",
    "commit_p50_s",
    "commit_p99_s",
    "batch_p50_s",
    "batch_p99_s",
    "precommit_s",
    "commit_s",
    "read_s",
    "median_s",
    "per_batch_ms",
    "extra_per_batch_ms",
    "best_s",
    "records_per_s_median",
    "goal_met",
    # benchmarks/iceberg.py --mode snapshots: where a commit's time goes by history size.
    "split_p50_s.look",
    "split_p50_s.commit",
    "split_p50_s.after",
    "metadata_mb",
    "manifests",
    "parse_metadata_s",
    "copy_metadata_s",
    "committed_dirs_s",
)
MAX_COLUMNS = 10
Scalar = str | int | float | bool | None


def _scalars(row: dict[str, Any], prefix: str = "", depth: int = 1) -> dict[str, Scalar]:
    """The row's scalar values; a nested dict's (``depth`` levels) as ``key.sub``."""
    out: dict[str, Scalar] = {}
    for k, v in row.items():
        if isinstance(v, dict) and depth > 0:
            out.update(_scalars(v, f"{prefix}{k}.", depth - 1))
        elif v is None or isinstance(v, (str, int, float, bool)):
            out[f"{prefix}{k}"] = v
    return out


def _cell(v: Scalar) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _rows_of(data: dict[str, Any]) -> tuple[str, list[tuple[str, dict[str, Scalar]]]] | None:
    """The table of a results file: (first column's name, rows), or None for a file of
    plain values."""
    for key in ("summary", "results", "readers", "runs"):
        value = data.get(key)
        if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            rows = [_scalars(r) for r in value]
            first = "kind" if all("kind" in r for r in rows) else "#"
            return first, [(str(r.pop("kind", i)), r) for i, r in enumerate(rows)]
        if isinstance(value, dict) and value and all(isinstance(r, dict) for r in value.values()):
            return "variant", [(name, _scalars(r)) for name, r in value.items()]
    return None


def _preferred_nested(keys: list[str]) -> list[str]:
    """The nested keys (``variant.key``) whose last part is in :data:`PREFERRED`, in its
    order, each nesting in the rows' order: the columns of a table whose rows hold one dict
    per variant (``benchmarks/connect.py``: ``classic.per_batch_ms``,
    ``connect.per_batch_ms``) and no preferred value of their own."""
    rank = {k: i for i, k in enumerate(PREFERRED)}
    nested = [k for k in keys if "." in k and k.rsplit(".", 1)[1] in rank]
    return sorted(nested, key=lambda k: rank[k.rsplit(".", 1)[1]])


def _table(first: str, rows: list[tuple[str, dict[str, Scalar]]]) -> str:
    keys: list[str] = []
    for _, r in rows:
        keys += [k for k in r if k not in keys]
    chosen = [k for k in PREFERRED if k in keys] or _preferred_nested(keys) or keys
    chosen = chosen[:MAX_COLUMNS]
    lines = [
        "| " + " | ".join([first, *chosen]) + " |",
        "|---|" + "---:|" * len(chosen),
    ]
    for name, r in rows:
        lines.append("| " + " | ".join([f"`{name}`", *(_cell(r.get(k)) for k in chosen)]) + " |")
    return "\n".join(lines)


def _git_last_commit(path: Path) -> str | None:
    """``HASH DATE`` of the newest commit that changed ``path``, or None (no git)."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%h %cs", "--", path.name],
            cwd=path.parent,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def _facts(data: dict[str, Any]) -> dict[str, str]:
    """Date, machine and commit, where the results file records them."""
    env = data.get("environment") if isinstance(data.get("environment"), dict) else {}
    assert isinstance(env, dict)
    facts = {
        "date": data.get("date") or data.get("when") or data.get("generated"),
        "machine": data.get("machine") or env.get("platform"),
        "commit": data.get("commit") or env.get("commit"),
    }
    return {k: str(v) for k, v in facts.items() if v}


def _notes(data: dict[str, Any]) -> list[str]:
    """The file's ``notes``, oldest first, as a folded block (markdown, indented)."""
    notes = data.get("notes") or []
    if not notes:
        return []
    lines = ["", f'??? note "Notes of the runs ({len(notes)}), kept in the results file"', ""]
    for note in notes:
        when = "; ".join(f"{k} {note[k]}" for k in ("date", "commit") if note.get(k)) or "undated"
        text = note["text"].strip().split("\n")
        lines.append(f"    - **{when}:** {text[0]}")
        lines += [f"      {t}" if t else "" for t in text[1:]]
    return lines


def results_section(path: Path, level: str = "###", chart_base: str = "") -> str:
    """One results file: heading, provenance line, table, chart and notes."""
    import json

    data = json.loads(path.read_text())
    facts = _facts(data)
    line = f"From `benchmarks/results/{path.name}`"
    if facts:
        line += ": " + "; ".join(f"{k} {v}" for k, v in facts.items())
    missing = [k for k in ("date", "machine", "commit") if k not in facts]
    if missing:
        line += f"; not recorded in it: {', '.join(missing)}"
        last = _git_last_commit(path)
        if last:
            line += f" (the file was last committed in {last})"
    parts = [f"{level} {path.stem}", "", line + "."]
    table = _rows_of(data)
    if table is None:
        shown = {"date", "when", "generated", "machine", "commit"}
        plain = {k: v for k, v in _scalars(data, depth=0).items() if k not in shown}
        parts += ["", "| value | |", "|---|---:|"]
        parts += [f"| `{k}` | {_cell(v)} |" for k, v in plain.items()]
    else:
        parts += ["", _table(*table)]
    if chart_base and path.with_suffix(".png").exists():
        parts += ["", f"![{path.stem}]({chart_base}{path.stem}.png)"]
    parts += _notes(data)
    return "\n".join(parts) + "\n"


def _results_files() -> list[Path]:
    import json

    return [
        p for p in sorted(RESULTS.glob("*.json")) if isinstance(json.loads(p.read_text()), dict)
    ]


def performance_markdown(skip: frozenset[str] = frozenset(), chart_base: str = "") -> str:
    """One section per results file, except those named in ``skip``."""
    return "\n".join(
        results_section(p, chart_base=chart_base) for p in _results_files() if p.stem not in skip
    )


def _chart_base(page: Any) -> str:
    """The path from ``page`` to the site's ``results/`` directory."""
    src = getattr(getattr(page, "file", None), "src_uri", "performance.md")
    return "../" * src.count("/") + "results/"


def on_files(files: Any, config: Any, **kwargs: object) -> Any:
    """The results' charts on the site, as ``results/NAME.png``."""
    from mkdocs.structure.files import File

    for png in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"results/{png.name}", abs_src_path=str(png)))
    return files


GENERATORS: dict[str, Callable[[], str]] = {
    "environment": environment_markdown,
    "performance": performance_markdown,
    "api": api_markdown,
    "cli": cli_markdown,
    "errors": errors_markdown,
}


def on_page_markdown(markdown: str, page: Any = None, **kwargs: object) -> str:
    chart_base = _chart_base(page)
    named = frozenset(n for g, n in MARKER.findall(markdown) if g == "results")

    def replace(m: re.Match[str]) -> str:
        name, arg = m.group(1), m.group(2)
        if name == "results":
            path = RESULTS / f"{arg}.json"
            if not path.exists():
                raise ValueError(f"<!-- generated: results {arg} -->: no file {path}")
            return results_section(path, level="####", chart_base=chart_base)
        if name == "performance":
            return performance_markdown(skip=named, chart_base=chart_base)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated section {name!r}; known: {sorted(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)
