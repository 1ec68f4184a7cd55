"""A Prometheus collector for distlock's in-process metrics (the ``prometheus`` extra).

Register it once per process::

    from prometheus_client import REGISTRY
    from distlock.prometheus import DistlockCollector

    REGISTRY.register(DistlockCollector())

It reads ``distlock.metrics()`` at every scrape and exposes, labelled by ``kind`` and
``group`` (the name group; see docs/guides/operating.rst):

- ``distlock_acquire_total{kind,group,outcome}``: acquires and waits by outcome
  (``acquired``, ``timeout``, ``refused``, ``error``);
- ``distlock_waited_total``: those that had to wait; ``distlock_handoffs_total``: grants won
  by a try that answered a pub/sub hint;
- ``distlock_wait_seconds``, ``distlock_hold_seconds``, ``distlock_renew_seconds``:
  histograms (from the first try to the grant or the give-up; from a grant to its end; the
  watchdog's batched renewal round trip);
- ``distlock_lost_total``, ``distlock_renewals_total``, ``distlock_renew_failures_total``;
- ``distlock_oldest_hold_seconds``: a gauge, the age of the oldest hold this process has now
  (only for a kind and group with a live hold).

Recording costs the same whether or not a collector is registered; scraping costs a copy of
the figures.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ._session.live import metrics

__all__ = ["DistlockCollector"]

_LABELS = ["kind", "group"]


def _buckets(data: Dict[str, Any]) -> List[Tuple[str, float]]:
    """Cumulative (le, count) pairs, as Prometheus wants them, from per-bucket counts."""
    out: List[Tuple[str, float]] = []
    total = 0
    for bound, count in zip(data["buckets"], data["counts"]):
        total += count
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(total)))
    return out


class DistlockCollector(Collector):
    """Exposes ``distlock.metrics()`` to prometheus_client at every scrape."""

    def collect(self) -> Iterator[Any]:
        figures = metrics()
        series = figures["series"]
        acquire = CounterMetricFamily("distlock_acquire", "Acquires and waits, by outcome",
                                      labels=_LABELS + ["outcome"])
        counters = {
            "waited": CounterMetricFamily("distlock_waited", "Acquires and waits that had to wait",
                                          labels=_LABELS),
            "hinted": CounterMetricFamily("distlock_handoffs",
                                          "Grants won by a try that answered a pub/sub hint",
                                          labels=_LABELS),
            "lost": CounterMetricFamily("distlock_lost", "Leases found lost", labels=_LABELS),
            "renewals": CounterMetricFamily("distlock_renewals", "Watchdog renewals",
                                            labels=_LABELS),
            "renew_failures": CounterMetricFamily("distlock_renew_failures",
                                                  "Watchdog renewals that failed", labels=_LABELS),
        }
        histograms = {
            "wait_seconds": HistogramMetricFamily(
                "distlock_wait_seconds", "From the first try to the grant or the give-up",
                labels=_LABELS),
            "hold_seconds": HistogramMetricFamily(
                "distlock_hold_seconds", "From a grant to its end", labels=_LABELS),
            "renew_seconds": HistogramMetricFamily(
                "distlock_renew_seconds", "The watchdog's batched renewal round trip",
                labels=_LABELS),
        }
        for data in series:
            labels = [data["kind"], data["group"]]
            for outcome, count in data["acquire"].items():
                acquire.add_metric(labels + [outcome], float(count))
            for field, family in counters.items():
                family.add_metric(labels, float(data[field]))
            for field, hist in histograms.items():
                h = data[field]
                hist.add_metric(labels, _buckets(h), float(h["sum"]))
        oldest = GaugeMetricFamily("distlock_oldest_hold_seconds",
                                   "Age of the oldest hold this process has now", labels=_LABELS)
        ages: Dict[Tuple[str, str], float] = {}
        for hold in figures["holds"]:  # oldest first: the first of each (kind, group) is its oldest
            ages.setdefault((hold["kind"], hold["group"]), hold["age"])
        for (kind, group), age in ages.items():
            oldest.add_metric([kind, group], age)
        yield acquire
        yield from counters.values()
        yield from histograms.values()
        yield oldest
