"""Charts drawn on the server as inline SVG: the console works offline and loads no chart library, and a
chart of a day of 10-minute digests is a few kilobytes of markup."""

from __future__ import annotations

import html
import math
import time

# one colour per series, distinguishable in print and for the common colour-vision deficiencies (Okabe-Ito)
PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000")

Series = tuple[str, list[tuple[float, float]]]  # (label, [(unix time, value)])


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _nice(value: float) -> float:
    """The smallest round scale (4 grid steps of 1, 2, 2.5, 3, 5, 6 or 8 × 10^k) at or above ``value``."""
    if value <= 0:
        return 1.0
    step = 10 ** math.floor(math.log10(value / 4))
    for m in (1, 2, 2.5, 3, 5, 6, 8, 10):
        if m * step * 4 >= value:
            return float(m * step * 4)
    return float(40 * step)


def line_chart(
    title: str, series: list[Series], unit: str, y_max: float | None = None, width: int = 720, height: int = 200
) -> str:
    """Lines over time with a legend; ``y_max`` fixes the scale (100 for utilisation)."""
    points = [p for _, pts in series for p in pts]
    if not points:
        return f'<p class="empty">{_esc(title)}: no history yet (one point per 10 minutes of telemetry).</p>'
    left, right, top, bottom = 48, 12, 10, 28
    plot_w, plot_h = width - left - right, height - top - bottom
    t0 = min(t for t, _ in points)
    t1 = max(*(t for t, _ in points), t0 + 600)
    top_value = y_max if y_max is not None else _nice(max(v for _, v in points) * 1.05)

    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * plot_w

    def y(v: float) -> float:
        return top + plot_h - min(max(v, 0.0), top_value) / top_value * plot_h

    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{_esc(title)}"><title>{_esc(title)}</title>'
    ]
    for i in range(5):
        v = top_value * i / 4
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end" font-size="11">'
            f"{v:,.{0 if v == int(v) else 1}f}{_esc(unit)}</text>"
        )
    for i in range(5):
        t = t0 + (t1 - t0) * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        label = time.strftime("%H:%M", time.gmtime(t)) + (" UTC" if i == 4 else "")
        parts.append(
            f'<text x="{x(t):.1f}" y="{height - 8}" text-anchor="{anchor}" font-size="11">{_esc(label)}</text>'
        )
    for n, (label, pts) in enumerate(series):
        colour = PALETTE[n % len(PALETTE)]
        coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in sorted(pts))
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}">'
            f"<title>{_esc(label)}</title></polyline>"
        )
    parts.append("</svg>")
    legend = "".join(
        f'<li><svg width="12" height="12" aria-hidden="true"><rect width="12" height="12" '
        f'fill="{PALETTE[n % len(PALETTE)]}"/></svg> {_esc(label)}</li>'
        for n, (label, _) in enumerate(series)
    )
    return "".join(parts) + f'<ul class="legend">{legend}</ul>'


def bar_chart(title: str, rows: list[tuple[str, float]], fmt: str = "${:,.2f}", width: int = 560) -> str:
    """Horizontal bars, biggest first, each labelled with its value."""
    if not rows:
        return f'<p class="empty">{_esc(title)}: nothing to show.</p>'
    rows = sorted(rows, key=lambda r: -r[1])
    bar_h, label_w, value_w = 20, 220, 90
    height = bar_h * len(rows) + 4
    top = max(*(v for _, v in rows), 1e-09)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{_esc(title)}"><title>{_esc(title)}</title>'
    ]
    for i, (label, value) in enumerate(rows):
        y = i * bar_h + 2
        w = max(value, 0.0) / top * (width - label_w - value_w)
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end" font-size="12">{_esc(label[:34])}</text>'
            f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{bar_h - 6}" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{label_w + w + 4:.1f}" y="{y + 14}" font-size="12">{_esc(fmt.format(value))}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
