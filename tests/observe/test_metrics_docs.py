"""The metrics table and example scrape (docs/guides/ui-and-metrics.md) match what
MetricsObserver exposes."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sparkonce.observe.metrics import MetricsObserver

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "ui-and-metrics.md"


def exposition() -> str:
    observer = MetricsObserver("sums")
    observer.on_lag({("events", 0): 0})  # the lag series appear once lag was read
    return observer.exposition()


def exposed() -> dict[str, str]:
    """Each metric as the docs page names it (a counter with ``_total``) -> its type; not the
    ``*_created`` series, which ``sparkonce run`` turns off."""
    families = {}
    for family in text_string_to_metric_families(exposition()):
        if family.name.endswith("_created"):
            continue
        name = f"{family.name}_total" if family.type == "counter" else family.name
        families[name] = family.type
    return families


def test_the_metrics_table_lists_every_metric_with_its_type() -> None:
    rows = re.findall(r"^\| `(sparkonce_\w+)` \| (\w+) \|", PAGE.read_text(), re.M)
    assert len(rows) == len(dict(rows))
    assert dict(rows) == exposed()


def test_the_example_scrape_shows_every_metric_and_only_real_series() -> None:
    text = PAGE.read_text()
    block = text.split("```text\nsparkonce_batches_committed_total", 1)[1].split("```", 1)[0]
    names = {"sparkonce_batches_committed_total"} | {
        line.split("{", 1)[0] for line in block.splitlines()[1:] if line.strip()
    }
    samples = {
        s.name
        for family in text_string_to_metric_families(exposition())
        for s in family.samples
        if not s.name.endswith("_created")
    }
    assert names == samples
