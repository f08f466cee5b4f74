"""README.md's flag and metric tables are generated from the code: they must be current."""

from __future__ import annotations

from pathlib import Path

from gpunode_exporter import docs

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
    # `serve` adds the exporter's own process metrics (exporter/process.py), named as prometheus_client
    # (and every client library) names them; the README names each series.
    from prometheus_client import CollectorRegistry
    from prometheus_client.process_collector import ProcessCollector

    from gpunode_exporter import process

    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    theirs = {sample.name for family in registry.collect() for sample in family.samples}
    ours = {family.spec.name for family in process.collect()}
    assert ours == theirs == {spec.name for spec in process.PROCESS_METRICS}
    assert all(f"`{name}`" in README.read_text() for name in ours), ours
