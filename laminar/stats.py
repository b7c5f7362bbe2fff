"""Histograms cheap enough for hot paths: a bisect and two additions per observation.

prometheus_client's own Histogram takes a lock and walks its buckets on every observation;
these only count, and ``laminar.node.metrics`` turns them into Prometheus histograms when
``/metrics`` is scraped. One writer per instance (the event loop, or the one flush thread);
readers may see a count one observation ahead of the sum, which a scrape tolerates.
"""

from __future__ import annotations

from bisect import bisect_left

LATENCY_BOUNDS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Seconds, 100 µs to 10 s: fdatasync, group commit, requests, probes."""

COUNT_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Sizes such as logs per group commit."""


class Buckets:
    """Observations counted per upper bound (le), plus their sum; the last slot is +Inf."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BOUNDS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, observations <= le) pairs, +Inf last, as Prometheus exposes them."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out
