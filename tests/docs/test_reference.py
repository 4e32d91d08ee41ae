"""The docs' operations and reference pages against the code: the runbooks of the commonest
errors are at most two clicks from the docs index and linked from the error reference; every
environment variable ``src/`` reads is on the environment page; every URL form on the URL
page is accepted by the parser the commands use.

No Spark and no servers: parsing, and the generators of ``docs/hooks.py`` called directly.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from sparkonce import errors

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SRC = REPO / "src" / "sparkonce"

# The five errors a user meets most (issue 43), and their runbooks.
COMMONEST = {
    "FencedError": "operations/fenced.md",
    "CheckpointLostError": "operations/checkpoint-lost.md",
    "CheckpointError": "operations/checkpoint-ahead.md",  # the checkpoint ahead of the ledger
    "StoreUnavailableError": "operations/store-unavailable.md",
    "PipelineError": "operations/bad-record.md",  # a bad record fails the batch
}


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def links(markdown: str) -> set[str]:
    """The targets of the page's Markdown links, without anchors."""
    return {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", markdown)}


# -- runbooks --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COMMONEST))
def test_commonest_runbook_is_one_click_from_the_index_and_linked_from_the_reference(
    name: str,
) -> None:
    page = COMMONEST[name]
    assert (DOCS / page).is_file()
    # One click from the docs index, and from the operations index.
    assert page in links((DOCS / "index.md").read_text())
    assert Path(page).name in links((DOCS / "operations" / "index.md").read_text())
    # The generated error reference links the class to it (the reference is linked from
    # the index, so the runbook is two clicks away that way too).
    assert "reference/exit-codes.md" in links((DOCS / "index.md").read_text())
    table = hooks().errors_markdown()
    row = next(r for r in table.splitlines() if r.startswith(f"| `{name}` |"))
    assert f"../{page}" in links(row), row
    # A runbook names the command that shows the pipeline's state.
    assert "sparkonce status" in (DOCS / page).read_text()


def test_every_error_class_links_to_an_existing_runbook() -> None:
    h = hooks()
    table = h.errors_markdown()
    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.SparkOnceError)
    ]
    assert len(classes) > 15
    for cls in classes:
        row = next(r for r in table.splitlines() if r.startswith(f"| `{cls.__name__}` |"))
        [target] = [t for t in links(row) if t.startswith("../")]
        assert (DOCS / "reference" / target).resolve().is_file(), (cls.__name__, target)
    # The operations index lists every runbook.
    listed = links((DOCS / "operations" / "index.md").read_text())
    pages = {p.name for p in (DOCS / "operations").glob("*.md")} - {"index.md"}
    assert pages <= listed, pages - listed


# -- environment variables -------------------------------------------------------------------


def env_vars_in_src() -> set[str]:
    """Read independently of the page's generator: every ``SPARKONCE_*`` string constant, and
    every constant name given to ``os.environ.get`` / ``[...]`` / ``setdefault`` and
    ``os.getenv``."""
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"SPARKONCE_[A-Z0-9_]+", node.value)
            ):
                names.add(node.value)
            arg: ast.expr | None = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                f = node.func
                environ = isinstance(f.value, ast.Attribute) and f.value.attr == "environ"
                if (environ and f.attr in ("get", "setdefault")) or f.attr == "getenv":
                    arg = node.args[0] if node.args else None
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "environ"
            ):
                arg = node.slice
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names.add(arg.value)
    return names


def test_every_env_var_read_in_src_is_on_the_page() -> None:
    names = env_vars_in_src()
    assert {"SPARKONCE_SINK", "SPARKONCE_CRASH_AT", "JAVA_HOME"} <= names  # the scan works
    page = hooks().environment_markdown()
    missing = sorted(n for n in names if f"| `{n}` |" not in page)
    assert not missing, f"read in src/ but not on docs/reference/environment.md: {missing}"
    assert "<!-- generated: environment -->" in (DOCS / "reference" / "environment.md").read_text()


# -- URL forms -------------------------------------------------------------------------------


