"""Zero samples for every known label set, so a fresh worker or pool is scraped complete.

A labelled counter has no series until its first event: on a fresh pool
`cosyq_worker_recycles_total{reason="rss"}` does not exist, an alert on
`increase(...) > 0` has nothing to compare, and `rate()` over the first event sees no earlier
sample. Where the label values are known up front (outcomes, recycle reasons, stages, the
queues a process takes) the scrape adds each missing series at zero. Filled at collect time,
so one rule serves a lone worker's registry and a pool's summed files alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from shared import keys
from workers.service.recycling import RecycleReason


@dataclass(frozen=True)
class KnownLabels:
    """One family's type, help, label names and every value each label takes."""

    name: str
    kind: str  # "counter" or "histogram"
    documentation: str
    labels: tuple[tuple[str, tuple[str, ...]], ...]
    buckets: tuple[float, ...] = ()

    def label_sets(self) -> Iterator[dict[str, str]]:
        names = [name for name, _ in self.labels]
        for values in itertools.product(*(values for _, values in self.labels)):
            yield dict(zip(names, values, strict=True))

    def zero_samples(self, labels: dict[str, str]) -> list[Sample]:
        if self.kind == "counter":
            return [Sample(f"{self.name}_total", labels, 0.0)]
        bounds = [*(floatToGoString(b) for b in self.buckets), "+Inf"]
        buckets = [Sample(f"{self.name}_bucket", {**labels, "le": le}, 0.0) for le in bounds]
        return [
            *buckets,
            Sample(f"{self.name}_count", labels, 0.0),
            Sample(f"{self.name}_sum", labels, 0.0),
        ]


def known_labels(
    queue_names: Sequence[str],
    outcomes: Sequence[str],
    stages: Sequence[str],
    stage_buckets: Sequence[float],
) -> list[KnownLabels]:
    """The families whose label values are known before any event."""
    queues = tuple(dict.fromkeys([*keys.QUEUES_IN_PRIORITY_ORDER, *queue_names]))
    return [
        KnownLabels(
            "cosyq_jobs",
            "counter",
            "Job attempts by outcome",
            (("queue", queues), ("outcome", tuple(outcomes))),
        ),
        KnownLabels(
            "cosyq_worker_recycles",
            "counter",
            "Workers that retired, by reason",
            (("reason", tuple(reason.value for reason in RecycleReason)),),
        ),
        KnownLabels(
            "cosyq_stage_seconds",
            "histogram",
            "Time per stage of a finished job",
            (("stage", tuple(stages)),),
            tuple(stage_buckets),
        ),
    ]


def with_zeros(families: Iterable[Metric], known: Sequence[KnownLabels]) -> Iterator[Metric]:
    """`families`, each known one with a zero series for every label set it lacks (and the
    family itself where no process has written it yet)."""
    wanted = {family.name: family for family in known}
    seen: set[str] = set()
    for family in families:
        spec = wanted.get(family.name)
        if spec is not None:
            seen.add(family.name)
            _fill(family, spec)
        yield family
    for name, spec in wanted.items():
        if name not in seen:
            family = Metric(name, spec.documentation, spec.kind)
            _fill(family, spec)
            yield family


def _fill(family: Metric, spec: KnownLabels) -> None:
    names = [name for name, _ in spec.labels]
    present = {tuple(s.labels.get(name) for name in names) for s in family.samples}
    for labels in spec.label_sets():
        if tuple(labels[name] for name in names) not in present:
            family.samples.extend(spec.zero_samples(labels))
