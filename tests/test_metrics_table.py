"""The metrics table (`gateway.metrics.METRICS`) and the `Metrics` attributes it fills agree: each row's
attribute is annotated on the class with the row's kind, and no annotated metric lacks a row."""

from __future__ import annotations

import typing

from prometheus_client import Counter, Gauge, Histogram

from gateway.metrics import METRICS, Metrics

KINDS = (Counter, Gauge, Histogram)


def test_every_row_is_an_annotated_attribute_of_its_kind() -> None:
    hints = typing.get_type_hints(Metrics)
    annotated = {name: kind for name, kind in hints.items() if kind in KINDS}
    assert {spec.attribute: spec.kind for spec in METRICS} == annotated


def test_rows_name_distinct_attributes_and_metrics() -> None:
    assert len({spec.attribute for spec in METRICS}) == len(METRICS)
    assert len({spec.name for spec in METRICS}) == len(METRICS)


def test_each_attribute_carries_the_metric_its_row_declares() -> None:
    metrics = Metrics()
    for spec in METRICS:
        metric = getattr(metrics, spec.attribute)
        assert isinstance(metric, spec.kind)
        if spec.labels:
            metric = metric.labels(*spec.labels)
        if spec.kind is Histogram:
            metric.observe(1)
        else:
            metric.inc()
    exposition = metrics.render().decode()
    for spec in METRICS:
        suffix = {Counter: "_total", Gauge: "", Histogram: "_count"}[spec.kind]
        labels = ",".join(f'{label}="{label}"' for label in spec.labels)
        sample = f"{spec.name}{suffix}{{{labels}}}" if labels else f"{spec.name}{suffix}"
        assert f"{sample} 1.0" in exposition
