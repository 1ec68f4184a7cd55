"""OpenTelemetry traces, only where the application already uses OpenTelemetry.

distlock never imports ``opentelemetry``: it looks for ``opentelemetry.trace`` among the
modules the process has already imported (one dictionary lookup). An application that traces
has imported it when it set its tracer provider up; without it installed, nothing is paid.
(redis-py 8 imports it itself when it is installed: waits then start spans on the global
tracer, which does nothing until the application sets a provider; only waits and lost leases
are traced, never the uncontended path.) With it:

- an acquire or wait that had to wait is a span ``distlock.wait``, with the attributes
  ``distlock.kind``, ``distlock.group`` (the name group, never the raw name unless the
  grouping rule returns it), ``distlock.outcome`` (``acquired``, ``timeout``, ``error``),
  ``distlock.token`` (the fencing token of a grant) and ``distlock.waited_s``;
- a lost lease is a span ``distlock.lease_lost`` carrying an event ``lease lost`` with
  ``distlock.kind``, ``distlock.group``, ``distlock.token`` and ``distlock.cause``.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

__all__ = ["start_wait", "end_wait", "lease_lost", "PROVIDER"]

#: A tracer provider to use instead of OpenTelemetry's global one (tests; None: the global).
PROVIDER: Any = None


def _tracer() -> Any:
    if PROVIDER is not None:
        return PROVIDER.get_tracer("distlock")
    return sys.modules["opentelemetry.trace"].get_tracer("distlock")


def start_wait(meter: Any) -> Any:
    """A started ``distlock.wait`` span, or None when the process does not trace."""
    if meter is None or "opentelemetry.trace" not in sys.modules:
        return None
    tracer = _tracer()
    return tracer.start_span("distlock.wait", attributes={
        "distlock.kind": meter.kind, "distlock.group": meter.series.group})


def end_wait(span: Any, outcome: str, waited_s: float, token: Optional[int]) -> None:
    if span is None:
        return
    span.set_attribute("distlock.outcome", outcome)
    span.set_attribute("distlock.waited_s", waited_s)
    if token is not None:
        span.set_attribute("distlock.token", token)
    span.end()


def lease_lost(meter: Any, token: Optional[int], cause: str) -> None:
    if "opentelemetry.trace" not in sys.modules:
        return
    attributes = {"distlock.cause": cause}
    if meter is not None:
        attributes.update({"distlock.kind": meter.kind, "distlock.group": meter.series.group})
    if token is not None:
        attributes["distlock.token"] = token  # type: ignore[assignment]
    span = _tracer().start_span("distlock.lease_lost", attributes=attributes)
    span.add_event("lease lost", attributes)
    span.end()
