"""README.md's flag and metric tables are generated from the code: they must be current."""

from __future__ import annotations

from pathlib import Path

from exporter import docs

README = Path(__file__).parent.parent / "README.md"


def test_generated_tables_are_current() -> None:
    text = README.read_text()
    assert "<!-- BEGIN GENERATED: metrics -->" in text and "<!-- BEGIN GENERATED: flags -->" in text
    assert docs.render(text) == text, "README.md is stale: run `make readme`"


def test_every_metric_is_documented() -> None:
    text = README.read_text()
    for line in docs.metrics_table().splitlines()[2:]:
        assert line in text


def test_the_process_metrics_served_are_documented() -> None:
    # `serve` adds prometheus_client's ProcessCollector (exporter/cli.py); the README names each series.
    from prometheus_client import CollectorRegistry
    from prometheus_client.process_collector import ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    names = {sample.name for family in registry.collect() for sample in family.samples}
    assert names and all(f"`{name}`" in README.read_text() for name in names), names
