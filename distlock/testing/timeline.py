"""A picture of a ``History``: one self-contained HTML file (an inline SVG, no script, nothing
fetched) with a row per process, thread or task, its beliefs as bars coloured by name, its
fenced writes as ticks, and every fault's window shaded across all rows, as Jepsen's timelines
draw an operation history. Beliefs that overlap another on the same name are outlined in red,
and every bar and tick says what it is when the pointer rests on it.

``python -m distlock.testing.nemesis --timeline DIR`` writes one per phase; ``write_timeline``
draws any history.
"""

from __future__ import annotations

import html
import math
import os
from typing import Dict, Iterable, List, Optional, Set, Tuple, Union

from .history import Fault, History, Hold, Record, Write, check_history

__all__ = ["timeline_html", "write_timeline"]

#: Colours of the names, in order of first appearance (the eighth name takes the first again).
PALETTE = ("#4e79a7", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#bab0ac",
           "#f28e2b")
WIDTH = 1100  # of the time axis, in pixels
LEFT = 170  # the row labels' column
ROW = 22
TOP = 40


def _x(t: float, t0: float, span: float) -> float:
    if not math.isfinite(t):
        t = t0 + span  # an open end drawn to the right edge
    return LEFT + (t - t0) / span * WIDTH


def _ticks(span: float) -> float:
    """A round step for the time axis: about ten labels along it."""
    step = 0.001
    while span / step > 12:
        for factor in (2, 2.5, 2):
            step *= factor
            if span / step <= 12:
                break
    return step


def timeline_html(history: Union[History, Iterable[Record]], title: str = "distlock history") -> str:
    """The picture of ``history`` (a ``History`` or its records), as the text of an HTML file."""
    records = history.records() if isinstance(history, History) else list(history)
    holds = [r for r in records if isinstance(r, Hold)]
    writes = [r for r in records if isinstance(r, Write)]
    faults = [r for r in records if isinstance(r, Fault)]
    report = check_history(records)
    times = [t for h in holds for t in (h.start, h.end) if t is not None]
    times += [w.at for w in writes] + [t for f in faults for t in (f.start, f.end)]
    times = [t for t in times if math.isfinite(t)]  # records made by hand may have none
    t0, t1 = (min(times), max(times)) if times else (0.0, 1.0)
    span = max(t1 - t0, 1e-3)
    rows = sorted({h.who for h in holds} | {w.who for w in writes})
    row_of = {who: i for i, who in enumerate(rows)}
    colours: Dict[str, str] = {}
    for hold in sorted(holds, key=lambda h: h.start):
        colours.setdefault(hold.name, PALETTE[len(colours) % len(PALETTE)])
    overlapping: Set[Tuple[str, str, float]] = {
        (h.who, h.name, h.start) for pair in report.overlaps for h in pair}
    height = TOP + ROW * max(1, len(rows)) + 30
    esc = html.escape
    out: List[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 20}" height="{height}" '
        f'font-family="sans-serif" font-size="11">']
    for fault in faults:  # under everything else
        x0, x1 = _x(fault.start, t0, span), _x(fault.end, t0, span)
        out.append(f'<rect class="fault" x="{x0:.1f}" y="{TOP - 14}" width="{max(x1 - x0, 1.0):.1f}" '
                   f'height="{height - TOP - 16}" fill="#f4a582" fill-opacity="0.35">'
                   f'<title>{esc(fault.kind)} {esc(fault.detail)}: {fault.start - t0:.3f}'
                   f'-{fault.end - t0:.3f} s</title></rect>')
        out.append(f'<text x="{x0 + 2:.1f}" y="{TOP - 18}" fill="#b2182b">{esc(fault.kind)}</text>')
    step = _ticks(span)
    tick = 0.0
    while tick <= span + 1e-9:
        x = _x(t0 + tick, t0, span)
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 4}" x2="{x:.1f}" y2="{height - 28}" '
                   f'stroke="#ddd"/><text x="{x:.1f}" y="{height - 14}" text-anchor="middle">'
                   f'{tick:g} s</text>')
        tick += step
    for who, i in row_of.items():
        y = TOP + i * ROW
        out.append(f'<text x="4" y="{y + 14}">{esc(who)}</text>')
    for hold in holds:
        y = TOP + row_of[hold.who] * ROW + 3
        end = t1 if hold.end is None else hold.end
        x0, x1 = _x(hold.start, t0, span), _x(end, t0, span)
        bad = (hold.who, hold.name, hold.start) in overlapping
        stroke = ' stroke="#d7191c" stroke-width="2"' if bad else ""
        out.append(f'<rect class="{"hold overlap" if bad else "hold"}" x="{x0:.1f}" y="{y}" '
                   f'width="{max(x1 - x0, 1.0):.1f}" height="{ROW - 8}" fill="{colours[hold.name]}"'
                   f'{stroke}><title>{esc(hold.name)} token {hold.token}: '
                   f'{hold.start - t0:.3f}-{end - t0:.3f} s ({esc(hold.cause)})</title></rect>')
    for write in writes:
        y = TOP + row_of[write.who] * ROW
        x = _x(write.at, t0, span)
        colour = "#222" if write.accepted else "#d7191c"
        out.append(f'<line class="write" x1="{x:.1f}" y1="{y + 1}" x2="{x:.1f}" y2="{y + ROW - 3}" '
                   f'stroke="{colour}"><title>write {esc(write.name)} token {write.token} '
                   f'{"taken" if write.accepted else "refused"} at {write.at - t0:.3f} s'
                   f'</title></line>')
    out.append("</svg>")
    legend = " ".join(f'<span style="background:{c};color:#fff;padding:0 6px">{esc(n)}</span>'
                      for n, c in colours.items())
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title></head><body>", f"<h1>{esc(title)}</h1>",
        f"<p>{esc(str(report))}</p>",
        f"<p>names: {legend}; bars: beliefs (red outline: overlaps another on its name); "
        "ticks: fenced writes (red: refused); shaded: faults, from the fault to its healing."
        "</p>", *out, "</body></html>", ""])


def write_timeline(history: Union[History, Iterable[Record]],
                   path: Union[str, os.PathLike[str]], title: Optional[str] = None) -> str:
    """Write ``timeline_html(history)`` to ``path``; return the path."""
    target = os.fspath(path)
    with open(target, "w", encoding="utf-8") as fh:
        fh.write(timeline_html(history, title or os.path.basename(target)))
    return target