def url_examples(section: str) -> list[str]:
    """The example column of the table under ``## section`` of docs/reference/urls.md."""
    text = (DOCS / "reference" / "urls.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in body.splitlines() if r.startswith("| `")]
    return [re.findall(r"`([^`]+)`", r.split("|")[2])[0] for r in rows]


def test_every_sink_url_form_on_the_page_is_accepted() -> None:
    from sparkonce.cli.common import _check_sink_url
    from sparkonce.sinks import sink_from_url

    examples = url_examples("Sink URLs")
    assert len(examples) >= 8
    schemes = {u.split(":", 1)[0] for u in examples}
    assert schemes == {
        "sqlite",
        "postgresql",
        "kafka",
        "delta",
        "iceberg+sqlite",
        "iceberg+postgresql",
    }
    for url in examples:
        _check_sink_url(url)  # what --sink accepts
        if url.startswith("iceberg"):
            # Building an Iceberg sink opens its catalog's database (and creates a SQLite
            # one): the page's hosts and paths are examples. Its parts are checked instead.
            from sparkonce.sinks.iceberg_url import parse_iceberg_url

            parsed = parse_iceberg_url(url)
            assert parsed.table == "lake.orders" and parsed.catalog == "lake", url
            continue
        sink_from_url(url, "t")  # what the API builds


def test_every_source_uri_form_on_the_page_is_accepted() -> None:
    from sparkonce.sources import source_from_uri

    examples = url_examples("Source URIs")
    assert len(examples) >= 3
    for uri in examples:
        source_from_uri(uri)


# -- performance page ------------------------------------------------------------------------


def test_performance_page_has_one_table_per_results_file() -> None:
    import json

    assert "<!-- generated: performance -->" in (DOCS / "performance.md").read_text()
    page = hooks().performance_markdown()
    sections = {s.split("\n", 1)[0]: s for s in page.split("### ")[1:]}
    files = sorted((REPO / "benchmarks" / "results").glob("*.json"))
    assert len(files) > 20
    for path in files:
        section = sections[path.stem]
        assert f"From `benchmarks/results/{path.name}`" in section
        assert "\n|---|" in section  # a table
        data = json.loads(path.read_text())
        for fact in ("date", "machine"):
            if data.get(fact):
                assert f"{fact} {data[fact]}" in section, (path.name, fact)
        commit = data.get("commit") or (data.get("environment") or {}).get("commit")
        if commit:
            assert f"commit {commit}" in section, path.name


def _rendered(page: str) -> str:
    """``docs/PAGE`` as the site build renders its generated parts."""
    return str(hooks().on_page_markdown((DOCS / page).read_text(), page=None))


def test_performance_page_shows_every_results_file_once_with_its_chart() -> None:
    rendered = _rendered("performance.md")
    assert "<!-- generated:" not in rendered
    for path in sorted((REPO / "benchmarks" / "results").glob("*.json")):
        provenance = f"From `benchmarks/results/{path.name}`"
        assert rendered.count(provenance) == 1, path.name
        chart = f"results/{path.stem}.png)"
        assert (chart in rendered) == path.with_suffix(".png").exists(), path.name


def test_the_notes_of_a_results_file_appear_under_its_table() -> None:
    import json

    rendered = _rendered("performance.md")
    with_notes = 0
    for path in sorted((REPO / "benchmarks" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not data.get("notes"):
            continue
        with_notes += 1
        start = rendered.index(f"From `benchmarks/results/{path.name}`")
        section = rendered[start : rendered.find("\n#", start)]
        assert f"Notes of the runs ({len(data['notes'])})" in section, path.name
        for note in data["notes"]:
            assert note["text"].strip().split("\n")[0] in section, (path.name, note)
            if note.get("date"):
                assert f"date {note['date']}" in section, (path.name, note)
    assert with_notes >= 10


def test_contributing_shows_the_measured_test_times() -> None:
    rendered = _rendered("contributing.md")
    assert "From `benchmarks/results/test-times.json`" in rendered
    assert "| 70 min 18 s |" in rendered  # the CI run at 413ebfd


def test_a_results_marker_naming_no_file_fails_the_build() -> None:
    with pytest.raises(ValueError, match="no-such-results"):
        hooks().on_page_markdown("<!-- generated: results no-such-results -->\n", page=None)


def test_a_table_of_one_dict_per_variant_shows_their_preferred_columns() -> None:
    """benchmarks/connect.py's summary is ``{sink: {variant: {...}}}``: the table shows each
    variant's time per batch and Connect's ratio and extra time, not the first ten keys."""
    first, rows = hooks()._rows_of(
        {
            "summary": {
                "sqlite": {
                    "classic": {"runs": 2, "batches": 10, "median_s": 9.0, "per_batch_ms": 900.0},
                    "connect": {
                        "runs": 2,
                        "batches": 10,
                        "median_s": 23.0,
                        "per_batch_ms": 2300.0,
                        "ratio": 2.556,
                        "extra_per_batch_ms": 1400.0,
                    },
                }
            }
        }
    )
    header = hooks()._table(first, rows).splitlines()[0]
    assert header == (
        "| variant | connect.ratio | classic.median_s | connect.median_s | classic.per_batch_ms"
        " | connect.per_batch_ms | connect.extra_per_batch_ms |"
    )
