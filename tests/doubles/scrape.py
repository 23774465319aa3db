"""Scrape a `/metrics` endpoint over real HTTP and read samples with prometheus_client.parser."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

SCRAPE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Scrape:
    """Every sample of one scrape, parsed."""

    samples: list[Sample]

    def values(self, name: str, **labels: str) -> list[float]:
        """Values of the samples called `name` whose labels include `labels`."""
        return [
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float:
        """The sum over the matching samples (0 when none match)."""
        return sum(self.values(name, **labels))


def scrape(address: str) -> Scrape:
    with urllib.request.urlopen(address, timeout=SCRAPE_TIMEOUT_S) as response:
        assert response.status == 200
        text = response.read().decode("utf-8")
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    return Scrape(samples)


def try_scrape(address: str) -> Scrape | None:
    """None while the endpoint is not up yet."""
    try:
        return scrape(address)
    except OSError:
        return None
