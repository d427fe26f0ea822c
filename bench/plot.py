"""latency.svg: p50 / p99 / p99.9 per configuration as grouped bars on a log scale, one
panel per in-flight level, written as plain SVG so the bench needs no plotting library."""

import math
from xml.sax.saxutils import escape

SERIES = [("p50", "p50", "#4e79a7"), ("p99", "p99", "#f28e2b"), ("p999", "p99.9", "#e15759")]


def ticks(lo, hi):
    """1-2-5 ticks (in µs) covering [lo, hi]."""
    out, decade = [], 10 ** math.floor(math.log10(lo))
    while decade <= hi * 10:
        out += [m * decade for m in (1, 2, 5) if lo <= m * decade <= hi]
        decade *= 10
    return out


def nice(v, up):
    """The next 1-2-5 value above (`up`) or below `v`."""
    decade = 10 ** math.floor(math.log10(v))
    steps = [m * decade for m in (1, 2, 5, 10)]
    return min(x for x in steps if x >= v) if up else max(x for x in steps if x <= v)


def label(us):
    return f"{us / 1000:g} ms" if us >= 1000 else f"{us:g} µs"


def svg(panels, title):
    """One chart per panel, `(subtitle, rows)` with rows of id, label, p50, p99 and p999
    (µs), stacked on a shared log scale."""
    width, panel_h = 1000, 360
    left, right, top, bottom = 70, 20, 60, 90
    plot_w, plot_h = width - left - right, panel_h - top - bottom
    height = panel_h * len(panels) + 10
    values = [r[key] for _, rows in panels for r in rows for key, _, _ in SERIES if r[key] > 0]
    lo, hi = nice(min(values) / 2, up=False), nice(max(values) * 1.2, up=True)

    def y(v, y0):
        return y0 + top + plot_h * (1 - (math.log10(max(v, lo)) - math.log10(lo))
                                    / (math.log10(hi) - math.log10(lo)))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>']
    for j, (_, name, colour) in enumerate(SERIES):
        lx = width - right - 210 + j * 70
        parts.append(f'<rect x="{lx}" y="32" width="12" height="12" fill="{colour}"/>')
        parts.append(f'<text x="{lx + 16}" y="42">{name}</text>')
    for p, (subtitle, rows) in enumerate(panels):
        y0 = p * panel_h
        parts.append(f'<text x="{left}" y="{y0 + top - 8}" font-size="11">{escape(subtitle)}: '
                     f'latency, log scale (bar labels in ms)</text>')
        parts += bars(rows, lambda v: y(v, y0), left, y0 + top, plot_w, plot_h, lo, hi)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def bars(rows, y, left, top, plot_w, plot_h, lo, hi):
    """The grid, axes, grouped bars and labels of one panel."""
    parts = []
    for t in ticks(lo, hi):
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
                     f'stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{label(t)}</text>')
    group = plot_w / len(rows)
    bar = group * 0.8 / len(SERIES)
    for i, r in enumerate(rows):
        x0 = left + i * group + group * 0.1
        for j, (key, _, colour) in enumerate(SERIES):
            top_y = y(r[key])
            parts.append(f'<rect x="{x0 + j * bar:.1f}" y="{top_y:.1f}" width="{bar - 2:.1f}" '
                         f'height="{top + plot_h - top_y:.1f}" fill="{colour}">'
                         f'<title>{escape(r["label"])}: {key} {r[key]:.0f} µs</title></rect>')
            parts.append(f'<text x="{x0 + j * bar + (bar - 2) / 2:.1f}" y="{top_y - 3:.1f}" '
                         f'text-anchor="middle" font-size="9">{r[key] / 1000:.1f}</text>')
        cx = left + (i + 0.5) * group
        parts.append(f'<text x="{cx:.1f}" y="{top + plot_h + 18}" text-anchor="middle" '
                     f'font-weight="bold">{escape(r["id"])}</text>')
        words, lines = escape(r["label"]).split(), [""]
        for w in words:
            if len(lines[-1]) + len(w) > 15:
                lines.append("")
            lines[-1] = f"{lines[-1]} {w}".strip()
        for k, text in enumerate(lines[:5]):
            parts.append(f'<text x="{cx:.1f}" y="{top + plot_h + 32 + 12 * k}" '
                         f'text-anchor="middle" font-size="9">{text}</text>')
    parts.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" stroke="#333"/>')
    parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" '
                 f'y2="{top + plot_h}" stroke="#333"/>')
    return parts
